"""The fetch product's subcommands: `fetch` (what the preloader Jobs run) and `verify` (a copy against its manifest).

Registered in `strata_loader.cli.SUBCOMMANDS`. `fetch` writes its `FetchResult` as the pod's termination message,
which is how the operator reads what happened on the node.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..contract import FetchRequest, FetchResult
from ..core import messages
from ..core.messages import one_line


def add_fetch(sub: argparse._SubParsersAction) -> None:
    f = sub.add_parser("fetch", help="copy a model to a directory; the manifest marks it complete")
    FetchRequest.add_arguments(f)
    f.add_argument(
        "--progress",
        choices=["bar", "json", "none"],
        default=None,
        help="default: a bar on a terminal, JSON lines otherwise",
    )
    f.set_defaults(handler=_fetch)


def add_verify(sub: argparse._SubParsersAction) -> None:
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


def _fetch(args: argparse.Namespace) -> int:
    from ..capacity import EXIT_INSUFFICIENT_STORAGE, CapacityRequest
    from .eviction import InsufficientStorage
    from .run import fetch

    req: FetchRequest | None = None
    try:
        req = FetchRequest.from_namespace(args)
        result = fetch(req, progress_mode=args.progress, capacity=CapacityRequest.from_env(os.environ))
    except Exception as e:
        failed = FetchResult(
            status="Failed",
            error=one_line(e),
            source=getattr(req, "source", args.source),
            reason=getattr(e, "reason", None),
            capacity=getattr(e, "capacity", None),
        )
        write_termination_message(failed)
        if isinstance(e, InsufficientStorage):
            print(f"strata-loader fetch: error: {one_line(e)}", file=sys.stderr)
            return EXIT_INSUFFICIENT_STORAGE
        raise
    write_termination_message(result)
    print(json.dumps({"event": "done", **json.loads(result.to_termination_message())}), flush=True)
    return 0


def write_termination_message(result: FetchResult) -> None:
    messages.write_termination_message(result.to_termination_message())


class CopyDamaged(RuntimeError):
    """A fetched directory no longer holds what its manifest recorded."""


def _verify(args: argparse.Namespace) -> int:
    from ..core.manifest import damage, load_manifest
    from ..core.sources import LocalReader, read_header
    from ..paths import DestDir

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
