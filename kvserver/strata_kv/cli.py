"""`strata-kv`: run the KV tier server (`serve`) or print its effective config (`config`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Coroutine
from typing import Any

from .config import KVServerConfig


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata-kv", description="Strata KV cache tier server (RESP).")
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_text in (("serve", "run the server"), ("config", "print the effective config as YAML")):
        s = sub.add_parser(name, help=help_text)
        s.add_argument("--config", help="YAML config file (KVServerConfig); flags override it")
        s.add_argument("--port", type=int, help="TCP port for RESP (0 = pick a free one)")
        s.add_argument("--bind", help="TCP bind address (default 127.0.0.1)")
        s.add_argument("--unix-socket", help="also listen on this Unix socket path")
        s.add_argument("--event-loop", choices=["auto", "uvloop", "asyncio"], help="event loop (default auto)")
        s.add_argument("--no-tcp", action="store_true", help="listen on the Unix socket only")
        s.add_argument("--l1-size", help="L1 DRAM capacity, e.g. 1GiB")
        s.add_argument("--eviction-policy", choices=["lru", "prefix-lirs"], help="L1 eviction policy")
        s.add_argument("--l2-dir", help="L2 filesystem tier root directory")
        s.add_argument("--l2-capacity", help="L2 filesystem capacity, e.g. 100GiB (default: the filesystem)")
        s.add_argument("--s3-bucket", help="S3 tier bucket")
        s.add_argument("--s3-prefix", help="S3 tier key prefix")
        s.add_argument("--s3-endpoint", help="S3 endpoint URL (S3-compatible servers)")
        s.add_argument("--metrics-port", type=int, help="Prometheus/health port (-1 disables)")
        s.add_argument("--metrics-bind", help="Prometheus/health bind address (default 127.0.0.1)")
        s.add_argument("--token-file", help="file holding the AUTH token")
        s.add_argument("--model", help="namespace model name")
        s.add_argument("--log-level", help="DEBUG, INFO, WARNING...")
    return p


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {}) or node.setdefault(part, {})
        if not isinstance(node, dict):
            raise SystemExit(f"config: {part} must be a mapping to set {path}")
    node[leaf] = value


def build_config(args: argparse.Namespace) -> KVServerConfig:
    """Config file (if any), then flags on top."""
    base = KVServerConfig.from_yaml_file(args.config) if args.config else KVServerConfig()
    data = base.model_dump(mode="json", exclude_none=True)
    overrides = {
        "listen.port": args.port,
        "listen.bind": args.bind,
        "listen.unix_socket": args.unix_socket,
        "listen.event_loop": args.event_loop,
        "l1.size": args.l1_size or None,
        "l1.eviction_policy": args.eviction_policy,
        "metrics.port": args.metrics_port,
        "metrics.bind": args.metrics_bind,
        "auth.token_file": args.token_file,
        "namespace.model": args.model,
        "log_level": args.log_level,
    }
    if args.no_tcp:
        overrides["listen.tcp_enabled"] = False
    if args.l2_dir:
        overrides["l2.fs.root_dir"] = args.l2_dir
    if args.l2_capacity:
        overrides["l2.fs.capacity"] = args.l2_capacity
    if args.s3_bucket:
        overrides["l2.s3.bucket"] = args.s3_bucket
    if args.s3_prefix is not None:
        overrides["l2.s3.prefix"] = args.s3_prefix
    if args.s3_endpoint:
        overrides["l2.s3.endpoint_url"] = args.s3_endpoint
    for path, value in overrides.items():
        if value is not None:
            _set(data, path, value)
    return KVServerConfig.model_validate(data)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = build_config(args)
    except ValueError as e:
        print(f"strata-kv: invalid configuration: {e}", file=sys.stderr)
        return 2
    if args.command == "config":
        sys.stdout.write(cfg.to_yaml())
        return 0
    logging.basicConfig(
        level=cfg.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )

    try:
        _run(_serve(cfg), cfg.listen.event_loop)
    except OSError as e:
        print(f"strata-kv: cannot start: {e}", file=sys.stderr)
        return 1
    return 0


def _run(main: Coroutine[Any, Any, None], event_loop: str) -> None:
    """Run the server on uvloop when asked (or, with `auto`, when it is installed), else on asyncio's loop."""
    factory = None
    if event_loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if event_loop == "uvloop":
                raise SystemExit("strata-kv: listen.event_loop is uvloop, but uvloop is not installed") from None
        else:
            factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main)


async def _serve(cfg: KVServerConfig) -> None:
    from .server.listeners import KVServer

    await KVServer(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
