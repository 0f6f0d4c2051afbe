"""The CSI node plugin `kv.strata.dev`: publishing an inline volume bind-mounts the node directory of the pod's
namespace and the volume's tier onto the pod's target path, so a KV server pod and the serving pods of one
KVCacheTier on one node share a directory (the server's Unix socket lives there) under restricted Pod Security,
which allows `csi` volumes but neither hostPath nor hostIPC.

The plugin also serves the kubelet's plugin-registration API on `<kubelet-dir>/plugins_registry/`, so the
kubelet finds it without a node-driver-registrar sidecar.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import wrappers_pb2

from . import csi_pb2, csi_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc
from .mounts import bind_mount, mount_point, unmount
from .tiers import TierDirectories, TierLimitError
from .volume import (
    DRIVER_NAME,
    POD_NAME,
    POD_NAMESPACE,
    TIER_ATTRIBUTE,
    VolumeRequestError,
    check_target_path,
    node_directory,
)

log = logging.getLogger("strata_kv.csi")

VENDOR_VERSION = "0.1.0"
CSI_VERSIONS = ["1.0.0"]  # what the kubelet's CSI client accepts (major version 1)
TARGET_DIR_MODE = 0o750


@dataclass
class PluginSettings:
    """Everything the plugin is told at start (`strata-kv-csi serve` flags); defaults are the chart's."""

    node_id: str
    kubelet_dir: str = "/var/lib/kubelet"
    state_dir: str = "/var/run/strata-kv"
    socket_group: int = 65532  # the runtime image's group, which the KV server runs as
    endpoint: str = ""  # the CSI socket; default <kubelet-dir>/plugins/kv.strata.dev/csi.sock
    registration_socket: str = ""  # default <kubelet-dir>/plugins_registry/kv.strata.dev-reg.sock
    register: bool = True  # serve the registration socket (off: a node-driver-registrar does it)
    tier_dir_bytes: int = 64 * 1024  # each tier directory's tmpfs: a socket needs an inode and no data
    tier_dir_inodes: int = 16  # its root, the socket, room for a server's restart
    max_tier_dirs: int = 256  # tier directories on one node at a time

    def __post_init__(self) -> None:
        self.endpoint = self.endpoint or os.path.join(self.kubelet_dir, "plugins", DRIVER_NAME, "csi.sock")
        self.registration_socket = self.registration_socket or os.path.join(
            self.kubelet_dir, "plugins_registry", f"{DRIVER_NAME}-reg.sock"
        )


def _refuse(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> Any:
    log.warning("refused (%s): %s", code.name, message)
    context.abort(code, message)


class WriterError(PermissionError):
    """A writable volume asked for by a pod that is not the tier's server (the gRPC answer is PERMISSION_DENIED)."""


class NodeVolumes:
    """Publish and unpublish, both idempotent (the kubelet retries either after a timeout)."""

    def __init__(self, settings: PluginSettings) -> None:
        self.settings = settings
        self.tiers = TierDirectories(settings)
        self._lock = threading.Lock()  # one mount change at a time: a retry never races its first attempt

    def publish(self, request: csi_pb2.NodePublishVolumeRequest) -> None:
        wanted = node_directory(dict(request.volume_context))
        target = check_target_path(request.target_path, self.settings.kubelet_dir)
        if request.volume_capability.HasField("block"):
            raise VolumeRequestError("volume_capability", "block access is not supported: the volume is a directory")
        if not request.readonly and not wanted.from_server:
            # Whoever may write there can replace the server's socket and take its clients' AUTH tokens.
            raise WriterError(
                f"readOnly: false is only for KVCacheTier {wanted.tier}'s server pods (named "
                f"{wanted.server_pod_prefix}<5 characters> by its DaemonSet), not pod {wanted.pod!r}; set "
                "readOnly: true on the csi volume (connecting to the socket needs no write access)"
            )
        with self._lock:
            source = self.tiers.acquire(wanted)
            try:
                self._bind(source, target, read_only=request.readonly)
            except BaseException:
                self.tiers.discard_if_unused(source)
                raise

    @staticmethod
    def _bind(source: str, target: str, *, read_only: bool) -> None:
        os.makedirs(target, mode=TARGET_DIR_MODE, exist_ok=True)
        existing = mount_point(target)
        if existing is not None:
            if _same_directory(target, source) and existing.read_only == read_only:
                return  # the same request again: already done
            raise FileExistsError(f"{target} is already published with other arguments (a different tier or readOnly)")
        bind_mount(source, target, read_only=read_only)

    def unpublish(self, target_path: str) -> None:
        target = check_target_path(target_path, self.settings.kubelet_dir)
        with self._lock:
            published = mount_point(target)
            if published is not None:
                unmount(target)
                self.tiers.release(published)
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(target)


def _same_directory(a: str, b: str) -> bool:
    sa, sb = os.stat(a), os.stat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


class IdentityService(csi_pb2_grpc.IdentityServicer):
    def GetPluginInfo(self, request: Any, context: Any) -> csi_pb2.GetPluginInfoResponse:
        return csi_pb2.GetPluginInfoResponse(name=DRIVER_NAME, vendor_version=VENDOR_VERSION)

    def GetPluginCapabilities(self, request: Any, context: Any) -> csi_pb2.GetPluginCapabilitiesResponse:
        return csi_pb2.GetPluginCapabilitiesResponse()  # a node plugin only: no controller service

    def Probe(self, request: Any, context: Any) -> csi_pb2.ProbeResponse:
        return csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=True))


class NodeService(csi_pb2_grpc.NodeServicer):
    def __init__(self, settings: PluginSettings) -> None:
        self.settings = settings
        self.volumes = NodeVolumes(settings)

    def NodePublishVolume(self, request: Any, context: Any) -> csi_pb2.NodePublishVolumeResponse:
        started = time.perf_counter()
        try:
            self.volumes.publish(request)
        except VolumeRequestError as error:
            return _refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except WriterError as error:
            return _refuse(context, grpc.StatusCode.PERMISSION_DENIED, str(error))
        except TierLimitError as error:
            return _refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))
        except FileExistsError as error:
            return _refuse(context, grpc.StatusCode.ALREADY_EXISTS, str(error))
        except OSError as error:
            return _refuse(context, grpc.StatusCode.INTERNAL, f"publishing {request.target_path}: {error}")
        log.info(
            "published %s for %s/%s (pod %s) on %s (%s) in %.1f ms",
            request.volume_id,
            request.volume_context.get(POD_NAMESPACE),
            request.volume_context.get(TIER_ATTRIBUTE),
            request.volume_context.get(POD_NAME),
            request.target_path,
            "ro" if request.readonly else "rw",
            (time.perf_counter() - started) * 1000,
        )
        return csi_pb2.NodePublishVolumeResponse()

    def NodeUnpublishVolume(self, request: Any, context: Any) -> csi_pb2.NodeUnpublishVolumeResponse:
        try:
            self.volumes.unpublish(request.target_path)
        except VolumeRequestError as error:
            return _refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except OSError as error:
            return _refuse(context, grpc.StatusCode.INTERNAL, f"unpublishing {request.target_path}: {error}")
        log.info("unpublished %s from %s", request.volume_id, request.target_path)
        return csi_pb2.NodeUnpublishVolumeResponse()

    def NodeGetCapabilities(self, request: Any, context: Any) -> csi_pb2.NodeGetCapabilitiesResponse:
        return csi_pb2.NodeGetCapabilitiesResponse()  # no staging, no stats: publish is one bind mount

    def NodeGetInfo(self, request: Any, context: Any) -> csi_pb2.NodeGetInfoResponse:
        return csi_pb2.NodeGetInfoResponse(node_id=self.settings.node_id)


@dataclass
class RegistrationService(pluginregistration_pb2_grpc.RegistrationServicer):
    """What the kubelet's plugin watcher asks a socket in plugins_registry/ before it calls the CSI endpoint."""

    settings: PluginSettings
    status: list[tuple[bool, str]] = field(default_factory=list)

    def GetInfo(self, request: Any, context: Any) -> pluginregistration_pb2.PluginInfo:
        return pluginregistration_pb2.PluginInfo(
            type="CSIPlugin", name=DRIVER_NAME, endpoint=self.settings.endpoint, supported_versions=CSI_VERSIONS
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> pluginregistration_pb2.RegistrationStatusResponse:
        self.status.append((request.plugin_registered, request.error))
        if request.plugin_registered:
            log.info("the kubelet registered %s", DRIVER_NAME)
        else:
            log.error("the kubelet did not register %s: %s", DRIVER_NAME, request.error)
        return pluginregistration_pb2.RegistrationStatusResponse()


UNIX_PATH_MAX = 107  # sun_path holds 108 bytes with the terminating NUL


def _listen(path: str) -> grpc.Server:
    if len(os.fsencode(path)) > UNIX_PATH_MAX:
        raise SystemExit(f"strata-kv-csi: socket path {path} is over {UNIX_PATH_MAX} bytes; choose a shorter one")
    os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
    if os.path.lexists(path):
        os.unlink(path)  # a socket left by a previous run: nobody listens on it any more
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_insecure_port(f"unix://{path}")
    return server


class Plugin:
    """The CSI endpoint and (optionally) the registration socket, each its own gRPC server."""

    def __init__(self, settings: PluginSettings) -> None:
        self.settings = settings
        self.registration = RegistrationService(settings)
        self._csi = _listen(settings.endpoint)
        csi_pb2_grpc.add_IdentityServicer_to_server(IdentityService(), self._csi)
        csi_pb2_grpc.add_NodeServicer_to_server(NodeService(settings), self._csi)
        self._registrar: grpc.Server | None = None
        if settings.register:
            self._registrar = _listen(settings.registration_socket)
            pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(self.registration, self._registrar)

    def start(self) -> None:
        self._csi.start()
        if self._registrar is not None:  # only once the endpoint it names answers
            self._registrar.start()

    def stop(self, grace: float = 5.0) -> None:
        """Registration socket first: the kubelet deregisters the driver when it disappears."""
        if self._registrar is not None:
            self._registrar.stop(grace).wait()
            _remove(self.settings.registration_socket)
        self._csi.stop(grace).wait()
        _remove(self.settings.endpoint)

    def wait(self) -> None:
        self._csi.wait_for_termination()


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
