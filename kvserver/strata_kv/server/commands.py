"""The command table: what each RESP command does against the store, with Redis's exact replies."""

from __future__ import annotations

import asyncio
import fnmatch
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..store import namespaces
from ..store.tiered import StoreFull
from ..wire import resp
from ..wire.shared_memory import SharedReply, exportable
from .connection_commands import (
    cmd_auth,
    cmd_client,
    cmd_echo,
    cmd_hello,
    cmd_ping,
    cmd_quit,
    cmd_select,
    wrong_args,
)
from .info import render_info
from .state import UNIX_ADDR, OutputLimitExceeded, Parts, ServerState, Session

CHAIN_WINDOW_SECONDS = 2.0


Handler = Callable[[ServerState, Session, list[bytes]], Awaitable[Parts]]


NowaitHandler = Callable[[ServerState, Session, list[bytes], int], Parts | None]
"""(state, session, args, room): room is the largest reply the fast path may send now. A handler answers only
what fits, before it counts or changes anything: a None sends the command down the slow path, which runs it
again from the start."""


@dataclass(frozen=True)
class Command:
    """One entry of the table: the handler and the properties dispatch checks before running it.

    As in Redis' command table, arity, authentication and key positions are flags of the entry, so
    the fast path and the slow path check them in one place (`_refusal`).
    """

    handler: Handler
    arity: int  # Redis convention: N exact (name included), -N at least N
    needs_auth: bool = True
    first_key: int = 0  # Redis' key spec: keys checked against limits and tenancy; 0: none
    last_key: int = 0  # position of the last key; negative counts from the end (-1: the last argument)
    key_step: int = 1
    pairs: bool = False  # the arguments after the name come as key/value pairs (MSET)
    nowait: NowaitHandler | None = None
    """Answers from L1 inside the read callback, or None: run `handler` in the command task."""

    def keys(self, args: list[bytes]) -> list[bytes]:
        if not self.first_key:
            return []
        last = self.last_key if self.last_key > 0 else len(args) + self.last_key
        return args[self.first_key : last + 1 : self.key_step]


def check_key(state: ServerState, key: bytes) -> bytes | None:
    """An error reply when the key breaks a limit or the tenancy rules, else None."""
    limits = state.store.cfg.limits
    if len(key) > limits.max_key_size:
        return resp.error(f"key of {len(key)} bytes exceeds limits.max_key_size ({limits.max_key_size})")
    tenancy = state.store.cfg.tenancy
    if tenancy.require_salt and key.count(tenancy.salt_separator.encode()) < 5:
        return resp.error(
            "key carries no tenant salt (expected model@world_size@worker_id@hash@dtype@salt); tenancy requires one"
        )
    return None


# -- data commands ----------------------------------------------------------------------------------
def _chain_parent(state: ServerState, s: Session, key: bytes) -> bytes | None:
    """Consecutive SETs on one connection within a short window are taken as one prefix chain."""
    if not state.store.cfg.l1.infer_chains:
        return None
    now = time.monotonic()
    parent = s.last_set_key if now - s.last_set_time < CHAIN_WINDOW_SECONDS else None
    s.last_set_key, s.last_set_time = key, now
    return parent


async def _set(state: ServerState, key: bytes, value: bytes, parent: bytes | None) -> bytes | None:
    try:
        await state.store.set(key, value, parent)
    except StoreFull as e:
        return resp.error(f"OOM {e}")
    return None


async def cmd_set(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    key, value = args[1], args[2]
    nx = xx = False
    for opt in args[3:]:
        o = opt.upper()
        if o == b"NX":
            nx = True
        elif o == b"XX":
            xx = True
        else:
            return resp.error("syntax error")  # TTLs and GET are not supported: chunks live by eviction
    if nx and xx:
        return resp.error("syntax error")
    if nx or xx:
        present = await state.store.exists(key)
        if (nx and present) or (xx and not present):
            return resp.null(s.proto)
    return await _set(state, key, value, _chain_parent(state, s, key)) or resp.OK


async def cmd_get(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    return resp.bulk(await state.store.get(args[1]), s.proto)


async def cmd_strata_getfd(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    """GET, answered with the value's memory (a sealed memfd) where it has one: see `shared_memory`."""
    if not state.store.cfg.listen.shared_memory:
        return resp.error("STRATA.GETFD is off: the server runs without listen.shared_memory")
    if s.addr != UNIX_ADDR:
        return resp.error("STRATA.GETFD answers only on the Unix socket: memory cannot cross a TCP connection")
    value = await state.store.get(args[1])
    mapping = exportable(value)
    if value is None or mapping is None:
        return resp.bulk(value, s.proto)
    handle = state.exports.hand_over(s.id, mapping)
    if handle is None:  # a budget for memory clients may still hold is full: the bytes, as for a small value
        return resp.bulk(value, s.proto)
    return SharedReply(b":%d\r\n" % len(value), handle, resp.bulk(value, s.proto))


async def cmd_exists(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    n = 0
    for key in args[1:]:
        n += await state.store.exists(key, lookup=True)
    return resp.integer(n)


async def cmd_del(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    return resp.integer(sum(await state.store.delete_many(args[1:])))


async def cmd_mget(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    limit = state.store.cfg.limits.max_output_buffer
    parts = [b"*%d\r\n" % (len(args) - 1)]
    size = 0
    for key in args[1:]:
        value = await state.store.get(key)
        size += len(value) if value is not None else 0
        if limit and size > limit:  # e.g. one large key repeated: 40 bytes of request per value
            raise OutputLimitExceeded
        parts.extend(resp.bulk(value, s.proto))
    return parts


async def cmd_strata_mgetsized(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    """`STRATA.MGETSIZED size k1 k2 …`: MGET of values of one known size, as one bulk laid out in advance: a byte
    per key (`1` found, `0` missing, `x` another size), then `size` bytes per key, its value or zeros.

    Why: the vLLM tier's load job reads tens of chunks of one size, and in the engine every return from a
    blocking receive waits for the GIL, which the scheduler thread holds (up to the 5 ms switch interval each
    time). MGET's reply interleaves a header of unknown length with every value, so a client must return to
    Python between values; this reply's length is known from the request, so the client reads the whole job into
    its buffers in one waiting receive (`KVClient.get_many_into`). A miss costs `size` zero bytes on the wire,
    which loads (of chunks a lookup has just found) rarely pay."""
    try:
        size = int(args[1])
    except ValueError:
        return resp.error("value is not an integer or out of range")
    limits = state.store.cfg.limits
    if not 0 <= size <= limits.max_value_size:
        return resp.error(f"size must be 0 to limits.max_value_size ({limits.max_value_size}), got {size}")
    keys = args[2:]
    total = len(keys) * (size + 1)
    if limits.max_output_buffer and total > limits.max_output_buffer:
        return resp.error(
            f"reply of {total} bytes would exceed limits.max_output_buffer ({limits.max_output_buffer}): "
            "ask for fewer keys at once"
        )
    flags = bytearray(len(keys))
    values: list[bytes] = []
    zeros = b""
    for i, value in enumerate(await state.store.get_many(keys)):
        if value is not None and len(value) == size:
            flags[i] = resp.SIZED_FOUND
        else:
            flags[i] = resp.SIZED_MISSING if value is None else resp.SIZED_OTHER_SIZE
            value = zeros = zeros or bytes(size)
        if size:
            values.append(value)
    return [b"$%d\r\n" % total, bytes(flags), *values, resp.CRLF]


async def _mset(state: ServerState, args: list[bytes], chain: bool) -> Parts:
    parent: bytes | None = None
    for key, value in zip(args[1::2], args[2::2], strict=True):
        if err := await _set(state, key, value, parent if chain else None):
            return err
        parent = key
    return resp.OK


async def cmd_mset(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    return await _mset(state, args, chain=state.store.cfg.l1.infer_chains)


async def cmd_dbsize(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    return resp.integer(len(state.store.l1))


async def cmd_info(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    return resp.bulk(render_info(state, [a.decode(errors="replace").lower() for a in args[1:]]).encode())


def config_values(state: ServerState) -> dict[str, str]:
    cfg = state.store.cfg
    return {
        "maxmemory": str(cfg.l1.size),
        "maxmemory-policy": cfg.l1.eviction_policy.value,
        "maxclients": str(cfg.limits.max_clients),
        "proto-max-bulk-len": str(cfg.limits.max_value_size),
        "port": str(state.tcp_port),
        "bind": cfg.listen.bind,
        "unixsocket": state.unix_socket,
        "databases": "1",
        "save": "",
        "appendonly": "no",
        "strata.chunk-tokens": str(cfg.chunk_tokens),
        "strata.namespace": cfg.namespace.directory_name,
        "strata.l2-fs-root": cfg.l2.fs.root_dir if cfg.l2.fs else "",
        "strata.l2-s3-bucket": cfg.l2.s3.bucket if cfg.l2.s3 else "",
        "strata.events-endpoint": state.store.events.endpoint if state.store.events else "",
    }


async def cmd_config(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    sub = args[1].upper()
    if sub == b"GET" and len(args) >= 3:
        out = resp.Map()
        values = config_values(state)
        for pattern in args[2:]:
            pat = pattern.decode(errors="replace").lower()
            for name, value in values.items():
                if fnmatch.fnmatchcase(name, pat):
                    out[name.encode()] = value.encode()
        return resp.encode(out, s.proto)
    if sub in (b"SET", b"RESETSTAT", b"REWRITE"):
        return resp.error("CONFIG SET is not supported: change the config file (or KVCacheTier) and restart")
    return resp.error(f"unknown subcommand '{sub.decode(errors='replace')}'. Try CONFIG GET.")


# -- STRATA.* ---------------------------------------------------------------------------------------
async def cmd_strata_prefix(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    """STRATA.PREFIX k1 k2 ...: [number of leading resident chunks, [tier of each]]."""
    tiers = await state.store.prefix(args[1:])
    return resp.encode([len(tiers), [t.encode() for t in tiers]])


async def cmd_strata_locate(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    tier = await state.store.locate(args[1])
    return resp.bulk(tier.encode() if tier else None, s.proto)


async def cmd_strata_msetchain(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    """Like MSET, and declares the keys one prefix chain (first = head) for prefix-aware eviction."""
    return await _mset(state, args, chain=True)


async def cmd_strata_link(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    state.store.link(args[1], args[2])
    return resp.OK


async def cmd_strata_stats(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    stats: dict[str, Any] = state.store.stats()
    stats["connected_clients"] = len(state.sessions)
    stats["commands_processed"] = state.commands_processed
    stats["values_refused"] = state.values_refused
    if state.inflight is not None:
        stats["inflight_bytes"] = state.inflight.used
        stats["inflight_limit_bytes"] = state.inflight.limit
        stats["inflight_peak_bytes"] = state.inflight.peak
        stats["inflight_waits"] = state.inflight.waits
    if state.value_pool is not None:
        stats["value_pool_bytes"] = state.value_pool.held
        stats["value_pool_reused"] = state.value_pool.reused
        stats["value_pool_created"] = state.value_pool.created
    stats["shared_replies"] = state.shared_replies
    stats["sender_replies"] = state.sender_replies
    return resp.bulk(json.dumps(stats, sort_keys=True).encode())


async def cmd_strata_blocks(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    """STRATA.BLOCKS <tier>: the vLLM-tier block keys `l1` or `fs` holds now, what that tier's KV events add up to
    (to check a router's view against the server's). Lists the whole tier: a diagnostic, not for the data path."""
    tier = args[1].decode(errors="replace").lower()
    try:
        keys = state.store.block_keys(tier) if tier == "l1" else await asyncio.to_thread(state.store.block_keys, tier)
    except ValueError as e:
        return resp.error(str(e))
    return resp.encode(list(keys), s.proto)


async def cmd_strata_namespaces(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    """Every vLLM-tier namespace held, as JSON: {namespace: {tier: {"blocks": n, "bytes": n}}}."""
    usage = await namespaces.namespace_usage(state.store)
    return resp.bulk(json.dumps(usage, sort_keys=True).encode())


async def cmd_strata_dropns(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    """Drop one vLLM-tier namespace from every tier (each key as DEL would); JSON of what each tier freed."""
    try:
        dropped = await namespaces.drop_namespace(state.store, args[1].decode(errors="replace"))
    except namespaces.NamespaceRefused as e:
        return resp.error(str(e))
    return resp.bulk(json.dumps(dropped, sort_keys=True).encode())


async def cmd_command(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    if len(args) >= 2 and args[1].upper() == b"COUNT":
        return resp.integer(len(COMMANDS))
    return resp.EMPTY_ARRAY  # redis-cli asks COMMAND DOCS at start; an empty answer is valid


# -- fast paths: L1 alone answers, no task switch -----------------------------------------------------
BULK_HEADER_MAX = 32
"""The most bytes a bulk reply adds around its value (`$<length>\\r\\n` and `\\r\\n`)."""


def get_nowait(state: ServerState, s: Session, args: list[bytes], room: int) -> Parts | None:
    value = state.store.get_nowait(args[1], room - BULK_HEADER_MAX)
    return None if value is None else resp.bulk(value)


def set_nowait(state: ServerState, s: Session, args: list[bytes], room: int) -> Parts | None:
    if len(args) != 3:
        return None  # options: the slow path
    key = args[1]
    parent, last_time = s.last_set_key, s.last_set_time
    try:
        done = state.store.set_nowait(key, args[2], _chain_parent(state, s, key))
    except StoreFull as e:
        return resp.error(f"OOM {e}")
    if not done:
        s.last_set_key, s.last_set_time = parent, last_time  # the slow path will infer it again
        return None
    return resp.OK


def exists_nowait(state: ServerState, s: Session, args: list[bytes], room: int) -> Parts | None:
    l1 = state.store.l1
    if not all(k in l1 for k in args[1:]):
        return None
    for k in args[1:]:
        l1.pin(k)
    return resp.integer(len(args) - 1)


COMMANDS: dict[bytes, Command] = {
    b"PING": Command(cmd_ping, -1),
    b"ECHO": Command(cmd_echo, 2),
    b"AUTH": Command(cmd_auth, -2, needs_auth=False),
    b"HELLO": Command(cmd_hello, -1, needs_auth=False),
    b"CLIENT": Command(cmd_client, -2),
    b"SELECT": Command(cmd_select, 2),
    b"QUIT": Command(cmd_quit, -1, needs_auth=False),
    b"COMMAND": Command(cmd_command, -1),
    b"SET": Command(cmd_set, -3, first_key=1, last_key=1, nowait=set_nowait),
    b"GET": Command(cmd_get, 2, first_key=1, last_key=1, nowait=get_nowait),
    b"EXISTS": Command(cmd_exists, -2, nowait=exists_nowait),
    b"DEL": Command(cmd_del, -2),
    b"UNLINK": Command(cmd_del, -2),
    b"MGET": Command(cmd_mget, -2),
    b"MSET": Command(cmd_mset, -3, first_key=1, last_key=-2, key_step=2, pairs=True),
    b"DBSIZE": Command(cmd_dbsize, 1),
    b"INFO": Command(cmd_info, -1),
    b"CONFIG": Command(cmd_config, -2),
    b"STRATA.PREFIX": Command(cmd_strata_prefix, -2),
    b"STRATA.LOCATE": Command(cmd_strata_locate, 2),
    b"STRATA.MSETCHAIN": Command(cmd_strata_msetchain, -3, first_key=1, last_key=-2, key_step=2, pairs=True),
    b"STRATA.LINK": Command(cmd_strata_link, 3),
    b"STRATA.STATS": Command(cmd_strata_stats, 1),
    b"STRATA.BLOCKS": Command(cmd_strata_blocks, 2),
    b"STRATA.GETFD": Command(cmd_strata_getfd, 2, first_key=1, last_key=1),
    b"STRATA.MGETSIZED": Command(cmd_strata_mgetsized, -3, first_key=2, last_key=-1),
    b"STRATA.NAMESPACES": Command(cmd_strata_namespaces, 1),
    b"STRATA.DROPNS": Command(cmd_strata_dropns, 2),
}


def _refusal(state: ServerState, s: Session, cmd: Command, args: list[bytes]) -> bytes | None:
    """The error reply the table's flags call for (auth, arity, pairs, key limits), or None: run it."""
    if cmd.needs_auth and not s.authenticated:
        return resp.error("NOAUTH Authentication required.")
    n = len(args)
    if (cmd.arity > 0 and n != cmd.arity) or (cmd.arity < 0 and n < -cmd.arity) or (cmd.pairs and n % 2 == 0):
        return wrong_args(args[0])
    for key in cmd.keys(args):
        if (err := check_key(state, key)) is not None:
            return err
    return None


def dispatch_nowait(state: ServerState, s: Session, args: list[bytes], room: int) -> Parts | None:
    """The hot commands answered without a task switch when L1 can answer alone; None: use `dispatch`.

    GET of an L1 hit and a plain SET with room in the write-behind queue are the traffic of a KV
    tier; skipping the per-command task hop roughly halves their cost. Refusals (errors) are left
    to the slow path, which replies to them. `room`: the largest reply the caller can send now; a
    larger one (a 1 MiB chunk, written in slices) goes down the slow path without being counted
    here first, or every such GET counted twice.
    """
    cmd = COMMANDS.get(args[0].upper())
    if cmd is None or cmd.nowait is None or _refusal(state, s, cmd, args) is not None:
        return None
    reply = cmd.nowait(state, s, args, room)
    if reply is not None:
        s.commands += 1
        state.commands_processed += 1
    return reply


async def dispatch(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    """Run one command: lookup, the checks its table entry calls for, then the handler."""
    cmd = COMMANDS.get(args[0].upper())
    if cmd is None:
        shown = "".join(f"'{a[:64].decode(errors='replace')}' " for a in args[1:4])
        return resp.error(
            f"unknown command '{args[0][:64].decode(errors='replace')}', with args beginning with: {shown}"
        )
    if (err := _refusal(state, s, cmd, args)) is not None:
        return err
    s.commands += 1
    state.commands_processed += 1
    return await cmd.handler(state, s, args)
