"""`strata-loader`: fetch (the preloader Jobs run it), serve-peer, verify, shard, bench, pack, compile.

Each subcommand lives with its product (`fetch/command.py`, `tensor/command.py`, `peer/command.py`) and is listed
once in `SUBCOMMANDS` below: a new one is a function `add_<name>(subparsers)` there and one line here. A
subcommand's module imports its product lazily, inside the handler, so `fetch` and `verify` start without torch.

Failures end with one line on stderr and a non-zero exit, never a traceback: Job logs and termination messages
are read by people and by the operator.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from .compilecache import command as compile_command
from .core import settings
from .core.messages import one_line
from .fetch import command as fetch_command
from .pack import command as pack_command
from .peer import command as peer_command
from .tensor import command as tensor_command

SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    fetch_command.add_fetch,  # copy a model into a directory (the preloader Jobs)
    fetch_command.add_verify,  # check a fetched copy against its manifest
    tensor_command.add_shard,  # pre-shard a model for tensor-parallel ranks
    peer_command.add_serve_peer,  # serve a verified copy to other nodes' fetches
    tensor_command.add_bench,  # the streamer against safetensors
    pack_command.add_pack,  # a model directory as an OCI image, pushed to a registry
    compile_command.add_compile,  # the engine's compile cache: its key, restore before start, capture after
)
"""Every subcommand, in the order `--help` lists them; each adds its parser and sets `handler`."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        settings.configure(settings.LoaderSettings.from_env())  # read once, at start
    except settings.SettingError as e:
        print(f"strata-loader {args.command}: error: {e}", file=sys.stderr)
        return 2
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        print(f"strata-loader {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # the one place that turns any failure into one clear line
        print(f"strata-loader {args.command}: error: {one_line(e)}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata-loader", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return p


if __name__ == "__main__":
    sys.exit(main())
