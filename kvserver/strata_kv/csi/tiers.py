"""The node directories the plugin shares, one per (namespace, tier) with pods on this node: each is a small
tmpfs of its own mounted at `<state-dir>/<namespace>/<tier>`, so

- what may be written there is bounded (`tier_dir_bytes`, `tier_dir_inodes`: a socket needs one inode and no
  data), and no pod can grow the node's `/run` through it;
- the directory lives exactly as long as some pod's volume shows it: every bind mount of one tmpfs carries its
  device number, so the mount table says how many pods still use it, and the unpublish after which none does
  unmounts it, dropping whatever was written, and removes the directory;
- the server's unpublish empties it (a dead socket is no use to the tier's remaining clients, and a new server
  pod binds a fresh one in the same directory, which the clients' mounts still show);
- the number of them is bounded (`max_tier_dirs`), so neither can a pod naming many tiers.

State lives in the mount table only, so a restarted plugin picks up where the last one stopped (the chart
mounts the state dir with Bidirectional propagation, so the tmpfs mounts are the host's, not the plugin
container's).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from typing import Protocol

from .mounts import MountPoint, mount_point, mount_table, mount_tmpfs, unmount
from .volume import NodeDirectory

# Setgid, so the socket the server creates keeps the directory's group, and nothing for others: only the
# socket group's members (the KV server, pods with it as a supplemental group).
TIER_DIR_MODE = 0o2770
NAMESPACE_DIR_MODE = 0o700  # only the plugin walks it; pods see only their tier's directory


class TierLimitError(OSError):
    """The node already holds `max_tier_dirs` tier directories (the gRPC answer is RESOURCE_EXHAUSTED)."""


class TierSettings(Protocol):
    kubelet_dir: str
    state_dir: str
    socket_group: int
    tier_dir_bytes: int
    tier_dir_inodes: int
    max_tier_dirs: int


class TierDirectories:
    """Creating, finding and tearing down tier directories; the caller serialises calls."""

    def __init__(self, settings: TierSettings) -> None:
        self.settings = settings

    @property
    def _state_dir(self) -> str:
        """The mount table names real paths: `/var/run` is a link to `/run` on most systems."""
        return os.path.realpath(self.settings.state_dir)

    @property
    def _under_state(self) -> str:
        return self._state_dir + "/"

    @property
    def _under_pods(self) -> str:
        return os.path.join(os.path.realpath(self.settings.kubelet_dir), "pods") + "/"

    def acquire(self, wanted: NodeDirectory) -> str:
        """The tier's directory, mounted now if no pod on the node has it yet."""
        os.makedirs(self.settings.state_dir, mode=0o755, exist_ok=True)
        tier_dir = wanted.path(self._state_dir)
        if mount_point(tier_dir) is not None:
            return tier_dir
        held = sum(1 for m in mount_table() if m.path.startswith(self._under_state))
        if held >= self.settings.max_tier_dirs:
            raise TierLimitError(
                f"this node already shares {held} tier directories (strata-kv-csi --max-tier-dirs "
                f"{self.settings.max_tier_dirs}); raise the limit (the chart's kvSocketDriver.maxTierDirs) or "
                "run fewer tiers' pods on this node"
            )
        _directory(os.path.dirname(tier_dir), NAMESPACE_DIR_MODE)
        _directory(tier_dir, NAMESPACE_DIR_MODE)  # the mount point; the tmpfs brings its own mode
        mount_tmpfs(
            tier_dir,
            size=self.settings.tier_dir_bytes,
            inodes=self.settings.tier_dir_inodes,
            mode=TIER_DIR_MODE,
            gid=self.settings.socket_group,
        )
        return tier_dir

    def release(self, unmounted: MountPoint) -> None:
        """After a pod's volume `unmounted` is gone: empty its tier directory if it was the server's (the
        writable one), remove it if no pod's volume shows it any more."""
        tier_dir = next(
            (m.path for m in mount_table() if m.device == unmounted.device and m.path.startswith(self._under_state)),
            None,
        )
        if tier_dir is None:
            return  # not one of ours (or already gone)
        if not unmounted.read_only:
            _empty(tier_dir)
        self.discard_if_unused(tier_dir)

    def discard_if_unused(self, tier_dir: str) -> None:
        """Unmount and remove `tier_dir` when no pod's volume shows it (also after a publish that failed)."""
        mounted = mount_point(tier_dir)
        if mounted is None:
            return
        if any(m.device == mounted.device and m.path.startswith(self._under_pods) for m in mount_table()):
            return
        unmount(tier_dir)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(tier_dir)
        with contextlib.suppress(OSError):  # ENOTEMPTY: the namespace's other tiers remain
            os.rmdir(os.path.dirname(tier_dir))


def _directory(path: str, mode: int) -> None:
    """Create `path` (or find it) as a real directory owned by root with `mode`, never following a link."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(f"{path} exists and is not a directory; remove it")
    if info.st_uid != 0 or info.st_gid != 0:
        os.lchown(path, 0, 0)
    if stat.S_IMODE(info.st_mode) != mode:
        os.chmod(path, mode)  # mkdir's mode passes through the umask


def _empty(directory: str) -> None:
    """Remove everything in `directory` (a tier's tmpfs: nothing mounted below it, links not followed)."""
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
