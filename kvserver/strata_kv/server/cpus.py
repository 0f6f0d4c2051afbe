"""How many CPUs this server may really use: its affinity, within its cgroup's CPU quota (a container's CPU limit).

Kept apart because it reads the host (the cgroup filesystem) and because sizing is its only use: the sender
threads warn when they and the event loop would share fewer cores than they need.
"""

from __future__ import annotations

import os
from pathlib import Path


def usable_cpus(cgroup: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The CPUs this process may run on (its affinity), fewer where its cgroup's CPU quota (a container's CPU
    limit, cgroup v2 `cpu.max`: "<quota> <period>" or "max <period>") allows less."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = cgroup.read_text().split()[:2]
        if quota == "max":
            return cpus
        return max(1, min(cpus, -(-int(quota) // int(period))))
    except (OSError, ValueError, ZeroDivisionError):
        return cpus
