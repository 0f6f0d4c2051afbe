"""The CSI node plugin `kv.strata.dev`: publishing an inline volume bind-mounts the node directory of the pod's
namespace and the volume's tier onto the pod's target path, so a KV server pod and the serving pods of one
KVCacheTier on one node share a directory (the server's Unix socket lives there) under restricted Pod Security,
which allows `csi` volumes but neither hostPath nor hostIPC.

Nothing is published on a name's say-so: the API server tells the plugin who the pod is, whether the tier
exists, and whether the pod is the tier's server (identity.py); every path is opened without following a link
and mounted through its descriptor (fspath.py).

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
from .fspath import LinkInPathError, open_beneath, open_root, same_directory
from .fspath import read_only as fd_read_only
from .identity import NotAdmitted, TierMissing, admit
from .kubeapi import APIError, APISettings, KubeAPI
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
    max_tier_dirs_per_namespace: int = 16  # of those, what one namespace's tiers may hold
    api_server: str = ""  # default: the in-cluster API server ($KUBERNETES_SERVICE_HOST)
    api_token_file: str = ""  # default: the pod's service account token
    api_ca_file: str = ""  # default: the pod's service account CA

    def __post_init__(self) -> None:
        self.endpoint = self.endpoint or os.path.join(self.kubelet_dir, "plugins", DRIVER_NAME, "csi.sock")
        self.registration_socket = self.registration_socket or os.path.join(
            self.kubelet_dir, "plugins_registry", f"{DRIVER_NAME}-reg.sock"
        )


def _refuse(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> Any:
    log.warning("refused (%s): %s", code.name, message)
    context.abort(code, message)


class NodeVolumes:
    """Publish and unpublish, both idempotent (the kubelet retries either after a timeout)."""

    def __init__(self, settings: PluginSettings, api: KubeAPI) -> None:
        self.settings = settings
        self.api = api
        self.tiers = TierDirectories(settings)
        self._lock = threading.Lock()  # one mount change at a time: a retry never races its first attempt

    def _pods(self) -> int:
        return open_root(os.path.join(self.settings.kubelet_dir, "pods"))

    def publish(self, request: csi_pb2.NodePublishVolumeRequest) -> None:
        wanted = node_directory(dict(request.volume_context))
        target = check_target_path(request.target_path, self.settings.kubelet_dir)
        if request.volume_capability.HasField("block"):
            raise VolumeRequestError("volume_capability", "block access is not supported: the volume is a directory")
        # Whoever may write there can replace the server's socket and take its clients' AUTH tokens.
        admit(self.api, wanted, self.settings.node_id, writable=not request.readonly)
        pods = self._pods()
        try:
            parent = open_beneath(pods, os.path.dirname(target))
        finally:
            os.close(pods)
        try:
            with self._lock:
                source = self.tiers.acquire(wanted)
                try:
                    self._bind(source, parent, os.path.basename(target), read_only=request.readonly)
                except BaseException:
                    self.tiers.discard_if_unused(wanted.path(os.path.realpath(self.settings.state_dir)))
                    raise
                finally:
                    os.close(source)
        finally:
            os.close(parent)

    @staticmethod
    def _bind(source: int, parent: int, name: str, *, read_only: bool) -> None:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, TARGET_DIR_MODE, dir_fd=parent)  # never through a link: mkdirat does not follow one
        target = open_beneath(parent, name)
        try:
            again = same_directory(target, source) and fd_read_only(target) == read_only
            vacant = not same_directory(target, source) and os.fstat(target).st_dev == os.fstat(parent).st_dev
        finally:
            os.close(target)
        if again:
            return  # the same request again: already done
        if not vacant:
            raise FileExistsError(f"{name} is already published with other arguments (a different tier or readOnly)")
        bind_mount(source, parent, name, read_only=read_only)

    def unpublish(self, target_path: str) -> None:
        target = check_target_path(target_path, self.settings.kubelet_dir)
        name = os.path.basename(target)
        pods = self._pods()
        try:
            try:
                parent = open_beneath(pods, os.path.dirname(target))
            except FileNotFoundError:
                return  # nothing was ever published there
        finally:
            os.close(pods)
        try:
            with self._lock:
                self._unmount(parent, name, os.path.join(self._real_pods, target))
        finally:
            os.close(parent)

    @property
    def _real_pods(self) -> str:
        return os.path.join(os.path.realpath(self.settings.kubelet_dir), "pods")

    def _unmount(self, parent: int, name: str, literal: str) -> None:
        """Detach what the plugin mounted on `name` in `parent` (the mount table's entry at `literal`, which no
        link can redirect since `parent` was opened without following any), then remove the directory."""
        try:
            mounted = open_beneath(parent, name)
        except FileNotFoundError:
            return
        except LinkInPathError:
            os.unlink(name, dir_fd=parent)  # a link where the target was: nothing of ours is there; never follow it
            return
        try:
            published = mount_point(literal)
            if published is not None:
                unmount(mounted)
        finally:
            os.close(mounted)
        if published is not None:
            self.tiers.release(published)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(name, dir_fd=parent)


class IdentityService(csi_pb2_grpc.IdentityServicer):
    def GetPluginInfo(self, request: Any, context: Any) -> csi_pb2.GetPluginInfoResponse:
        return csi_pb2.GetPluginInfoResponse(name=DRIVER_NAME, vendor_version=VENDOR_VERSION)

    def GetPluginCapabilities(self, request: Any, context: Any) -> csi_pb2.GetPluginCapabilitiesResponse:
        return csi_pb2.GetPluginCapabilitiesResponse()  # a node plugin only: no controller service

    def Probe(self, request: Any, context: Any) -> csi_pb2.ProbeResponse:
        return csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=True))


class NodeService(csi_pb2_grpc.NodeServicer):
    def __init__(self, settings: PluginSettings, api: KubeAPI) -> None:
        self.settings = settings
        self.volumes = NodeVolumes(settings, api)

    def NodePublishVolume(self, request: Any, context: Any) -> csi_pb2.NodePublishVolumeResponse:
        started = time.perf_counter()
        try:
            self.volumes.publish(request)
        except VolumeRequestError as error:
            return _refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except LinkInPathError as error:
            return _refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"target_path: {error.strerror}")
        except NotAdmitted as error:
            return _refuse(context, grpc.StatusCode.PERMISSION_DENIED, str(error))
        except TierMissing as error:
            return _refuse(context, grpc.StatusCode.NOT_FOUND, str(error))
        except APIError as error:
            return _refuse(context, grpc.StatusCode.UNAVAILABLE, f"asking the API server who the pod is: {error}")
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
        except LinkInPathError as error:
            return _refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"target_path: {error.strerror}")
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
        api = KubeAPI(APISettings.in_cluster(settings.api_server, settings.api_token_file, settings.api_ca_file))
        csi_pb2_grpc.add_NodeServicer_to_server(NodeService(settings, api), self._csi)
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
