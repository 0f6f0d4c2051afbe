"""The peer fan-out's subcommand: `serve-peer`, a verified copy served to other nodes' fetches.

Registered in `strata_loader.cli.SUBCOMMANDS`; the operator runs it in the peer pods of a fanned-out cache.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .limits import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
    DEFAULT_MAX_REQUESTS,
    DEFAULT_MAX_TRANSFERS,
)


def add_serve_peer(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser(
        "serve-peer",
        help="serve a verified copy's files (range GETs, bearer token) to other nodes' fetches",
    )
    sp.add_argument("dir", help="a directory fetch completed (its manifest lists what is served)")
    sp.add_argument("--token-file", required=True, help="file holding the bearer token fetchers must send")
    sp.add_argument("--host", default="127.0.0.1", help="address to listen on (in a pod: its pod IP)")
    sp.add_argument("--port", type=int, default=None, help="default 8477; 0 picks a free port")
    sp.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="connections open at once (one thread holds all that wait for a request)",
    )
    sp.add_argument(
        "--max-connections-per-client",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
        help="of those, from one client address",
    )
    sp.add_argument(
        "--max-requests",
        type=int,
        default=DEFAULT_MAX_REQUESTS,
        help="token holders' requests served at once, a thread each",
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


def _serve_peer(args: argparse.Namespace) -> int:
    from ..contract import PEER_PORT
    from .limits import PeerLimits
    from .server import serve

    port = PEER_PORT if args.port is None else args.port
    limits = PeerLimits(
        max_connections=args.max_connections,
        max_connections_per_client=args.max_connections_per_client,
        max_requests=args.max_requests,
        max_transfers=args.max_transfers,
        header_timeout_s=args.header_timeout,
    )
    serve(Path(args.dir), args.token_file, args.host, port, limits)
    return 0
