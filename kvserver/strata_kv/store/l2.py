"""What every L2 tier offers the store: the store and write-behind never ask which tier they hold."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class L2Tier(Protocol):
    """A second tier behind L1 (shared filesystem, S3): blocking calls, run in worker threads."""

    name: str
    """Label in metrics, stats and `STRATA.LOCATE` replies (`fs`, `s3`)."""
    read_failure: type[Exception]
    """What a failing read raises (counted as an error and served as a miss)."""
    on_change: Callable[[bytes, bool], None] | None
    """For KV events: told (from the tier's thread, in the order of the tier's own bookkeeping) of each block key the
    tier now holds (True: a write) or no longer holds (False: capacity eviction, delete, a corrupt file); None: not
    asked."""

    @property
    def rescan_interval(self) -> float:
        """Seconds between `rescan` calls; 0: never."""
        ...

    def prepare(self) -> None:
        """Make ready, or fail fast with a readable error (a missing directory, an unreachable bucket)."""

    def get(self, key: bytes) -> bytes | None: ...

    def contains(self, key: bytes, pin_seconds: float = 0.0) -> bool:
        """Present; `pin_seconds` keeps capacity eviction off it for that long, where the tier evicts."""
        ...

    def put(self, key: bytes, value: bytes) -> None: ...

    def holds(self, key: bytes) -> bool:
        """Whether the tier's own bookkeeping says it holds `key`, without I/O (for KV events)."""
        ...

    def delete(self, key: bytes) -> bool:
        """Removed; False when it was not there."""
        ...

    def rescan(self) -> None:
        """Recount what others wrote into a shared tier and enforce capacity."""

    def block_keys(self) -> list[bytes] | None:
        """The vLLM-tier keys the tier's index holds (`STRATA.BLOCKS`); None: the tier keeps no index."""
        ...

    def stats(self) -> dict[str, int]: ...
