"""L1 eviction policies over byte-sized entries.

`LRUPolicy` is the baseline that falls off the cliff on loops slightly larger than the cache.
`PrefixLIRSPolicy` (the default) is LIRS adapted to byte sizes, made prefix-aware: a chunk is only
useful when every chunk before it in its chain is resident, so among cold candidates it evicts the
tail of a chain before its head; and its share for new chunks adapts, so that users who arrive take the
place of users who left.
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
    def remove(self, key: Key) -> None: ...
    def link(self, parent: Key, child: Key) -> None: ...
    def choose_victim(self, skip: Skip) -> Key | None: ...
    def ghost_distance(self, key: Key) -> int | None:
        """For a key not resident: bytes evicted since it was (a larger L1 by that much would have kept it);
        None when the policy does not remember it."""
        ...

    @property
    def hir_bytes(self) -> int:
        """The share of L1 kept for chunks not yet proven hot (0 where the policy keeps none)."""
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

    def remove(self, key: Key) -> None:
        self._order.pop(key, None)
        self._chains.forget(key)

    def ghost_distance(self, key: Key) -> int | None:
        return None  # LRU keeps no ghosts

    @property
    def hir_bytes(self) -> int:
        return 0  # LRU protects nothing

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


GHOST_OVERHEAD = 120
"""Bytes one ghost (a non-resident key in the LIRS stack) costs besides its key: the OrderedDict node and the
bytes object header, as measured with tracemalloc on CPython 3.12."""

MAX_HIR_FRACTION = 0.5
"""The most of L1 the resident-HIR queue may grow to: at least half stays protected (LIR) for chunks proven hot."""


def _ghost_cost(key: Key) -> int:
    return GHOST_OVERHEAD + (len(key) if isinstance(key, bytes | bytearray) else 0)


class PrefixLIRSPolicy:
    """LIRS (Jiang & Zhang 2002) with byte sizes, prefix-aware victims and a resident-HIR share that adapts.

    Entries seen twice within a short reuse distance are LIR and protected; everything else lives in the
    resident-HIR queue `q`, which absorbs scans and loops. Non-resident "ghost" entries in the recency stack `s`
    remember what `q` evicted, so a chunk stored again while its ghost is there becomes LIR.

    `q`'s share of the capacity adapts between `hir_fraction` and MAX_HIR_FRACTION, the way ARC sizes its
    recency side. A chunk stored again after `q` evicted it (a ghost hit) says `q` was too small to see a new
    chunk twice: `q` grows by its size and LIR's oldest chunks are demoted into `q`. A chunk stored again after
    it was LIR, demoted and evicted says LIR was too small: `q` shrinks by its size. With a fixed 5% `q`,
    chunks of users who had left stayed LIR and were never asked for again, while a newly arrived user's
    document was evicted from `q` before its second turn: when users come and go, L1 served 0.03 of what LRU
    served (bench/README.md, `kv_hitratio.py`). One-off chunks (a scan) are never stored again, so they leave
    the share where it is and cannot flush LIR.
    """

    def __init__(
        self, capacity: int, hir_fraction: float = 0.05, ghost_factor: float = 2.0, ghost_bytes_fraction: float = 0.05
    ) -> None:
        self._capacity = max(1, capacity)
        self._min_hir = int(self._capacity * hir_fraction)
        self._max_hir = max(self._min_hir, int(self._capacity * MAX_HIR_FRACTION))
        self._lir_limit = self._capacity - self._min_hir
        # Recency stack, last = most recent. A ghost's value is `_evicted_bytes` when it was evicted (its reuse
        # distance in bytes, for `ghost_distance`); resident entries hold None.
        self._s: OrderedDict[Key, int | None] = OrderedDict()
        self._evicted_bytes = 0
        self._q: OrderedDict[Key, bool] = OrderedDict()
        """Resident HIR, last = most recent; True for a chunk demoted from LIR (its eviction is remembered in
        `_lost_lir`), False for one not yet proven hot."""
        self._lost_lir: OrderedDict[Key, None] = OrderedDict()
        """Ghosts of chunks evicted after a demotion from LIR, oldest first: stored again, they shrink `q`."""
        self._size: dict[Key, int] = {}  # resident entries
        self._lir: set[Key] = set()
        self._lir_bytes = 0
        self._ghosts = 0  # in the stack and in `_lost_lir`
        self._ghost_bytes = 0  # what the ghosts' keys cost: bounded to ghost_bytes_fraction of the capacity
        self._ghost_budget = int(self._capacity * ghost_bytes_fraction)
        self._ghost_factor = ghost_factor
        self._chains = _Chains()

    @property
    def hir_bytes(self) -> int:
        """The share of the capacity the resident-HIR queue may hold now (it adapts; see the class)."""
        return self._capacity - self._lir_limit

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

    def _add_ghost(self, key: Key) -> None:
        self._ghosts += 1
        self._ghost_bytes += _ghost_cost(key)

    def _demote_lir_bottom(self, key: Key) -> None:
        del self._s[key]
        self._lir.discard(key)
        self._lir_bytes -= self._size[key]
        self._q[key] = True
        self._prune()

    def _demote_excess_lir(self) -> None:
        while self._lir_bytes > self._lir_limit and self._s:
            bottom = next(iter(self._s))
            if bottom not in self._lir:
                self._prune()
                continue
            self._demote_lir_bottom(bottom)

    def _make_lir(self, key: Key) -> None:
        self._q.pop(key, None)
        self._lir.add(key)
        self._lir_bytes += self._size[key]
        self._demote_excess_lir()

    def _resize_hir(self, delta: int) -> None:
        """Move `q`'s share by `delta` bytes within its bounds; LIR beyond its new limit is demoted."""
        hir = min(self._max_hir, max(self._min_hir, self.hir_bytes + delta))
        self._lir_limit = self._capacity - hir
        self._demote_excess_lir()

    def _bound_ghosts(self) -> None:
        limit = int(self._ghost_factor * max(16, len(self._size)))
        if self._ghosts <= limit and self._ghost_bytes <= self._ghost_budget:
            return
        limit, budget = limit * 3 // 4, self._ghost_budget * 3 // 4  # trim by a quarter: one scan per many evictions
        stacked = [key for key in self._s if key not in self._size]  # oldest first
        dropped = 0
        while (self._ghosts > limit or self._ghost_bytes > budget) and (self._lost_lir or dropped < len(stacked)):
            if self._lost_lir and len(self._lost_lir) >= len(stacked) - dropped:  # the longer list gives one up
                key, _ = self._lost_lir.popitem(last=False)
            else:
                key = stacked[dropped]
                dropped += 1
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
            self._resize_hir(size)
        elif key in self._lost_lir:
            del self._lost_lir[key]
            self._forget_ghost(key)
            self._resize_hir(-size)
        self._s[key] = None
        self._s.move_to_end(key)
        if parent is not None and parent in self._size:
            self._chains.link(parent, key)
        if was_ghost or self._lir_bytes + size <= self._lir_limit:
            self._make_lir(key)
        else:
            self._q[key] = False
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
        """Evict a resident HIR entry: a ghost in the stack if it was there, in `_lost_lir` if it had been LIR."""
        stamp = self._evicted_bytes
        self._evicted_bytes += self._size.pop(key)
        demoted = self._q.pop(key, False)
        self._chains.forget(key)
        if demoted:
            self._s.pop(key, None)
            self._lost_lir[key] = None
            self._add_ghost(key)
            self._prune()
        elif key in self._s:
            self._s[key] = stamp  # an update: the ghost keeps its place in the stack
            self._add_ghost(key)
        else:
            return
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
            self._demote_lir_bottom(lir_bottom)
        return None


def make_policy(name: EvictionPolicyName | str, capacity: int, hir_fraction: float = 0.05) -> EvictionPolicy:
    """Build the policy named in the config."""
    name = EvictionPolicyName(name)
    if name is EvictionPolicyName.LRU:
        return LRUPolicy()
    return PrefixLIRSPolicy(capacity, hir_fraction=hir_fraction)
