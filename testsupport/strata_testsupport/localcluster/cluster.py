"""Start and stop a local control plane on free loopback ports; always tear everything down."""

from __future__ import annotations

import json
import shutil
import ssl
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from strata_testsupport.localcluster.binaries import ControlPlaneBinaries, find_binaries
from strata_testsupport.localcluster.pki import CONTROLLER_MANAGER_USER, write_pki
from strata_testsupport.localcluster.processes import ManagedProcess, Started, wait_ready
from strata_testsupport.processes import free_port

FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
SERVICE_CIDR = "10.0.0.0/24"
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"], "verbs": ["list", "watch"]},
        {"level": "None"},
    ],
}
"""What the API server records (`LocalCluster.audit_events`): which lists and watches service accounts made and
how they were answered, so a test can wait for an operator's watches to have started instead of sleeping."""


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class LocalCluster(Started):
    """etcd + kube-apiserver (+ controller-manager, scheduler, kwok) as child processes.

    Use as a context manager; `stop()` is idempotent and removes the work directory.
    """

    def __init__(
        self,
        *,
        controller_manager: bool = True,
        scheduler: bool = True,
        kwok: bool = True,
        binaries: ControlPlaneBinaries | None = None,
        startup_timeout: float = 120.0,
        address: str = "127.0.0.1",
        parent_dir: Path | None = None,
        service_account_credentials: bool = False,
    ) -> None:
        """`address` is where the API server listens: loopback, unless pods of a real node must reach it.
        `parent_dir` holds the work directory (the system's temp dir by default): a real node puts it under its
        own, so the sweep after a killed owner removes it too. The controller manager authenticates as
        `system:kube-controller-manager`; its controllers act as that user too, unless
        `service_account_credentials` (kubeadm's setting) gives each its own service account in kube-system
        (`controller_user("daemon-set-controller")`)."""
        self.binaries = binaries or find_binaries()
        self.want_controller_manager = controller_manager and self.binaries.kube_controller_manager is not None
        self.want_scheduler = scheduler and self.binaries.kube_scheduler is not None
        self.want_kwok = kwok and self.binaries.kwok is not None and self.binaries.kwok_stages is not None
        self.startup_timeout = startup_timeout
        self.workdir = Path(tempfile.mkdtemp(prefix="strata-cp-", dir=parent_dir))
        self.processes: list[ManagedProcess] = []
        self.address = address
        self.api_port = free_port()
        self.server = f"https://{address}:{self.api_port}"
        self.kubeconfig = self.workdir / "kubeconfig"
        self.controller_manager_kubeconfig = self.workdir / "controller-manager.kubeconfig"
        self.service_account_credentials = service_account_credentials
        self.pki: dict[str, Path] = {}
        self.audit_log = self.workdir / "audit.log"

    def controller_user(self, controller: str) -> str:
        """The user the API server sees when `controller` (e.g. `daemon-set-controller`) creates an object."""
        if self.service_account_credentials:
            return f"system:serviceaccount:kube-system:{controller}"
        return CONTROLLER_MANAGER_USER

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> None:
        self.pki = write_pki(self.workdir, self.address)
        self._write_kubeconfig(self.kubeconfig, "strata-admin", "admin")
        self._write_kubeconfig(self.controller_manager_kubeconfig, CONTROLLER_MANAGER_USER, "controller_manager")
        self._write_admission_config()
        (self.workdir / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))
        self._start_etcd()
        self._start_apiserver()
        if self.want_controller_manager:
            self._start_controller_manager()
        if self.want_scheduler:
            self._start_scheduler()
        if self.want_kwok:
            self._start_kwok()

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # -- components ------------------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> ManagedProcess:
        process = ManagedProcess(name, argv, self.workdir / f"{name}.log")
        self.processes.append(process)
        return process

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        etcd = self._spawn(
            "etcd",
            [
                str(self.binaries.etcd),
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._wait(etcd, lambda: http_ok(f"{self.etcd_url}/health"))

    def _start_apiserver(self) -> None:
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(self.binaries.kube_apiserver),
                f"--etcd-servers={self.etcd_url}",
                f"--secure-port={self.api_port}",
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={self.pki['server_crt']}",
                f"--tls-private-key-file={self.pki['server_key']}",
                f"--client-ca-file={self.pki['ca_crt']}",
                # The client certificate the API server presents to admission webhooks.
                f"--admission-control-config-file={self.workdir / 'admission.yaml'}",
                # Logs and exec on a real node's kubelet (which authorizes the admin identity).
                f"--kubelet-client-certificate={self.pki['admin_crt']}",
                f"--kubelet-client-key={self.pki['admin_key']}",
                "--kubelet-preferred-address-types=InternalIP",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={self.pki['sa_pub']}",
                f"--service-account-signing-key-file={self.pki['sa_key']}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=RBAC",
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
                # A loopback advertise address cannot back the `kubernetes` Service endpoints; any other can.
                f"--endpoint-reconciler-type={'none' if self.address == '127.0.0.1' else 'lease'}",
                "--profiling=false",
                f"--audit-policy-file={self.workdir / 'audit-policy.yaml'}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                "--v=1",
            ],
        )
        self._wait(apiserver, lambda: self._api_ok("/readyz"))

    def _component_flags(self, kubeconfig: Path | None = None) -> list[str]:
        kubeconfig = kubeconfig or self.kubeconfig
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            f"--cert-dir={self.workdir / 'component-certs'}",
        ]

    def _start_controller_manager(self) -> None:
        assert self.binaries.kube_controller_manager is not None
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.kube_controller_manager),
                *self._component_flags(self.controller_manager_kubeconfig),
                "--controllers=*",
                f"--service-account-private-key-file={self.pki['sa_key']}",
                f"--root-ca-file={self.pki['ca_crt']}",
                f"--use-service-account-credentials={str(self.service_account_credentials).lower()}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--concurrent-gc-syncs=5",
                "--v=1",
            ],
        )
        # The garbage collector and the default service account are what tests depend on.
        self._wait(self.processes[-1], lambda: self._default_service_account_exists())

    def _start_scheduler(self) -> None:
        assert self.binaries.kube_scheduler is not None
        self._spawn("kube-scheduler", [str(self.binaries.kube_scheduler), *self._component_flags(), "--v=1"])

    def _start_kwok(self) -> None:
        assert self.binaries.kwok is not None
        self._spawn(
            "kwok",
            [
                str(self.binaries.kwok),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={self.binaries.kwok_stages}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.240.0.1",
                f"--server-address=127.0.0.1:{free_port()}",
            ],
        )

    # -- readiness -------------------------------------------------------------------------------------------
    def _wait(self, process: ManagedProcess, ready: Any) -> None:
        wait_ready(process, ready, self.startup_timeout)

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki["ca_crt"]))
        context.load_cert_chain(str(self.pki["admin_crt"]), str(self.pki["admin_key"]))
        return context

    def api_get(self, path: str) -> tuple[int, bytes]:
        """A raw GET against the API server as the admin user (for readiness checks and diagnostics)."""
        try:
            with urllib.request.urlopen(f"{self.server}{path}", context=self._ssl_context(), timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()
        except (urllib.error.URLError, OSError):
            return 0, b""

    def audit_events(self, user: str) -> list[dict[str, Any]]:
        """The lists and watches `user` (a service account) made so far, as the API server recorded them
        (`AUDIT_POLICY`): each with `verb`, `stage`, `objectRef` and `responseStatus.code`."""
        if not self.audit_log.exists():
            return []
        events = []
        text = self.audit_log.read_text()
        complete = text[: text.rfind("\n") + 1]  # a line the API server is still writing is read next time
        for line in complete.splitlines():
            event = json.loads(line)
            if (event.get("user") or {}).get("username") == user:
                events.append(event)
        return events

    def _api_ok(self, path: str) -> bool:
        return self.api_get(path)[0] == 200

    def _default_service_account_exists(self) -> bool:
        return self._api_ok("/api/v1/namespaces/default/serviceaccounts/default")

    # -- client configuration --------------------------------------------------------------------------------
    def _write_admission_config(self) -> None:
        """The API server calls every admission webhook (user `*`: any host) with the `webhook_client_*` pair,
        as a cluster that authenticates itself to webhooks does (`WEBHOOK_CLIENT_NAME`, signed by the CA)."""
        webhooks_kubeconfig = self.workdir / "admission-webhooks.kubeconfig"
        user = {
            "client-certificate": str(self.pki["webhook_client_crt"]),
            "client-key": str(self.pki["webhook_client_key"]),
        }
        webhooks_kubeconfig.write_text(
            yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "users": [{"name": "*", "user": user}]})
        )
        webhook_config = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "WebhookAdmissionConfiguration",
            "kubeConfigFile": str(webhooks_kubeconfig),
        }
        plugins = [
            {"name": plugin, "configuration": webhook_config}
            for plugin in ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")
        ]
        (self.workdir / "admission.yaml").write_text(
            yaml.safe_dump(
                {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration", "plugins": plugins}
            )
        )

    def _write_kubeconfig(self, path: Path, user: str, cert: str) -> None:
        """A kubeconfig for `user` with the `<cert>_crt`/`<cert>_key` client certificate."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "strata-local",
                    "cluster": {"server": self.server, "certificate-authority": str(self.pki["ca_crt"])},
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate": str(self.pki[f"{cert}_crt"]),
                        "client-key": str(self.pki[f"{cert}_key"]),
                    },
                }
            ],
            "contexts": [{"name": "strata-local", "context": {"cluster": "strata-local", "user": user}}],
            "current-context": "strata-local",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
