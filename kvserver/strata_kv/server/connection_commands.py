"""Connection-level commands: liveness, authentication, protocol negotiation, client bookkeeping."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time

from .. import __version__
from ..wire import resp
from .state import AUTH_FAILURES, Parts, ServerState, Session

log = logging.getLogger(__name__)


def wrong_args(name: bytes) -> bytes:
    return resp.error(f"wrong number of arguments for '{name.decode(errors='replace').lower()}' command")


async def cmd_ping(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    if len(args) == 1:
        return resp.PONG
    if len(args) == 2:
        return resp.bulk(args[1])
    return wrong_args(args[0])


async def cmd_echo(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    return resp.bulk(args[1])


MAX_AUTH_DELAY_SECONDS = 5.0


async def _authenticate(state: ServerState, s: Session, user: bytes | None, password: bytes) -> bytes | None:
    """None when the token matches; otherwise the error reply, after the failure's delay."""
    if state.token is None:
        return resp.error(
            "ERR AUTH <password> called without any password configured for the default user. "
            "Are you sure your configuration is correct?"
        )
    if (user is None or user == b"default") and hmac.compare_digest(password, state.token):
        s.authenticated = True
        return None
    await _auth_failed(state, s)
    return resp.error("WRONGPASS invalid username-password pair or user is disabled.")


async def _auth_failed(state: ServerState, s: Session) -> None:
    """Slow guessing down: answer after a delay that doubles per failure, close after `auth.max_failures`.

    The delay holds only this connection's command loop; other clients are not slowed.
    """
    cfg = state.store.cfg.auth
    s.auth_failures += 1
    delay = min(cfg.failure_delay_seconds * 2 ** (s.auth_failures - 1), MAX_AUTH_DELAY_SECONDS)
    if delay > 0:
        await asyncio.sleep(delay)
    if s.auth_failures >= cfg.max_failures:
        log.warning("closing client %s (id %d) after %d failed AUTH attempts", s.addr, s.id, s.auth_failures)
        state.disconnections[AUTH_FAILURES] += 1
        s.close_after_reply = True


async def cmd_auth(state: ServerState, s: Session, args: list[bytes]) -> Parts:
    if len(args) not in (2, 3):
        return resp.error("syntax error")
    user, password = (None, args[1]) if len(args) == 2 else (args[1], args[2])
    return await _authenticate(state, s, user, password) or resp.OK


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
            err = await _authenticate(state, s, args[i + 1], args[i + 2])
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
