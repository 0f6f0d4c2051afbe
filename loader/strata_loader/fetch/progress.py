"""Fetch progress: a bar on a terminal, JSON lines otherwise (what `kubectl logs` of a Job should show)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, TextIO

from ..contract import ENV_PROGRESS


class Progress:
    """Thread-safe byte counter rendered as a tqdm bar, JSON lines (at most one a second) or nothing."""

    def __init__(
        self,
        total_bytes: int,
        total_files: int,
        mode: str | None = None,
        stream: TextIO | None = None,
        interval: float = 1.0,
    ) -> None:
        self.total_bytes, self.total_files = total_bytes, total_files
        self.stream = stream or sys.stdout
        self.mode = mode or os.environ.get(ENV_PROGRESS) or ("bar" if sys.stderr.isatty() else "json")
        self.done_bytes = self.done_files = 0
        self.interval = interval
        self._t0 = self._last = time.monotonic()
        self._lock = threading.Lock()
        self._bar: Any = None
        if self.mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_bytes,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc="fetch",
                file=sys.stderr,
                dynamic_ncols=True,
            )

    def add(self, n: int) -> None:
        with self._lock:
            self.done_bytes += n
            if self._bar is not None:
                self._bar.update(n)
            elif self.mode == "json" and time.monotonic() - self._last >= self.interval:
                self._emit("progress")

    def file_done(self) -> None:
        with self._lock:
            self.done_files += 1

    def close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()
            elif self.mode == "json":
                self._emit("progress")

    def _emit(self, event: str) -> None:
        now = time.monotonic()
        self._last = now
        elapsed = max(now - self._t0, 1e-9)
        line = {
            "event": event,
            "bytes": self.done_bytes,
            "total_bytes": self.total_bytes,
            "files": self.done_files,
            "total_files": self.total_files,
            "seconds": round(elapsed, 3),
            "bytes_per_second": int(self.done_bytes / elapsed),
        }
        print(json.dumps(line), file=self.stream, flush=True)
