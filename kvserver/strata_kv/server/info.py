"""INFO text in Redis's `# Section` / `field:value` format, so existing tooling can read it."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from .state import OUTPUT_BUFFER_LIMIT

if TYPE_CHECKING:
    from .state import ServerState


def _sections(state: ServerState) -> dict[str, dict[str, object]]:
    from .. import __version__

    cfg = state.store.cfg
    stats = state.store.stats()
    hits = stats["hits_l1"] + stats["hits_fs"] + stats["hits_s3"]
    return {
        "server": {
            "redis_version": "7.0.0",
            "strata_version": __version__,
            "redis_mode": "standalone",
            "process_id": os.getpid(),
            "tcp_port": state.tcp_port,
            "uptime_in_seconds": int(time.time() - state.started),
        },
        "clients": {
            "connected_clients": len(state.sessions),
            "maxclients": cfg.limits.max_clients,
        },
        "memory": {
            "used_memory": stats["l1_used_bytes"],
            "maxmemory": stats["l1_capacity_bytes"],
            "maxmemory_policy": stats["l1_policy"],
        },
        "stats": {
            "total_connections_received": state.total_connections,
            "rejected_connections": state.rejected_connections,
            "client_output_buffer_limit_disconnections": state.disconnections[OUTPUT_BUFFER_LIMIT],
            "total_commands_processed": state.commands_processed,
            "keyspace_hits": hits,
            "keyspace_misses": stats["misses"],
            "evicted_keys": stats["l1_evictions"],
        },
        "keyspace": {"db0": f"keys={stats['l1_keys']},expires=0,avg_ttl=0"} if stats["l1_keys"] else {},
        "strata": {k: v for k, v in stats.items() if not k.startswith("l1_policy")},
    }


def render_info(state: ServerState, wanted: list[str]) -> str:
    sections = _sections(state)
    names = list(sections) if not wanted or {"all", "everything", "default"} & set(wanted) else wanted
    out: list[str] = []
    for name in names:
        fields = sections.get(name)
        if fields is None:
            continue
        out.append(f"# {name.capitalize()}")
        out.extend(f"{k}:{v}" for k, v in fields.items())
        out.append("")
    return "\r\n".join(out)
