"""The loader's tuning settings from the environment, in one object read once: by `strata-loader` at start
(`cli.main`), else on first use (the vLLM plugin, a library caller). Nothing reads these variables at import, so a
test or an embedding process sets them by `configure`, not by patching module constants.

Only the tuning knobs live here; what names a source or its credentials (HF_TOKEN, HF_ENDPOINT, AWS_*) is read
where it is used, when it is used (those clients fix their configuration at their own first use).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass

ENV_HF_RETRIES = "STRATA_HF_RETRIES"
ENV_S3_RETRIES = "STRATA_S3_RETRIES"
ENV_PEER_BUSY_S = "STRATA_PEER_BUSY_S"


class SettingError(ValueError):
    """An environment setting that is not a value of its kind: the message names the variable and what it takes."""


@dataclass(frozen=True, slots=True)
class LoaderSettings:
    hf_retries: int = 8
    """STRATA_HF_RETRIES: attempts per ranged GET to the Hub before giving up (jittered backoff, 0.1 s doubling,
    8 s cap); at least 1."""
    s3_retries: int = 8
    """STRATA_S3_RETRIES: attempts per S3 request before giving up (the same backoff); at least 1."""
    peer_busy_seconds: float = 10.0
    """STRATA_PEER_BUSY_S: a peer answering only 503 (busy) for this long is dropped for the rest of the fetch."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LoaderSettings:
        env = os.environ if env is None else env
        return cls(
            hf_retries=_count(env, ENV_HF_RETRIES, DEFAULTS.hf_retries),
            s3_retries=_count(env, ENV_S3_RETRIES, DEFAULTS.s3_retries),
            peer_busy_seconds=_seconds(env, ENV_PEER_BUSY_S, DEFAULTS.peer_busy_seconds),
        )


DEFAULTS = LoaderSettings()


def _count(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise SettingError(f"{name}={raw!r}: write a whole number of attempts, at least 1 (default {default})")
    return value


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise SettingError(f"{name}={raw!r}: write a number of seconds, 0 or more (default {default:g})")
    return value


_lock = threading.Lock()
_current: LoaderSettings | None = None


def configure(settings: LoaderSettings | None) -> LoaderSettings | None:
    """The process's settings from now on (`cli.main` with `from_env()` at start; a test with its own, then
    the previous ones back); None: read the environment again at the next use. Returns the previous ones."""
    global _current
    with _lock:
        previous, _current = _current, settings
        return previous


def current() -> LoaderSettings:
    """The process's settings: those configured, else the environment's, read once."""
    global _current
    with _lock:
        if _current is None:
            _current = LoaderSettings.from_env()
        return _current
