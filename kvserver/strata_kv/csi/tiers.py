"""The node directories the plugin shares, one per (namespace, tier) with pods on this node: each is a small
tmpfs of its own mounted at `<state-dir>/<namespace>/<tier>`, so

- what may be written there is bounded (`tier_dir_bytes`, `tier_dir_inodes`: a socket needs one inode and no
  data), and no pod can grow the node's `/run` through it;
- the directory lives exactly as long as some pod's volume shows it: every bind mount of one tmpfs carries its
  device number, so the mount table says how many pods still use it, and the unpublish after which none does
  unmounts it, dropping whatever was written, and removes the directory;
- the server's unpublish empties it (a dead socket is no use to the tier's remaining clients, and a new server
  pod binds a fresh one in the same directory, which the clients' mounts still show); a client's never does;
- the number of them is bounded on the node (`max_tier_dirs`) and for each namespace
  (`max_tier_dirs_per_namespace`), so one namespace's tiers cannot take every slot from the others'.

State lives in the mount table only, so a restarted plugin picks up where the last one stopped (the chart
mounts the state dir with Bidirectional propagation, so the tmpfs mounts are the host's, not the plugin
container's).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Protocol

from .fspath import fd_path, open_beneath, open_root
from .mounts import MountPoint, mount_point, mount_table, mount_tmpfs, unmount
from .volume import NodeDirectory

# Setgid, so the socket the server creates keeps the directory's group, and nothing for others: only the
# socket group's members (the KV server, pods with it as a supplemental group).
TIER_DIR_MODE = 0o2770
NAMESPACE_DIR_MODE = 0o700  # only the plugin walks it; pods see only their tier's directory


class TierLimitError(OSError):
    """The node already holds `max_tier_dirs` tier directories, or the pod's namespace its share of them,
    `max_tier_dirs_per_namespace` (the gRPC answer is RESOURCE_EXHAUSTED)."""


class TierSettings(Protocol):
    kubelet_dir: str
    state_dir: str
    socket_group: int
    tier_dir_bytes: int
    tier_dir_inodes: int
    max_tier_dirs: int
    max_tier_dirs_per_namespace: int


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

    def _check_room(self, namespace: str) -> None:
        held = [m.path for m in mount_table() if m.path.startswith(self._under_state)]
        if len(held) >= self.settings.max_tier_dirs:
            raise TierLimitError(
                f"this node already shares {len(held)} tier directories (strata-kv-csi --max-tier-dirs "
                f"{self.settings.max_tier_dirs}); raise the limit (the chart's kvSocketDriver.maxTierDirs) or "
                "run fewer tiers' pods on this node"
            )
        mine = sum(1 for path in held if path.startswith(f"{self._under_state}{namespace}/"))
        if mine >= self.settings.max_tier_dirs_per_namespace:
            raise TierLimitError(
                f"namespace {namespace} already holds {mine} tier directories on this node, its share "
                f"(strata-kv-csi --max-tier-dirs-per-namespace {self.settings.max_tier_dirs_per_namespace}); "
                "run fewer of its tiers' pods on this node or raise the share (the chart's "
                "kvSocketDriver.maxTierDirsPerNamespace)"
            )

    def acquire(self, wanted: NodeDirectory) -> int:
        """A descriptor of the tier's directory (the root of its tmpfs), mounted now if no pod on the node has it
        yet; the caller closes it."""
        os.makedirs(self.settings.state_dir, mode=0o755, exist_ok=True)
        state = open_root(self._state_dir)
        try:
            with contextlib.suppress(FileNotFoundError):
                tier = open_beneath(state, f"{wanted.namespace}/{wanted.tier}")
                if mount_point(wanted.path(self._state_dir)) is not None:
                    return tier
                os.close(tier)
            self._check_room(wanted.namespace)
            namespace = _directory(state, wanted.namespace, NAMESPACE_DIR_MODE)
            try:
                tier = _directory(namespace, wanted.tier, NAMESPACE_DIR_MODE)  # the mount point
            finally:
                os.close(namespace)
            try:
                mount_tmpfs(
                    tier,
                    size=self.settings.tier_dir_bytes,
                    inodes=self.settings.tier_dir_inodes,
                    mode=TIER_DIR_MODE,
                    gid=self.settings.socket_group,
                )
            finally:
                os.close(tier)
            return open_beneath(state, f"{wanted.namespace}/{wanted.tier}")  # the tmpfs's root, above the mount point
        finally:
            os.close(state)

    def release(self, unmounted: MountPoint) -> None:
        """After a pod's volume `unmounted` is gone: empty its tier directory if it was the server's (the
        writable one) and no other server pod's volume still shows it, then remove it if no pod's volume shows
        it any more. A read-only volume's unpublish never empties it: only a server's socket is its to drop."""
        table = mount_table()
        tier_dir = next(
            (m.path for m in table if m.device == unmounted.device and m.path.startswith(self._under_state)), None
        )
        if tier_dir is None:
            return  # not one of ours (or already gone)
        writers = [
            m for m in table if m.device == unmounted.device and m.path.startswith(self._under_pods) and not m.read_only
        ]
        if not unmounted.read_only and not writers:
            _empty(tier_dir)
        self.discard_if_unused(tier_dir)

    def discard_if_unused(self, tier_dir: str) -> None:
        """Unmount and remove `tier_dir` when no pod's volume shows it (also after a publish that failed)."""
        mounted = mount_point(tier_dir)
        if mounted is None:
            return
        if any(m.device == mounted.device and m.path.startswith(self._under_pods) for m in mount_table()):
            return
        relative = os.path.relpath(tier_dir, self._state_dir)
        state = open_root(self._state_dir)
        try:
            tier = open_beneath(state, relative)
            try:
                unmount(tier)
            finally:
                os.close(tier)
            namespace = open_beneath(state, os.path.dirname(relative))
            try:
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(os.path.basename(relative), dir_fd=namespace)
            finally:
                os.close(namespace)
            with contextlib.suppress(OSError):  # ENOTEMPTY: the namespace's other tiers remain
                os.rmdir(os.path.dirname(relative), dir_fd=state)
        finally:
            os.close(state)


def _directory(parent: int, name: str, mode: int) -> int:
    """Create `name` in `parent` (or find it) as a real directory owned by root with `mode`, never following a
    link; its descriptor."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, mode, dir_fd=parent)
    fd = open_beneath(parent, name)
    try:
        info = os.fstat(fd)
        if info.st_uid != 0 or info.st_gid != 0:
            os.chown(fd_path(fd), 0, 0)
        if info.st_mode & 0o7777 != mode:
            os.chmod(fd_path(fd), mode)  # mkdir's mode passes through the umask
    except BaseException:
        os.close(fd)
        raise
    return fd


def _empty(directory: str) -> None:
    """Remove everything in `directory` (a tier's tmpfs: nothing mounted below it, links not followed)."""
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
