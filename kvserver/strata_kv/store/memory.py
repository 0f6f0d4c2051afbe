"""L1: chunk values in DRAM, bounded in bytes (keys, values and per-entry overhead), evicting through a policy.

Keys that EXISTS recently reported are pinned for a grace period: LMCache asks EXISTS, then GETs,
and a GET that misses hangs its worker forever.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .policy import EvictionPolicy

ENTRY_OVERHEAD = 1024
"""Bytes one resident L1 entry costs besides its key and value bytes, counted against `l1.size`: the two
bytes objects' headers, the value dict entry, the eviction policy's bookkeeping (LIRS stack, queue, size map,
LIR set), its prefix-chain link and its share of the ghosts' budget. Measured with tracemalloc on CPython 3.11
while L1 is full and every SET evicts (its dicts' tables at their emptiest after a resize), 1-byte values and
consecutive SETs linked (`l1.infer_chains`): prefix-lirs 809-948 bytes, lru 587-728. Measured without churn,
640 had looked enough. `tests/unit/test_memory_bound.py` checks the bound still covers what the structures
use."""


def entry_cost(key: bytes, value: bytes) -> int:
    """What one entry counts against the L1 bound."""
    return len(key) + len(value) + ENTRY_OVERHEAD


class MemoryTier:
    """Byte-bounded dict of chunk values. Never holds more than `capacity` bytes, counting keys, values and
    a per-entry overhead (`entry_cost`)."""

    def __init__(
        self,
        capacity: int,
        policy: EvictionPolicy,
        grace_seconds: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        cost: Callable[[bytes, bytes], int] = entry_cost,
    ) -> None:
        self.capacity = capacity
        self._cost = cost
        self.policy = policy
        self.grace_seconds = grace_seconds
        self._clock = clock
        self._values: dict[bytes, bytes] = {}
        self._pins: dict[bytes, float] = {}
        self.used = 0
        self.evictions = 0
        self.evicted_bytes = 0
        self.on_drop: Callable[[bytes], None] | None = None
        """Told of every value L1 lets go (the server recycles large values' buffers)."""

    def __contains__(self, key: bytes) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return len(self._values)

    def held_keys(self) -> list[bytes]:
        """The keys held now (a copy: for listings, not for the hot path)."""
        return list(self._values)

    def items(self) -> list[tuple[bytes, bytes]]:
        """A snapshot of the resident keys and values, without counting an access (namespace listings)."""
        return list(self._values.items())

    def get(self, key: bytes) -> bytes | None:
        value = self._values.get(key)
        if value is not None:
            self.policy.touch(key)
        return value

    def peek(self, key: bytes) -> bytes | None:
        """Read without counting an access (prefix probes must not reorder the cache)."""
        return self._values.get(key)

    def pin(self, key: bytes) -> None:
        """Protect a resident key from eviction for the grace period."""
        if self.grace_seconds > 0 and key in self._values:
            self._pins[key] = self._clock() + self.grace_seconds

    def _pinned(self, key: bytes) -> bool:
        until = self._pins.get(key)
        if until is None:
            return False
        if until <= self._clock():
            del self._pins[key]
            return False
        return True

    def put(self, key: bytes, value: bytes, parent: bytes | None = None) -> list[bytes]:
        """Store `value`, evicting as needed; returns evicted keys.

        Raises MemoryError if it cannot fit: larger than L1, or L1 full of pinned chunks.
        """
        size = self._cost(key, value)
        if size > self.capacity:
            raise MemoryError(
                f"value of {len(value)} bytes (+ key and overhead) is larger than L1 ({self.capacity} bytes)"
            )
        old = self._values.get(key)
        if old is not None:
            self._drop(key)
        evicted: list[bytes] = []
        while self.used + size > self.capacity:
            victim = self.policy.choose_victim(self._pinned)
            if victim is None:
                raise MemoryError(
                    f"L1 is full of pinned chunks ({self.used} of {self.capacity} bytes); "
                    "lower l1.exists_grace_seconds or raise l1.size"
                )
            self._forget_value(victim)
            self.evictions += 1
            evicted.append(victim)
        self._values[key] = value
        self.used += size
        self.policy.admit(key, size, parent)
        return evicted

    def _forget_value(self, key: bytes) -> None:
        value = self._values.pop(key)
        self.used -= self._cost(key, value)
        self.evicted_bytes += len(value)
        self._pins.pop(key, None)
        if self.on_drop is not None:
            self.on_drop(value)

    def _drop(self, key: bytes) -> None:
        value = self._values.pop(key)
        self.used -= self._cost(key, value)
        self._pins.pop(key, None)
        self.policy.remove(key)
        if self.on_drop is not None:
            self.on_drop(value)

    def delete(self, key: bytes) -> bool:
        if key not in self._values:
            return False
        self._drop(key)
        return True

    def link(self, parent: bytes, child: bytes) -> None:
        self.policy.link(parent, child)
