"""The command table: what each RESP command does against the store, with Redis's exact replies."""

from __future__ import annotations

import fnmatch
import hmac
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from . import resp
from .info import render_info
from .store import StoreFull, TieredStore

Parts = bytes | list[bytes]
CHAIN_WINDOW_SECONDS = 2.0


@dataclass
class Session:
    """Per-connection state."""

    id: int
    addr: str
    authenticated: bool
    name: bytes = b""
    created: float = field(default_factory=time.time)
    last_set_key: bytes | None = None
    last_set_time: float = 0.0
    close_after_reply: bool = False
    proto: int = 2
    commands: int = 0


@dataclass
class ServerState:
    """Everything commands may touch besides the session: the store, limits, auth, counters."""

    store: TieredStore
    token: bytes | None
    started: float = field(default_factory=time.time)
    sessions: dict[int, Session] = field(default_factory=dict)
    total_connections: int = 0
    rejected_connections: int = 0
    commands_processed: int = 0
    tcp_port: int = 0
    unix_socket: str = ""


Handler = Callable[[ServerState, Session, list[bytes]], Awaitable[Parts]]


@dataclass(frozen=True)
class Command:
    handler: Handler
    arity: int  # Redis convention: N exact (name included), -N at least N
    needs_auth: bool = True


def _wrong_args(name: bytes) -> bytes:
    return resp.error(f"wrong number of arguments for '{name.decode(errors='replace').lower()}' command")


def check_key(state: ServerState, key: bytes) -> bytes | None:
    """An error reply when the key breaks a limit or the tenancy rules, else None."""
    limits = state.store.cfg.limits
    if len(key) > limits.max_key_size:
        return resp.error(f"key of {len(key)} bytes exceeds limits.max_key_size ({limits.max_key_size})")
    tenancy = state.store.cfg.tenancy
    if tenancy.require_salt and key.count(tenancy.salt_separator.encode()) < 4:
        return resp.error("key carries no tenant salt (expected model@rank@group@hash@salt); tenancy requires one")
    return None


# -- connection commands -----------------------------------------------------------------------------
async def cmd_ping(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    if len(args) == 1:
        return resp.PONG
    if len(args) == 2:
        return resp.bulk(args[1])
    return _wrong_args(args[0])


async def cmd_echo(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    return resp.bulk(args[1])


def _authenticate(state: ServerState, s: Session, user: bytes | None, password: bytes) -> bytes | None:
    if state.token is None:
        return resp.error(
            "ERR AUTH <password> called without any password configured for the default user. "
            "Are you sure your configuration is correct?"
        )
    if (user is None or user == b"default") and hmac.compare_digest(password, state.token):
        s.authenticated = True
        return None
    return resp.error("WRONGPASS invalid username-password pair or user is disabled.")


async def cmd_auth(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    if len(args) not in (2, 3):
        return resp.error("syntax error")
    user, password = (None, args[1]) if len(args) == 2 else (args[1], args[2])
    return _authenticate(state, s, user, password) or resp.OK


async def cmd_hello(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    i = 1
    if len(args) > 1:
        try:
            proto = int(args[1])
        except ValueError:
            return resp.error("Protocol version is not an integer or out of range")
        if proto not in (2, 3):
            return resp.error("NOPROTO sorry, this protocol version is not supported.")
        i = 2
    while i < len(args):
        opt = args[i].upper()
        if opt == b"AUTH" and i + 2 < len(args):
            err = _authenticate(state, s, args[i + 1], args[i + 2])
            if err:
                return err
            i += 3
        elif opt == b"SETNAME" and i + 1 < len(args):
            s.name = args[i + 1]
            i += 2
        else:
            return resp.error(f"Syntax error in HELLO option '{opt.decode(errors='replace')}'")
    if not s.authenticated:
        return resp.error(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> "
            "AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol "
            "version at the same time"
        )
    from . import __version__

    if len(args) > 1:
        s.proto = int(args[1])
    reply = resp.Map(
        {
            b"server": b"redis",
            b"version": f"7.0.0-strata-{__version__}".encode(),
            b"proto": s.proto,
            b"id": s.id,
            b"mode": b"standalone",
            b"role": b"master",
            b"modules": [],
        }
    )
    return resp.encode(reply, s.proto)


async def cmd_client(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    sub = args[1].upper()
    if sub == b"SETNAME" and len(args) == 3:
        s.name = args[2]
        return resp.OK
    if sub == b"GETNAME" and len(args) == 2:
        return resp.bulk(s.name or None, s.proto)
    if sub == b"ID" and len(args) == 2:
        return resp.integer(s.id)
    if sub == b"SETINFO" and len(args) == 4:
        return resp.OK
    if sub == b"INFO" and len(args) == 2:
        return resp.bulk(_client_line(s) + b"\n")
    if sub == b"LIST":
        return resp.bulk(b"".join(_client_line(c) + b"\n" for c in state.sessions.values()))
    return resp.error(f"unknown subcommand or wrong number of arguments for 'CLIENT|{sub.decode(errors='replace')}'")


def _client_line(s: Session) -> bytes:
    age = int(time.time() - s.created)
    return b"id=%d addr=%s name=%s age=%d cmd-count=%d" % (s.id, s.addr.encode(), s.name, age, s.commands)


async def cmd_select(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    return resp.OK if args[1] == b"0" else resp.error("DB index is out of range")


async def cmd_quit(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    s.close_after_reply = True
    return resp.OK


async def cmd_command(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    if len(args) >= 2 and args[1].upper() == b"COUNT":
        return resp.integer(len(COMMANDS))
    return resp.EMPTY_ARRAY  # redis-cli asks COMMAND DOCS at start; an empty answer is valid


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
    if (err := check_key(state, key)) is not None:
        return err
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
    if (err := check_key(state, args[1])) is not None:
        return err
    return resp.bulk(await state.store.get(args[1]), s.proto)


async def cmd_exists(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    n = 0
    for key in args[1:]:
        n += await state.store.exists(key)
    return resp.integer(n)


async def cmd_del(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    n = 0
    for key in args[1:]:
        n += await state.store.delete(key)
    return resp.integer(n)


async def cmd_mget(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    parts = [b"*%d\r\n" % (len(args) - 1)]
    for key in args[1:]:
        parts.extend(resp.bulk(await state.store.get(key), s.proto))
    return parts


async def _mset(state: ServerState, args: list[bytes], chain: bool) -> Parts:
    if len(args) % 2 == 0:
        return _wrong_args(args[0])
    for key in args[1::2]:
        if (err := check_key(state, key)) is not None:
            return err
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
    return resp.bulk(json.dumps(stats, sort_keys=True).encode())


COMMANDS: dict[bytes, Command] = {
    b"PING": Command(cmd_ping, -1),
    b"ECHO": Command(cmd_echo, 2),
    b"AUTH": Command(cmd_auth, -2, needs_auth=False),
    b"HELLO": Command(cmd_hello, -1, needs_auth=False),
    b"CLIENT": Command(cmd_client, -2),
    b"SELECT": Command(cmd_select, 2),
    b"QUIT": Command(cmd_quit, -1, needs_auth=False),
    b"COMMAND": Command(cmd_command, -1),
    b"SET": Command(cmd_set, -3),
    b"GET": Command(cmd_get, 2),
    b"EXISTS": Command(cmd_exists, -2),
    b"DEL": Command(cmd_del, -2),
    b"UNLINK": Command(cmd_del, -2),
    b"MGET": Command(cmd_mget, -2),
    b"MSET": Command(cmd_mset, -3),
    b"DBSIZE": Command(cmd_dbsize, 1),
    b"INFO": Command(cmd_info, -1),
    b"CONFIG": Command(cmd_config, -2),
    b"STRATA.PREFIX": Command(cmd_strata_prefix, -2),
    b"STRATA.LOCATE": Command(cmd_strata_locate, 2),
    b"STRATA.MSETCHAIN": Command(cmd_strata_msetchain, -3),
    b"STRATA.LINK": Command(cmd_strata_link, 3),
    b"STRATA.STATS": Command(cmd_strata_stats, 1),
}


def dispatch_nowait(state: ServerState, s: Session, args: list[bytes]) -> Parts | None:
    """The hot commands answered without a task switch when L1 can answer alone; None: use `dispatch`.

    GET of an L1 hit and a plain SET with room in the write-behind queue are the traffic of a KV
    tier; skipping the per-command task hop roughly halves their cost.
    """
    if not s.authenticated or len(args) < 2:
        return None
    name = args[0].upper()
    reply: Parts
    if name == b"GET" and len(args) == 2:
        if check_key(state, args[1]) is not None:
            return None
        value = state.store.get_nowait(args[1])
        if value is None:
            return None
        reply = resp.bulk(value)
    elif name == b"SET" and len(args) == 3:
        key = args[1]
        if check_key(state, key) is not None:
            return None
        parent = s.last_set_key
        last_time = s.last_set_time
        try:
            done = state.store.set_nowait(key, args[2], _chain_parent(state, s, key))
        except StoreFull as e:
            return resp.error(f"OOM {e}")
        if not done:
            s.last_set_key, s.last_set_time = parent, last_time  # the slow path will infer it again
            return None
        reply = resp.OK
    elif name == b"EXISTS" and all(k in state.store.l1 for k in args[1:]):
        for k in args[1:]:
            state.store.l1.pin(k)
        reply = resp.integer(len(args) - 1)
    else:
        return None
    s.commands += 1
    state.commands_processed += 1
    return reply


async def dispatch(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    """Run one command: lookup, arity and auth checks, then the handler."""
    name = args[0].upper()
    cmd = COMMANDS.get(name)
    if cmd is None:
        shown = "".join(f"'{a[:64].decode(errors='replace')}' " for a in args[1:4])
        return resp.error(
            f"unknown command '{args[0][:64].decode(errors='replace')}', with args beginning with: {shown}"
        )
    if cmd.needs_auth and not s.authenticated:
        return resp.error("NOAUTH Authentication required.")
    if (cmd.arity > 0 and len(args) != cmd.arity) or (cmd.arity < 0 and len(args) < -cmd.arity):
        return _wrong_args(args[0])
    s.commands += 1
    state.commands_processed += 1
    return await cmd.handler(state, s, args)
