"""`strata-loader compile key|restore|capture|list|prune`: the engine's compile cache, kept with the model.

    compile key [--image REF] [--out FILE] -- ENGINE_ARGS...   (in the engine's interpreter: imports vLLM, torch)
    compile restore --store DIR --key FILE [--vllm-cache-root DIR] [--inductor-cache-dir DIR]
    compile capture --store DIR --key FILE [--vllm-cache-root DIR] [--inductor-cache-dir DIR] [--max-bytes Q]
                    [--if-missing] [--follow [--quiet-seconds S] [--poll-seconds S] [--timeout-seconds S]]
    compile list --store DIR
    compile prune --store DIR [--grace-seconds S]

Each prints one JSON line. `restore` exits 0 on a miss too, saying why: a missing or unusable cache must never
stop an engine, which then compiles as it would have without Strata.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from strata_units import parse_bytes

from ..contract import CompileCaptureReport, CompileRestoreReport
from ..core.messages import one_line, write_termination_message
from .key import CompileKey, aot_compile_reloads
from .manifest import INDUCTOR_ROOT, VLLM_ROOT
from .store import DEFAULT_GRACE_S, CacheMiss, CompileStore

VLLM_COMPILE_SUBDIR = "torch_compile_cache"
"""Where vLLM keeps compiled graphs under VLLM_CACHE_ROOT; the rest of that directory is not compile output."""


def add_compile(sub: Any) -> None:
    p = sub.add_parser("compile", help="keep an engine's compile cache with the model: key, restore, capture")
    actions = p.add_subparsers(dest="action", required=True)

    k = actions.add_parser("key", help="print this engine's compile key (run with the engine's own python)")
    k.add_argument("--image", default=os.environ.get("STRATA_ENGINE_IMAGE", ""), help="the engine image's reference")
    k.add_argument("--out", type=Path, help="also write the key to this file")
    k.add_argument("engine_args", nargs=argparse.REMAINDER, help="-- then vLLM's arguments (--model ... )")
    k.set_defaults(handler=run_key)

    r = actions.add_parser("restore", help="copy the verified cache for this key into the engine's cache dirs")
    _common(r)
    r.set_defaults(handler=run_restore)

    c = actions.add_parser("capture", help="store the engine's compile output under its key")
    _common(c)
    c.add_argument("--max-bytes", help="the store's limit (e.g. 20Gi): a capture that would exceed it is refused")
    c.add_argument("--if-missing", action="store_true", help="do nothing when the store has a cache for this key")
    c.add_argument("--follow", action="store_true", help="wait until the compile is complete and stable first")
    c.add_argument("--quiet-seconds", type=float, default=30.0, help="with --follow: unchanged this long (30)")
    c.add_argument("--poll-seconds", type=float, default=2.0, help="with --follow: look this often (2)")
    c.add_argument("--timeout-seconds", type=float, default=3600.0, help="with --follow: give up after (3600)")
    c.add_argument(
        "--stay",
        action="store_true",
        help="then wait until stopped (SIGTERM), whatever the outcome: a pod's sidecar that exits is restarted",
    )
    c.set_defaults(handler=run_capture)

    ls = actions.add_parser("list", help="the keys the store holds, with their sizes")
    ls.add_argument("--store", type=Path, required=True)
    ls.set_defaults(handler=run_list)

    pr = actions.add_parser("prune", help="remove replaced and abandoned generations")
    pr.add_argument("--store", type=Path, required=True)
    pr.add_argument("--grace-seconds", type=float, default=DEFAULT_GRACE_S)
    pr.set_defaults(handler=run_prune)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", type=Path, required=True, help="the store directory (where the model is)")
    p.add_argument("--key", type=Path, required=True, help="the key file `compile key --out` wrote")
    p.add_argument(
        "--vllm-cache-root",
        type=Path,
        default=_vllm_cache_root(),
        help="the engine's VLLM_CACHE_ROOT (default: $VLLM_CACHE_ROOT, else vLLM's default)",
    )
    p.add_argument(
        "--inductor-cache-dir",
        type=Path,
        default=Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) if os.environ.get("TORCHINDUCTOR_CACHE_DIR") else None,
        help="the engine's TORCHINDUCTOR_CACHE_DIR when set apart (default: $TORCHINDUCTOR_CACHE_DIR)",
    )


def _vllm_cache_root() -> Path:
    """vLLM's own default: $VLLM_CACHE_ROOT, else $XDG_CACHE_HOME/vllm, else ~/.cache/vllm."""
    if os.environ.get("VLLM_CACHE_ROOT"):
        return Path(os.environ["VLLM_CACHE_ROOT"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm"


def cache_dirs(args: argparse.Namespace) -> dict[str, Path]:
    """The engine's cache directories by root name; an inductor directory inside vLLM's is not a root of its own."""
    dirs = {VLLM_ROOT: args.vllm_cache_root / VLLM_COMPILE_SUBDIR}
    inductor = args.inductor_cache_dir
    if inductor is not None and not inductor.absolute().is_relative_to(dirs[VLLM_ROOT].absolute()):
        dirs[INDUCTOR_ROOT] = inductor
    return dirs


def _say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def run_key(args: argparse.Namespace) -> int:
    from .probe import probe_key

    engine_args = args.engine_args[1:] if args.engine_args[:1] == ["--"] else args.engine_args
    key = probe_key(engine_args, args.image)
    if args.out is not None:
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(key.to_json())
        tmp.replace(args.out)
    fields: dict[str, Any] = {"key": key.digest, "parts": dict(key.parts)}
    if not aot_compile_reloads(key.parts["engine"]) and key.parts["env"].endswith(" aot=1"):
        fields["warning"] = (
            f"{key.parts['engine']} cannot reload its own AOT compile artifacts; run it with VLLM_USE_AOT_COMPILE=0"
        )
    _say("key", **fields)
    return 0


def run_restore(args: argparse.Namespace) -> int:
    key = None
    try:
        key = CompileKey.from_json(args.key.read_bytes())
        restored = CompileStore(args.store).restore(key, cache_dirs(args))
    except CacheMiss as e:
        report = CompileRestoreReport(event="miss", reason=e.reason)
    except Exception as e:  # a miss, whatever went wrong: the engine starts and compiles
        report = CompileRestoreReport(event="miss", reason=one_line(e))
    else:
        report = CompileRestoreReport(
            event="restored", generation=restored.generation, files=restored.files, bytes=restored.bytes
        )
    if key is not None:
        report = report.model_copy(update={"key": key.digest, "summary": key.summary})
    _say(report.event, **report.model_dump(exclude={"event", "summary"}, exclude_none=True))
    write_termination_message(report.to_termination_message())  # the operator counts hits and misses from it
    return 0


def run_capture(args: argparse.Namespace) -> int:
    if not args.stay:
        _say_report(_capture(args))
        return 0
    stopped = _stop_on_sigterm()
    try:
        report = _capture(args)
    except Exception as e:  # said once; a sidecar that exits is restarted and would try again and again
        print(f"strata-loader compile: error: {one_line(e)}", file=sys.stderr, flush=True)
        report = CompileCaptureReport(event="refused", key=_digest_or_none(args.key), reason=one_line(e))
    _say_report(report)  # the operator reads this line from the sidecar's log
    stopped()
    return 0


def _say_report(report: CompileCaptureReport) -> None:
    _say(report.event, **report.model_dump(exclude={"event"}, exclude_none=True))


def _digest_or_none(path: Path) -> str | None:
    try:
        return CompileKey.from_json(path.read_bytes()).digest
    except Exception:
        return None


def _capture(args: argparse.Namespace) -> CompileCaptureReport:
    from .follow import wait_until_complete

    key = CompileKey.from_json(args.key.read_bytes())
    max_bytes = parse_bytes(args.max_bytes, minimum=1) if args.max_bytes else None
    store = CompileStore(args.store, max_bytes=max_bytes)
    sources = cache_dirs(args)
    said = CompileCaptureReport(event="present", key=key.digest, summary=key.summary)
    if args.if_missing and _present(store, key):
        return said
    if args.follow and not wait_until_complete(sources, args.quiet_seconds, args.poll_seconds, args.timeout_seconds):
        reason = f"no complete, stable compile output after {args.timeout_seconds:g} s"
        return said.model_copy(update={"event": "not-captured", "reason": reason})
    if args.follow and args.if_missing and _present(store, key):  # another engine of the revision was faster
        return said
    captured = store.capture(key, sources)
    outcome = {"generation": captured.generation, "files": captured.files, "bytes": captured.bytes}
    return said.model_copy(update={"event": "unchanged" if captured.unchanged else "captured", **outcome})


def _stop_on_sigterm() -> Callable[[], None]:
    """With `--stay`: SIGTERM (or SIGINT) ends the process with status 0 at any point, the capture included (its
    temp generation is removed by a later capture or prune); returns the wait for it. The kubelet stops a pod's
    sidecar that way, and restarts one that exits by itself, which would flap the pod's readiness."""
    import signal
    import threading

    stop = threading.Event()
    waiting = False

    def on_signal(*_: Any) -> None:
        stop.set()
        if not waiting:
            raise SystemExit(0)

    def wait() -> None:
        nonlocal waiting
        waiting = True
        if not stop.is_set():
            stop.wait()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    return wait


def _present(store: CompileStore, key: CompileKey) -> bool:
    try:
        store.current(key.digest)
    except CacheMiss:
        return False
    return True


def run_list(args: argparse.Namespace) -> int:
    store = CompileStore(args.store)
    caches = [
        {
            "key": s.digest,
            "generation": s.generation,
            "files": len(s.manifest.files),
            "bytes": s.manifest.bytes,
            "created": s.manifest.created,
            "parts": s.manifest.key,
        }
        for s in store.caches()
    ]
    _say("caches", used_bytes=store.used_bytes(), caches=caches)
    return 0


def run_prune(args: argparse.Namespace) -> int:
    removed = CompileStore(args.store).prune(args.grace_seconds)
    _say("pruned", removed=[str(p) for p in removed])
    return 0
