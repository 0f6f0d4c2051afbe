"""L1 eviction policies over byte-sized entries.

`LRUPolicy` is the baseline that falls off the cliff on loops slightly larger than the cache.
`PrefixLIRSPolicy` (the default) is LIRS adapted to byte sizes, made prefix-aware: a chunk is only
useful when every chunk before it in its chain is resident, so among cold candidates it evicts the
tail of a chain before its head.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from ..config import EvictionPolicyName

Key = Any  # bytes in the server, small ints in simulations
Skip = Callable[[Key], bool]


class EvictionPolicy(Protocol):
    """What the L1 tier needs from a policy: bookkeeping calls and a victim choice."""

    def admit(self, key: Key, size: int, parent: Key | None = None) -> None: ...
    def touch(self, key: Key) -> None: ...
    def observe(self, key: Key) -> None: ...
    def should_admit(self, key: Key, skip: Skip, parent: Key | None = None) -> bool: ...
    def remove(self, key: Key) -> None: ...
    def link(self, parent: Key, child: Key) -> None: ...
    def choose_victim(self, skip: Skip) -> Key | None: ...
    def ghost_distance(self, key: Key) -> int | None:
        """For a key not resident: bytes evicted since it was (a larger L1 by that much would have kept it);
        None when the policy does not remember it."""
        ...


class _Chains:
    """Parent/child links between resident chunks, so victims can be moved to chain tails."""

    def __init__(self) -> None:
        self.parent: dict[Key, Key] = {}
        self.children: dict[Key, set[Key]] = {}

    def link(self, parent: Key, child: Key) -> None:
        if parent == child or self.parent.get(child) == parent:
            return
        self.unlink(child)
        self.parent[child] = parent
        self.children.setdefault(parent, set()).add(child)

    def unlink(self, key: Key) -> None:
        old = self.parent.pop(key, None)
        if old is not None:
            kids = self.children.get(old)
            if kids is not None:
                kids.discard(key)
                if not kids:
                    del self.children[old]

    def forget(self, key: Key) -> None:
        """Drop a key that left the cache; its children keep no parent (their prefix is broken anyway)."""
        self.unlink(key)
        for kid in self.children.pop(key, ()):
            self.parent.pop(kid, None)

    def tail_of(self, key: Key, eligible: Callable[[Key], bool], max_steps: int = 4096) -> Key:
        """Deepest eligible descendant of `key` (itself if none): the chunk whose loss costs least."""
        current = key
        for _ in range(max_steps):
            nxt = next((k for k in self.children.get(current, ()) if eligible(k)), None)
            if nxt is None:
                return current
            current = nxt
        return current


class LRUPolicy:
    """Least recently used; with `prefix_aware` it evicts the tail of the LRU entry's chain first."""

    def __init__(self, prefix_aware: bool = False) -> None:
        self._order: OrderedDict[Key, int] = OrderedDict()
        self._chains = _Chains()
        self._prefix_aware = prefix_aware

    def admit(self, key: Key, size: int, parent: Key | None = None) -> None:
        self._order[key] = size
        self._order.move_to_end(key)
        if parent is not None:
            self._chains.link(parent, key)

    def touch(self, key: Key) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def link(self, parent: Key, child: Key) -> None:
        if parent in self._order and child in self._order:
            self._chains.link(parent, child)

    def observe(self, key: Key) -> None:
        pass

    def should_admit(self, key: Key, skip: Skip, parent: Key | None = None) -> bool:
        return True

    def remove(self, key: Key) -> None:
        self._order.pop(key, None)
        self._chains.forget(key)

    def ghost_distance(self, key: Key) -> int | None:
        return None  # LRU keeps no ghosts

    def choose_victim(self, skip: Skip) -> Key | None:
        for key in self._order:
            if skip(key):
                continue
            victim = key
            if self._prefix_aware:
                victim = self._chains.tail_of(key, lambda k: k in self._order and not skip(k))
            self.remove(victim)
            return victim
        return None


_HALVE = bytes(i >> 1 for i in range(256))  # bytes.translate table: every counter halved at once
_MIX = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


class FrequencySketch:
    """Recent access counts with aging, in fixed memory: a count-min sketch (TinyLFU's frequency filter).

    `depth` rows of `width` one-byte saturating counters, indexed by double hashing of `hash(key)` (SipHash
    for bytes, seeded per process, so clients cannot aim collisions). Keys are never stored: a flood of
    GET misses for distinct large keys costs nothing beyond the `width * depth` bytes. Every period all
    counters are halved. Overestimates only (collisions add), never underestimates.
    """

    def __init__(self, min_period: int = 1024, width: int = 1 << 16, depth: int = 4) -> None:
        if width & (width - 1):
            raise ValueError("sketch width must be a power of two")
        self._rows = [bytearray(width) for _ in range(depth)]
        self._mask = width - 1
        self._events = 0
        self._min_period = min_period

    @property
    def nbytes(self) -> int:
        return sum(len(r) for r in self._rows)

    def _indexes(self, key: Key) -> list[int]:
        x = (hash(key) * _MIX) & _MASK64
        h1, h2 = x >> 32, (x & 0xFFFFFFFF) | 1
        return [(h1 + i * h2) & self._mask for i in range(len(self._rows))]

    def add(self, key: Key, resident: int) -> None:
        for row, i in zip(self._rows, self._indexes(key), strict=True):
            if row[i] < 255:
                row[i] += 1
        self._events += 1
        if self._events >= max(self._min_period, 10 * resident):
            self._events = 0
            self._rows = [bytearray(r.translate(_HALVE)) for r in self._rows]

    def __getitem__(self, key: Key) -> int:
        return min(row[i] for row, i in zip(self._rows, self._indexes(key), strict=True))


GHOST_OVERHEAD = 120
"""Bytes one ghost (a non-resident key in the LIRS stack) costs besides its key: the OrderedDict node and the
bytes object header, as measured with tracemalloc on CPython 3.12."""


def _ghost_cost(key: Key) -> int:
    return GHOST_OVERHEAD + (len(key) if isinstance(key, bytes | bytearray) else 0)


class PrefixLIRSPolicy:
    """LIRS (Jiang & Zhang 2002) with byte sizes, prefix-aware victims and TinyLFU-style admission.

    Entries seen twice within a short reuse distance are LIR and protected; everything else lives in
    a small resident-HIR queue `q` that absorbs scans and loops. Non-resident "ghost" entries in the
    recency stack `s` remember recent misses, so a loop's re-reference promotes a chunk to LIR.
    When the cache is full, a new chunk is only admitted if it has been asked for at least as often
    as the chunk it would displace (popular documents survive one-off requests under Zipf).
    """

    def __init__(
        self, capacity: int, hir_fraction: float = 0.05, ghost_factor: float = 2.0, ghost_bytes_fraction: float = 0.05
    ) -> None:
        self._capacity = max(1, capacity)
        self._lir_limit = int(self._capacity * (1.0 - hir_fraction))
        # Recency stack, last = most recent. A ghost's value is `_evicted_bytes` when it was evicted (its reuse
        # distance in bytes, for `ghost_distance`); resident entries hold None.
        self._s: OrderedDict[Key, int | None] = OrderedDict()
        self._evicted_bytes = 0
        self._q: OrderedDict[Key, None] = OrderedDict()  # resident HIR, last = most recent
        self._size: dict[Key, int] = {}  # resident entries
        self._lir: set[Key] = set()
        self._lir_bytes = 0
        self._ghosts = 0
        self._ghost_bytes = 0  # what the ghosts' keys cost: bounded to ghost_bytes_fraction of the capacity
        self._ghost_budget = int(self._capacity * ghost_bytes_fraction)
        self._ghost_factor = ghost_factor
        self._chains = _Chains()
        self._freq = FrequencySketch()

    # -- bookkeeping ------------------------------------------------------------------------------
    def _prune(self) -> None:
        """Keep the stack's bottom an LIR entry: older HIR entries can no longer be promoted."""
        while self._s:
            bottom = next(iter(self._s))
            if bottom in self._lir:
                return
            del self._s[bottom]
            if bottom not in self._size:
                self._forget_ghost(bottom)

    def _forget_ghost(self, key: Key) -> None:
        self._ghosts -= 1
        self._ghost_bytes -= _ghost_cost(key)

    def _demote_excess_lir(self) -> None:
        while self._lir_bytes > self._lir_limit and self._s:
            bottom = next(iter(self._s))
            if bottom not in self._lir:
                self._prune()
                continue
            del self._s[bottom]
            self._lir.discard(bottom)
            self._lir_bytes -= self._size[bottom]
            self._q[bottom] = None
            self._prune()

    def _make_lir(self, key: Key) -> None:
        self._q.pop(key, None)
        self._lir.add(key)
        self._lir_bytes += self._size[key]
        self._demote_excess_lir()

    def _bound_ghosts(self) -> None:
        limit = int(self._ghost_factor * max(16, len(self._size)))
        if self._ghosts <= limit and self._ghost_bytes <= self._ghost_budget:
            return
        limit, budget = limit * 3 // 4, self._ghost_budget * 3 // 4  # trim by a quarter: one scan per many evictions
        for key in list(self._s):
            if self._ghosts <= limit and self._ghost_bytes <= budget:
                break
            if key not in self._size:
                del self._s[key]
                self._forget_ghost(key)
        self._prune()

    # -- policy interface -------------------------------------------------------------------------
    def admit(self, key: Key, size: int, parent: Key | None = None) -> None:
        if key in self._size:
            self.remove(key)
        self._size[key] = size
        was_ghost = key in self._s
        if was_ghost:
            self._forget_ghost(key)
        self._s[key] = None
        self._s.move_to_end(key)
        if parent is not None and parent in self._size:
            self._chains.link(parent, key)
        if was_ghost or self._lir_bytes + size <= self._lir_limit:
            self._make_lir(key)
        else:
            self._q[key] = None
        self._bound_ghosts()

    def touch(self, key: Key) -> None:
        if key not in self._size:
            return
        if key in self._lir:
            self._s.move_to_end(key)
            self._prune()
        elif key in self._s:
            self._s.move_to_end(key)
            self._make_lir(key)
        else:
            self._s[key] = None
            self._q.move_to_end(key)

    def link(self, parent: Key, child: Key) -> None:
        if parent in self._size and child in self._size:
            self._chains.link(parent, child)

    def observe(self, key: Key) -> None:
        self._freq.add(key, len(self._size))

    def should_admit(self, key: Key, skip: Skip, parent: Key | None = None) -> bool:
        """Admission filter, asked only when admitting `key` means evicting something."""
        for head in self._q:
            if skip(head):
                continue
            victim = self._chains.tail_of(head, lambda k: k in self._q and not skip(k))
            return self._freq[key] >= self._freq[victim]  # ties admit: recency still counts
        return True

    def remove(self, key: Key) -> None:
        size = self._size.pop(key, None)
        if size is None:
            return
        if key in self._lir:
            self._lir.discard(key)
            self._lir_bytes -= size
        self._q.pop(key, None)
        self._s.pop(key, None)
        self._chains.forget(key)
        self._prune()

    def ghost_distance(self, key: Key) -> int | None:
        if key in self._size:
            return None
        stamp = self._s.get(key)
        return None if stamp is None else self._evicted_bytes - stamp

    def _evict(self, key: Key) -> None:
        """Evict a resident HIR entry; it stays in the stack as a ghost if it was there."""
        stamp = self._evicted_bytes
        self._evicted_bytes += self._size.pop(key)
        self._q.pop(key, None)
        self._chains.forget(key)
        if key in self._s:
            self._s[key] = stamp  # an update: the ghost keeps its place in the stack
            self._ghosts += 1
            self._ghost_bytes += _ghost_cost(key)
            self._bound_ghosts()

    def choose_victim(self, skip: Skip) -> Key | None:
        for _ in range(2):
            for key in self._q:
                if skip(key):
                    continue
                victim = self._chains.tail_of(key, lambda k: k in self._q and not skip(k))
                self._evict(victim)
                return victim
            # No cold entry left: demote the coldest unpinned LIR entry and try again.
            lir_bottom = next((k for k in self._s if k in self._lir and not skip(k)), None)
            if lir_bottom is None:
                return None
            del self._s[lir_bottom]
            self._lir.discard(lir_bottom)
            self._lir_bytes -= self._size[lir_bottom]
            self._q[lir_bottom] = None
            self._prune()
        return None


def make_policy(name: EvictionPolicyName | str, capacity: int, hir_fraction: float = 0.05) -> EvictionPolicy:
    """Build the policy named in the config."""
    name = EvictionPolicyName(name)
    if name is EvictionPolicyName.LRU:
        return LRUPolicy()
    return PrefixLIRSPolicy(capacity, hir_fraction=hir_fraction)
