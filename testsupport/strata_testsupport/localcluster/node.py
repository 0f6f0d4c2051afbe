"""A real node beside the control plane: containerd 2 (strata_testsupport.localcluster.containerd), a kubelet,
kube-proxy (iptables) and CoreDNS, so the pods Strata renders run for real with the images built here
(hack/node/build-images.sh), and mount images from a registry on the node's address as image volumes.

Networking stays on this machine. The node's address, `NODE_IP`, lives on the loopback device only: the API
server, the kubelet, cluster DNS and the tests' servers (S3) listen there, so pods reach them through their
bridge gateway while nothing outside the machine can. Pods get `POD_CIDR` on the bridge `BRIDGE`.

Everything the node creates is found again by a sweep (processes by the paths in their command lines, cgroups
under `CGROUP_ROOT`, mounts and network namespaces under `WORK_DIR`, the bridge, kube-proxy's chains, the
loopback address), which runs before start and after stop, so an interrupted run leaves nothing for the next.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from strata_testsupport.localcluster.binaries import cache_dir
from strata_testsupport.localcluster.cluster import LocalCluster, http_ok
from strata_testsupport.localcluster.containerd import BUILD_SCRIPT as CONTAINERD_BUILD_SCRIPT
from strata_testsupport.localcluster.containerd import ContainerdLayout, find_containerd, render_config, trust_registry
from strata_testsupport.localcluster.processes import ManagedProcess, Started, StartupError, wait_ready
from strata_testsupport.processes import free_port

NODE_NAME = "strata-node"
NODE_IP = "10.84.0.1"
POD_CIDR = "10.85.0.0/24"
BRIDGE = "strata0"
WORK_DIR = Path("/var/lib/strata-node")
CGROUP_ROOT = "strata-node"
CLUSTER_DOMAIN = "cluster.local"
PAUSE_IMAGE = "localhost/strata-pause:1"
REPO_ROOT = Path(__file__).resolve().parents[3]
IMAGES_SCRIPT = REPO_ROOT / "hack" / "node" / "build-images.sh"
SERVING_IMAGE_SCRIPT = REPO_ROOT / "hack" / "node" / "build-serving-image.sh"
SERVING_IMAGE = "localhost/strata-vllm:cpu"
"""vLLM on CPU with Strata's vLLM packages (images/vllm-cpu/Dockerfile); imported only by the tests that serve."""
STOCK_VLLM_IMAGE = "localhost/vllm-cpu:stock"
"""The same vLLM with nothing of Strata's (the Dockerfile's `stock` stage): a user's own vLLM image."""
CNI_BIN_DIR = Path("/usr/lib/cni")
# Kernel settings a node needs for Services to reach pods on the same bridge; restored on stop.
SYSCTLS = {"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"}


class NodeUnavailable(RuntimeError):
    """This machine cannot run the real node; the message says what is missing and how to get it."""


@dataclass(frozen=True)
class NodeBinaries:
    kubelet: Path
    kube_proxy: Path
    coredns: Path
    containerd: Path
    containerd_shim: Path
    ctr: Path


def find_node_binaries() -> NodeBinaries:
    """The node's programs: kubelet, kube-proxy, CoreDNS and containerd 2 (with its shim and ctr) from the build
    cache; runc, iptables and the CNI plugins from Debian."""
    if os.geteuid() != 0:
        raise NodeUnavailable("the real node needs root (containers, mounts, network namespaces, iptables)")
    built = cache_dir()
    missing = [name for name in ("kubelet", "kube-proxy", "coredns") if not os.access(built / name, os.X_OK)]
    if missing:
        raise NodeUnavailable(f"{', '.join(missing)} not in {built}; build with `make setup` (hack/build-node.sh)")
    containerd = find_containerd()
    if containerd is None:
        raise NodeUnavailable(f"containerd 2 is not built; build with `make setup` ({CONTAINERD_BUILD_SCRIPT.name})")
    system = {name: shutil.which(name) for name in ("runc", "iptables")}
    absent = [name for name, path in system.items() if path is None]
    if absent or not (CNI_BIN_DIR / "bridge").exists():
        what = ", ".join(absent + ([] if (CNI_BIN_DIR / "bridge").exists() else ["CNI plugins"]))
        raise NodeUnavailable(f"{what} missing; `make setup` installs them (hack/setup-system.sh)")
    return NodeBinaries(
        kubelet=built / "kubelet",
        kube_proxy=built / "kube-proxy",
        coredns=built / "coredns",
        containerd=containerd.containerd,
        containerd_shim=containerd.shim,
        ctr=containerd.ctr,
    )


def node_images_archive() -> Path:
    """The archive of the node's images for the tree as it is now, built when missing (minutes the first time)."""
    return _built_archive(IMAGES_SCRIPT, "the node's images")


def serving_image_archive() -> Path:
    """The serving image's archive (`SERVING_IMAGE`), built when missing: about 10 minutes the first time (vLLM is
    installed into it), a few minutes after a change to Strata's packages."""
    return _built_archive(SERVING_IMAGE_SCRIPT, "the serving image", env={"SERVING_IMAGE": SERVING_IMAGE})


def stock_vllm_image_archive() -> Path:
    """The stock vLLM image's archive (`STOCK_VLLM_IMAGE`), built when missing from the serving image's cached
    engine (about 10 minutes when even that is missing, a few minutes otherwise)."""
    env = {"STOCK_IMAGE": STOCK_VLLM_IMAGE}
    return _built_archive(SERVING_IMAGE_SCRIPT, "the stock vLLM image", env=env, args=("stock",))


def _built_archive(script: Path, what: str, env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> Path:
    result = subprocess.run(
        ["bash", str(script), *args], capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    if result.returncode != 0:
        raise NodeUnavailable(f"building {what} failed ({script}):\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def _run(*argv: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


def _share_work_dir() -> None:
    """Make WORK_DIR a shared mount, as systemd makes every mount of a node at boot (PID 1 here is not systemd, and
    `/` is private). The kubelet shares its own root dir, but a Bidirectional hostPath elsewhere (the socket
    driver's state dir) needs it too, or containerd refuses the container: "... is not a shared mount". The
    sweep unmounts it with everything else under WORK_DIR."""
    _run("mount", "--bind", str(WORK_DIR), str(WORK_DIR), check=True)
    _run("mount", "--make-rshared", str(WORK_DIR), check=True)


# -- the sweep: whatever a node (this run's or an interrupted one's) left behind ---------------------------------
def _node_pids() -> set[int]:
    """containerd's shims outlive containerd (they detach on purpose); container processes sit in our cgroups."""
    pids: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if str(WORK_DIR).encode() in (proc / "cmdline").read_bytes():
                pids.add(int(proc.name))
    for procs in Path("/sys/fs/cgroup").glob(f"*/{CGROUP_ROOT}/**/cgroup.procs"):
        with contextlib.suppress(OSError):
            pids.update(int(line) for line in procs.read_text().split())
    return pids


def _kill_node_processes() -> None:
    pids = _node_pids()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pids and time.monotonic() < deadline:
        pids = {pid for pid in pids if Path(f"/proc/{pid}").exists()}
        time.sleep(0.1)


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root`, deepest first (the order to unmount them in)."""
    prefix, mounts = str(root), []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].encode().decode("unicode_escape")
            if point == prefix or point.startswith(prefix + "/"):
                mounts.append(point)
    return sorted(mounts, key=len, reverse=True)


def _unmount_under(root: Path) -> None:
    for point in _mounts_under(root):
        _run("umount", "--lazy", point)


def _remove_cgroups() -> None:
    for controller in Path("/sys/fs/cgroup").iterdir():
        top = controller / CGROUP_ROOT
        if not top.is_dir():
            continue
        for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def _kube_chains() -> list[tuple[str, str, list[str], list[str]]]:
    """(tool, table, KUBE-* chains, the table's dump) wherever such chains exist."""
    found = []
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue
        for table in ("filter", "nat", "mangle"):
            dump = _run(f"{tool}-save", "-t", table).stdout.splitlines()
            chains = [line[1:].split()[0] for line in dump if line.startswith(":KUBE-")]
            if chains:
                found.append((tool, table, chains, dump))
    return found


def _remove_kube_chains() -> None:
    """The kubelet's own chains (KUBE-FIREWALL, canaries) and whatever `kube-proxy --cleanup` left."""
    for tool, table, chains, dump in _kube_chains():
        for line in dump:  # jumps from built-in chains first, then the chains themselves
            words = shlex.split(line)
            builtin_jump = words[:1] == ["-A"] and not words[1].startswith("KUBE-") and "-j" in words
            if builtin_jump and words[words.index("-j") + 1].startswith("KUBE-"):
                _run(tool, "-t", table, "-D", *words[1:])
        for chain in chains:
            _run(tool, "-t", table, "-F", chain)
        for chain in chains:
            _run(tool, "-t", table, "-X", chain)


def _create_cgroups() -> None:
    """The kubelet wants its cgroup root in every v1 hierarchy; a new cpuset starts empty, so copy the parent's."""
    for controller in Path("/sys/fs/cgroup").iterdir():
        if controller.name == "unified" or not controller.is_dir():
            continue
        top = controller / CGROUP_ROOT
        top.mkdir(exist_ok=True)
        if controller.name == "cpuset":
            for knob in ("cpuset.cpus", "cpuset.mems"):
                (top / knob).write_text((controller / knob).read_text())


def leftovers() -> list[str]:
    """What a node left on this machine (empty when clean): the sweep's checklist, for tests and diagnostics."""
    found = [f"process {pid}" for pid in sorted(_node_pids())]
    found += [f"mount {point}" for point in _mounts_under(WORK_DIR)]
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        found.append(f"bridge {BRIDGE}")
    found += [f"{tool} {table} {chain}" for tool, table, chains, _ in _kube_chains() for chain in chains]
    if f"{NODE_IP}/32" in _run("ip", "address", "show", "dev", "lo").stdout:
        found.append(f"address {NODE_IP} on lo")
    if WORK_DIR.exists():
        found.append(f"directory {WORK_DIR}")
    return found


def sweep(kube_proxy: Path | None = None) -> None:
    """Remove every trace of a node: processes, mounts, cgroups, the bridge, kube-proxy's rules, the address."""
    _kill_node_processes()
    _unmount_under(WORK_DIR)
    _remove_cgroups()
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        _run("ip", "link", "delete", BRIDGE)
    if kube_proxy is not None:
        _run(str(kube_proxy), "--cleanup", "--v=0")
    _remove_kube_chains()
    _run("ip", "address", "delete", f"{NODE_IP}/32", "dev", "lo")
    shutil.rmtree(WORK_DIR, ignore_errors=True)


# -- the node --------------------------------------------------------------------------------------------------
class RealNode(Started):
    """A control plane whose API server pods can reach, and one real node (`NODE_NAME`) registered with it.

    Use as a context manager: `stop()` is idempotent and sweeps. `cluster` is the LocalCluster (kubeconfig,
    server); kwok stays off here, so every pod scheduled in this cluster really runs.
    """

    active: RealNode | None = None  # the one node of this process (its addresses are fixed)

    def __init__(self, images: Path, *, binaries: NodeBinaries | None = None, startup_timeout: float = 180.0):
        self.binaries = binaries or find_node_binaries()
        self.images = images
        self.startup_timeout = startup_timeout
        self.cluster: LocalCluster | None = None
        self.processes: list[ManagedProcess] = []
        self.sysctls_before: dict[str, str] = {}
        self.timings: dict[str, float] = {}

    def start(self) -> None:
        RealNode.active = self
        sweep(self.binaries.kube_proxy)
        for directory in ("run", "containerd", "kubelet", "cni/net.d", "cni/ipam", "logs", "volumes", "control-plane"):
            (WORK_DIR / directory).mkdir(parents=True, exist_ok=True)
        self._phase("shared mounts", _share_work_dir)
        self._phase("network", self._host_network)
        _create_cgroups()
        self.cluster = LocalCluster(kwok=False, address=NODE_IP, parent_dir=WORK_DIR / "control-plane")
        self._phase("control plane", self.cluster.start)
        self._phase("containerd", self._start_containerd)
        self._phase("images", self._import_images)
        self._phase("kubelet", self._start_kubelet)
        self._phase("kube-proxy", self._start_kube_proxy)
        self._phase("dns", self._start_coredns)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        if self.cluster is not None:
            self.cluster.stop()
        sweep(self.binaries.kube_proxy)
        for key, value in self.sysctls_before.items():
            with contextlib.suppress(OSError):
                Path("/proc/sys", key).write_text(value)
        self.sysctls_before.clear()
        RealNode.active = None

    def _phase(self, name: str, step: Any) -> None:
        start = time.monotonic()
        step()
        self.timings[name] = round(time.monotonic() - start, 2)

    # -- components ------------------------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        assert self.cluster is not None
        return self.cluster.kubeconfig

    def _spawn(self, name: str, argv: list[str]) -> ManagedProcess:
        process = ManagedProcess(name, argv, WORK_DIR / "logs" / f"{name}.log")
        self.processes.append(process)
        return process

    def _host_network(self) -> None:
        _run("ip", "address", "add", f"{NODE_IP}/32", "dev", "lo", check=True)
        for key, value in SYSCTLS.items():
            path = Path("/proc/sys", key)
            try:
                self.sysctls_before[key] = path.read_text().strip()
                path.write_text(value)
            except OSError as error:
                raise NodeUnavailable(f"cannot set {key.replace('/', '.')}={value}: {error}") from error
        conflist = {
            "cniVersion": "1.0.0",
            "name": "strata-pods",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,  # pods talk only to this machine: nothing to masquerade
                    "hairpinMode": True,  # a pod reaching itself through its Service
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(WORK_DIR / "cni" / "ipam"),
                    },
                }
            ],
        }
        (WORK_DIR / "cni" / "net.d" / "10-strata.conflist").write_text(json.dumps(conflist, indent=2))

    @property
    def containerd(self) -> ContainerdLayout:
        return ContainerdLayout(WORK_DIR)

    @property
    def containerd_socket(self) -> Path:
        return self.containerd.socket

    def trust_registry(self, address: str, ca_file: Path | None) -> None:
        """Let this node pull from the registry at `address` (host:port): HTTPS trusting `ca_file`, or plain HTTP
        when there is none, for that address only."""
        trust_registry(self.containerd, address, ca_file)

    def _start_containerd(self) -> None:
        config = render_config(
            self.containerd,
            self.binaries.containerd_shim,
            pause_image=PAUSE_IMAGE,
            cni_bin_dir=CNI_BIN_DIR,
            cni_conf_dir=WORK_DIR / "cni" / "net.d",
        )
        path = WORK_DIR / "containerd.toml"
        path.write_text(config)
        containerd = self._spawn("containerd", [str(self.binaries.containerd), "--config", str(path)])
        self._wait(containerd, lambda: self._ctr("version").returncode == 0)

    def _ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        return _run(str(self.binaries.ctr), "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args)

    def _import_images(self) -> None:
        self.import_images(self.images)

    def import_images(self, archive: Path) -> None:
        """Add the images of a `docker save` archive (zstd-compressed when it ends in .zst) to the node's runtime,
        as a pull would; they go with the node's work dir."""
        argv = [str(self.binaries.ctr), "--address", str(self.containerd_socket), "--namespace", "k8s.io"]
        # Unpacked, a layer's compressed copy is garbage: the node keeps only the snapshots (the serving images
        # would otherwise hold their ~3 GB twice on this machine's disk).
        argv += [
            "images",
            "import",
            "--local",
            "--discard-unpacked-layers",
            "-" if archive.suffix == ".zst" else str(archive),
        ]
        with contextlib.ExitStack() as stack:
            stdin = None
            if archive.suffix == ".zst":
                unzstd = stack.enter_context(subprocess.Popen(["zstd", "-dc", str(archive)], stdout=subprocess.PIPE))
                stdin = unzstd.stdout
            result = subprocess.run(argv, stdin=stdin, capture_output=True, text=True)
            if stdin is not None:
                stdin.close()
        if result.returncode != 0:
            raise StartupError(f"ctr images import {archive} failed: {result.stderr.strip()}")

    def _start_kubelet(self) -> None:
        assert self.cluster is not None
        resolv = WORK_DIR / "resolv.conf"
        resolv.write_text(f"nameserver {NODE_IP}\n")
        self.kubelet_port = free_port()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # These hosts are cgroup v1 (hybrid) and PID 1 is not systemd.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{CGROUP_ROOT}",
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": NODE_IP,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.cluster.pki["ca_crt"])},
            },
            "authorization": {"mode": "Webhook"},
            "clusterDNS": [NODE_IP],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": str(resolv),
            "failSwapOn": False,
            # The images were imported, not pulled: never garbage-collect them.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "200Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "serializeImagePulls": False,
            "maxPods": 60,
            "volumePluginDir": str(WORK_DIR / "volume-plugins"),
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
        }
        path = WORK_DIR / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        kubelet = self._spawn(
            "kubelet",
            [
                str(self.binaries.kubelet),
                f"--config={path}",
                f"--kubeconfig={self.cluster.kubeconfig}",
                f"--root-dir={WORK_DIR / 'kubelet'}",
                f"--cert-dir={WORK_DIR / 'kubelet' / 'pki'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={NODE_IP}",
                "--v=1",
            ],
        )
        self._wait(kubelet, self._node_ready)

    def _node_ready(self) -> bool:
        assert self.cluster is not None
        status, body = self.cluster.api_get(f"/api/v1/nodes/{NODE_NAME}")
        if status != 200:
            return False
        conditions = json.loads(body).get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _start_kube_proxy(self) -> None:
        assert self.cluster is not None
        metrics, health = free_port(), free_port()
        proxy = self._spawn(
            "kube-proxy",
            [
                str(self.binaries.kube_proxy),
                f"--kubeconfig={self.cluster.kubeconfig}",
                f"--hostname-override={NODE_NAME}",
                "--proxy-mode=iptables",
                f"--cluster-cidr={POD_CIDR}",
                f"--bind-address={NODE_IP}",
                f"--metrics-bind-address=127.0.0.1:{metrics}",
                f"--healthz-bind-address=127.0.0.1:{health}",
                # Leave the host's conntrack and localhost settings alone.
                "--conntrack-max-per-core=0",
                "--conntrack-tcp-timeout-established=0s",
                "--conntrack-tcp-timeout-close-wait=0s",
                "--iptables-localhost-nodeports=false",
                "--v=1",
            ],
        )
        self._wait(proxy, lambda: http_ok(f"http://127.0.0.1:{health}/healthz"))

    def _start_coredns(self) -> None:
        assert self.cluster is not None
        health, ready = free_port(), free_port()
        corefile = WORK_DIR / "Corefile"
        corefile.write_text(
            f""".:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:{health}
    ready 127.0.0.1:{ready}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {self.cluster.kubeconfig} strata-local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
"""
        )
        coredns = self._spawn("coredns", [str(self.binaries.coredns), "-conf", str(corefile)])
        self._wait(coredns, lambda: http_ok(f"http://127.0.0.1:{ready}/ready"))

    def _wait(self, process: ManagedProcess, ready: Any) -> None:
        wait_ready(process, ready, self.startup_timeout)

    def logs(self, name: str, lines: int = 50) -> str:
        """The tail of one component's log (for failure messages)."""
        for process in self.processes:
            if process.name == name:
                return process.log_tail(lines)
        return ""
