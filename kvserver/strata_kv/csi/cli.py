"""`strata-kv-csi serve`: the node plugin that hands KV server sockets to restricted pods (see plugin.py)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from .plugin import Plugin, PluginSettings

_DEFAULTS = PluginSettings(node_id="-")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="strata-kv-csi", description="CSI node plugin kv.strata.dev: the KV server's socket for restricted pods."
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the CSI endpoint and register with the kubelet")
    s.add_argument("--node-id", default=os.environ.get("NODE_NAME"), help="this node's name (default $NODE_NAME)")
    s.add_argument("--kubelet-dir", default=_DEFAULTS.kubelet_dir, help="the kubelet's root directory")
    s.add_argument("--state-dir", default=_DEFAULTS.state_dir, help="where the shared per-tier directories live")
    s.add_argument(
        "--socket-group",
        type=int,
        default=_DEFAULTS.socket_group,
        help="group of each tier directory (the KV server's; serving pods add it to supplementalGroups)",
    )
    s.add_argument(
        "--endpoint", default="", help="the CSI socket (default <kubelet-dir>/plugins/kv.strata.dev/csi.sock)"
    )
    s.add_argument(
        "--registration-socket",
        default="",
        help="the kubelet registration socket (default <kubelet-dir>/plugins_registry/kv.strata.dev-reg.sock)",
    )
    s.add_argument(
        "--tier-dir-bytes",
        type=int,
        default=_DEFAULTS.tier_dir_bytes,
        help="size of each tier directory's tmpfs: what its server may write there (a socket takes none)",
    )
    s.add_argument(
        "--tier-dir-inodes",
        type=int,
        default=_DEFAULTS.tier_dir_inodes,
        help="files each tier directory may hold, its root included",
    )
    s.add_argument(
        "--max-tier-dirs",
        type=int,
        default=_DEFAULTS.max_tier_dirs,
        help="tier directories this node shares at a time; a publish for one more is refused",
    )
    s.add_argument(
        "--max-tier-dirs-per-namespace",
        type=int,
        default=_DEFAULTS.max_tier_dirs_per_namespace,
        help="of those, how many one namespace's tiers may hold, so one namespace cannot take every slot",
    )
    s.add_argument("--api-server", default="", help="the API server's URL (default: the in-cluster one)")
    s.add_argument("--api-token-file", default="", help="bearer token file (default: the pod's service account's)")
    s.add_argument("--api-ca-file", default="", help="the API server's CA (default: the pod's service account's)")
    s.add_argument("--no-register", action="store_true", help="do not serve the registration socket")
    s.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING...")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.node_id:
        raise SystemExit("strata-kv-csi: --node-id (or $NODE_NAME) is required: the kubelet's node name")
    for flag in ("max_tier_dirs", "max_tier_dirs_per_namespace", "tier_dir_bytes", "tier_dir_inodes"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"strata-kv-csi: --{flag.replace('_', '-')} must be at least 1")
    settings = PluginSettings(
        node_id=args.node_id,
        kubelet_dir=args.kubelet_dir,
        state_dir=args.state_dir,
        socket_group=args.socket_group,
        endpoint=args.endpoint,
        registration_socket=args.registration_socket,
        register=not args.no_register,
        tier_dir_bytes=args.tier_dir_bytes,
        tier_dir_inodes=args.tier_dir_inodes,
        max_tier_dirs=args.max_tier_dirs,
        max_tier_dirs_per_namespace=args.max_tier_dirs_per_namespace,
        api_server=args.api_server,
        api_token_file=args.api_token_file,
        api_ca_file=args.api_ca_file,
    )
    plugin = Plugin(settings)
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    plugin.start()
    registration = settings.registration_socket if settings.register else "-"
    print(f"strata-kv-csi ready csi={settings.endpoint} registration={registration}", file=sys.stderr, flush=True)
    while not stopping.wait(1.0):
        pass
    plugin.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
