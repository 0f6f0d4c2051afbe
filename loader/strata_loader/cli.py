"""`strata-loader`: fetch (the preloader Jobs run it), serve-peer, verify, shard, bench, pack.

Failures end with one line on stderr and a non-zero exit, never a traceback: Job logs and termination messages
are read by people and by the operator.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .contract import (
    DEFAULT_TERMINATION_MESSAGE_PATH,
    ENV_TERMINATION_MESSAGE_PATH,
    FetchRequest,
    FetchResult,
    parse_bytes,
)
from .peer_limits import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
    DEFAULT_MAX_TRANSFERS,
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        print(f"strata-loader {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # the one place that turns any failure into one clear line
        print(f"strata-loader {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 1


def _one_line(e: BaseException) -> str:
    from pydantic import ValidationError

    if isinstance(e, ValidationError):  # the field and the rule, without pydantic's boilerplate
        return "; ".join(
            f"{'.'.join(str(x) for x in err['loc']) or 'request'}: {err['msg'].removeprefix('Value error, ')}"
            for err in e.errors()
        )
    text = str(e) or type(e).__name__
    if isinstance(e, OSError) and e.filename and str(e.filename) not in text:
        text = f"{e.filename}: {text}"
    return " ".join(text.split())


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata-loader", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    f = sub.add_parser("fetch", help="copy a model to a directory; the manifest marks it complete")
    FetchRequest.add_arguments(f)
    f.add_argument(
        "--progress",
        choices=["bar", "json", "none"],
        default=None,
        help="default: a bar on a terminal, JSON lines otherwise",
    )
    f.set_defaults(handler=_fetch)

    v = sub.add_parser(
        "verify",
        help="check a fetched directory against its manifest (sizes, recorded checksums)"
        " and validate safetensors headers and data bounds (files or directories)",
    )
    v.add_argument("paths", nargs="+")
    v.add_argument(
        "--fast",
        action="store_true",
        help="check sizes only: do not hash the files whose checksums the manifest recorded",
    )
    v.set_defaults(handler=_verify)

    s = sub.add_parser("shard", help="pre-shard a model for tensor-parallel ranks")
    s.add_argument("src", help="directory with *.safetensors")
    s.add_argument("--tp", type=int, required=True, help="tensor-parallel size")
    s.add_argument("--out", default=None, help="output directory (default: SRC/sharded)")
    s.add_argument("--max-part-bytes", default="5Gi")
    s.set_defaults(handler=_shard)

    sp = sub.add_parser(
        "serve-peer",
        help="serve a verified copy's files (range GETs, bearer token) to other nodes' fetches",
    )
    sp.add_argument("dir", help="a directory fetch completed (its manifest lists what is served)")
    sp.add_argument("--token-file", required=True, help="file holding the bearer token fetchers must send")
    sp.add_argument("--host", default="127.0.0.1", help="address to listen on (in a pod: its pod IP)")
    sp.add_argument("--port", type=int, default=None, help="default 8477; 0 picks a free port")
    sp.add_argument(
        "--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS, help="connections served at once, a thread each"
    )
    sp.add_argument(
        "--max-connections-per-client",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
        help="of those, from one client address",
    )
    sp.add_argument(
        "--max-transfers", type=int, default=DEFAULT_MAX_TRANSFERS, help="file ranges sent at once (token holders)"
    )
    sp.add_argument(
        "--header-timeout",
        type=float,
        default=DEFAULT_HEADER_TIMEOUT_S,
        help="seconds a whole request head may take to arrive (also closes idle kept-alive connections)",
    )
    sp.set_defaults(handler=_serve_peer)

    b = sub.add_parser(
        "bench", help="load files with the streamer and with safetensors; print throughput (needs torch)"
    )
    b.add_argument("paths", nargs="+")
    b.add_argument("--concurrency", type=int, default=None)
    b.set_defaults(handler=_bench)

    from .pack.cli import add_pack_parser

    add_pack_parser(sub)
    return p


def _fetch(args: argparse.Namespace) -> int:
    from .capacity import EXIT_INSUFFICIENT_STORAGE, CapacityRequest
    from .eviction import InsufficientStorage
    from .fetch import fetch

    req: FetchRequest | None = None
    try:
        req = FetchRequest.from_namespace(args)
        result = fetch(req, progress_mode=args.progress, capacity=CapacityRequest.from_env(os.environ))
    except Exception as e:
        failed = FetchResult(
            status="Failed",
            error=_one_line(e),
            source=getattr(req, "source", args.source),
            reason=getattr(e, "reason", None),
            capacity=getattr(e, "capacity", None),
        )
        write_termination_message(failed)
        if isinstance(e, InsufficientStorage):
            print(f"strata-loader fetch: error: {_one_line(e)}", file=sys.stderr)
            return EXIT_INSUFFICIENT_STORAGE
        raise
    write_termination_message(result)
    print(json.dumps({"event": "done", **json.loads(result.to_termination_message())}), flush=True)
    return 0


def write_termination_message(result: FetchResult) -> None:
    """To STRATA_TERMINATION_MESSAGE_PATH, or /dev/termination-log when it exists (i.e. inside a pod)."""
    path = os.environ.get(ENV_TERMINATION_MESSAGE_PATH)
    if path is None:
        if not os.path.exists(DEFAULT_TERMINATION_MESSAGE_PATH):
            return
        path = DEFAULT_TERMINATION_MESSAGE_PATH
    with open(path, "w") as f:
        f.write(result.to_termination_message())


class CopyDamaged(RuntimeError):
    """A fetched directory no longer holds what its manifest recorded."""


def _verify(args: argparse.Namespace) -> int:
    from .manifest import damage, load_manifest
    from .paths import DestDir
    from .sources import LocalReader, read_header

    checked = matched = 0
    for raw in args.paths:
        p = Path(raw)
        targets = [p]
        if p.is_dir():
            m = load_manifest(p)
            with DestDir(p) as tree:
                bad = [(f.path, what) for f in m.files if (what := damage(tree, f, checksums=not args.fast))]
            if bad:
                path, what = bad[0]
                more = f" (and {len(bad) - 1} more file(s) differ)" if len(bad) > 1 else ""
                raise CopyDamaged(
                    f"{p / path}: {what}{more}; re-run fetch to repair the copy"
                    " (with --verify checksums when only the content differs)"
                )
            matched += len(m.files)
            targets = sorted(p.rglob("*.safetensors"))
        for t in targets:
            with LocalReader(t) as r:
                read_header(r)
            checked += 1
    what = "sizes" if args.fast else "sizes and recorded checksums"
    print(f"ok: {matched} file(s) match their manifest ({what}); {checked} safetensors file(s) valid")
    return 0


def _serve_peer(args: argparse.Namespace) -> int:
    from .contract import PEER_PORT
    from .peer_limits import PeerLimits
    from .peer_server import serve

    port = PEER_PORT if args.port is None else args.port
    limits = PeerLimits(
        max_connections=args.max_connections,
        max_connections_per_client=args.max_connections_per_client,
        max_transfers=args.max_transfers,
        header_timeout_s=args.header_timeout,
    )
    serve(Path(args.dir), args.token_file, args.host, port, limits)
    return 0


def _shard(args: argparse.Namespace) -> int:
    from .shard import shard_directory

    src = Path(args.src)
    out = Path(args.out) if args.out else src / "sharded"
    files = shard_directory(src, out, args.tp, parse_bytes(args.max_part_bytes))
    print(json.dumps({"event": "sharded", "tp": args.tp, "files": [str(f) for f in files]}))
    return 0


def _bench(args: argparse.Namespace) -> int:
    import time

    try:
        import safetensors.torch

        from .api import load_files
    except ModuleNotFoundError as e:
        if e.name is None or e.name.partition(".")[0] not in {"torch", "safetensors"}:
            raise
        raise RuntimeError(
            f"needs torch and safetensors ({e.name} is not installed): pip install 'strata[tensor]'"
        ) from None
    from .concurrency import concurrency_for

    total = sum(os.path.getsize(p) for p in args.paths)
    conc = concurrency_for(args.paths, args.concurrency)
    rows = []
    for name, fn in (
        ("strata_loader.load_files", lambda: load_files(args.paths, concurrency=conc)),
        (
            "safetensors load_file+clone",
            lambda: {k: v.clone() for p in args.paths for k, v in safetensors.torch.load_file(p).items()},
        ),
    ):
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        del out
        rows.append({"reader": name, "seconds": round(dt, 3), "GBps": round(total / dt / 1e9, 3)})
    for r in rows:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
