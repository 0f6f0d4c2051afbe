"""The operator's command line and kopf settings."""

from __future__ import annotations

import datetime
from pathlib import Path

import kopf
import pytest
from strata_operator import cli, settings
from strata_operator.handlers import process


def test_run_defaults_to_all_namespaces_standalone_with_liveness() -> None:
    parser_args = ["run"]
    argv = _kopf_argv(parser_args)
    assert argv[:3] == ["run", "-m", "strata_operator.routes"]
    assert "--standalone" in argv and "--all-namespaces" in argv
    assert "--liveness=http://0.0.0.0:8080/healthz" in argv


def test_run_with_namespaces_and_peering() -> None:
    argv = _kopf_argv(["run", "-n", "a", "-n", "b", "--peering", "strata"])
    assert "--namespace=a" in argv and "--namespace=b" in argv
    assert "--peering=strata" in argv and "--standalone" not in argv and "--all-namespaces" not in argv


def _kopf_argv(args: list[str]) -> list[str]:
    captured: list[list[str]] = []

    def fake_kopf_main(*, args: list[str], **_: object) -> None:
        captured.append(args)

    import kopf.cli

    original = kopf.cli.main
    kopf.cli.main = fake_kopf_main  # type: ignore[assignment]
    try:
        assert cli.main(args) == 0
    finally:
        kopf.cli.main = original
    return captured[0]


def test_crds_check_detects_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["crds", "--output-dir", str(tmp_path)]) == 0
    assert cli.main(["crds", "--output-dir", str(tmp_path), "--check"]) == 0
    victim = next(tmp_path.glob("*.yaml"))
    victim.write_text(victim.read_text() + "# edited by hand\n")
    assert cli.main(["crds", "--output-dir", str(tmp_path), "--check"]) == 1
    assert victim.name in capsys.readouterr().err


def test_settings_name_finalizer_and_bounded_watches() -> None:
    operator_settings = kopf.OperatorSettings()
    process.configure(operator_settings, settings.Settings.from_env({}))
    assert operator_settings.persistence.finalizer == "strata.dev/finalizer"
    assert operator_settings.watching.server_timeout == process.WATCH_SERVER_TIMEOUT_SECONDS
    assert operator_settings.watching.client_timeout > operator_settings.watching.server_timeout
    assert operator_settings.posting.enabled


def _priority(env: dict[str, str]) -> int:
    operator_settings = kopf.OperatorSettings()
    process.configure(operator_settings, settings.Settings.from_env(env))
    return int(operator_settings.peering.priority)


def test_each_replica_gets_its_own_stable_peering_priority() -> None:
    first, again = _priority({"POD_ID": "strata-operator-abc"}), _priority({"POD_ID": "strata-operator-abc"})
    assert first == again > 0
    assert _priority({"POD_ID": "strata-operator-def"}) != first


def test_replicas_without_pod_id_on_one_host_do_not_tie() -> None:
    """Without POD_ID the priority came from the hostname alone: two replicas on one host tied, and kopf
    pauses every replica that ties at the top, so neither reconciled."""
    priorities = {_priority({}) for _ in range(5)}
    assert len(priorities) == 5


def test_settings_reject_an_unknown_pull_policy() -> None:
    with pytest.raises(ValueError, match="STRATA_RUNTIME_IMAGE_PULL_POLICY='Sometimes'"):
        settings.Settings.from_env({"STRATA_RUNTIME_IMAGE_PULL_POLICY": "Sometimes"})


OPERATOR_PACKAGE = Path(cli.__file__).parent


def test_webhook_access_defaults_and_checks() -> None:
    default = settings.Settings.from_env({}).webhook_access
    assert default == settings.WebhookAccess(None, (), 3 * 1024 * 1024, 8, 24)
    env = {
        settings.WEBHOOK_CLIENT_CA_ENV: "/etc/strata/webhook-client/ca.crt",
        settings.WEBHOOK_CLIENT_NAMES_ENV: "kube-apiserver-webhook-client, other",
        settings.WEBHOOK_MAX_CONCURRENT_ENV: "4",
    }
    access = settings.Settings.from_env(env).webhook_access
    assert access.client_names == ("kube-apiserver-webhook-client", "other") and access.max_concurrent == 4
    with pytest.raises(ValueError, match="STRATA_WEBHOOK_CLIENT_CA is not"):
        settings.Settings.from_env({settings.WEBHOOK_CLIENT_NAMES_ENV: "kube-apiserver"})
    with pytest.raises(ValueError, match="STRATA_WEBHOOK_MAX_QUEUED='0'"):
        settings.Settings.from_env({settings.WEBHOOK_MAX_QUEUED_ENV: "0"})


def test_only_the_settings_module_reads_the_environment() -> None:
    readers = {
        path.relative_to(OPERATOR_PACKAGE)
        for path in OPERATOR_PACKAGE.rglob("*.py")
        if "os.environ" in path.read_text() or "getenv(" in path.read_text()
    }
    assert readers == {Path("settings.py")}


NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)


def _peer(priority: int, seconds_ago: int = 1) -> dict[str, object]:
    lastseen = (NOW - datetime.timedelta(seconds=seconds_ago)).isoformat()
    return {"priority": priority, "lifetime": 60, "lastseen": lastseen}


def test_health_tells_active_standby_and_paused_replicas_apart() -> None:
    assert process.peering_verdict({"a": _peer(7), "b": _peer(3)}, 7, NOW) == (True, "active")
    assert process.peering_verdict({"a": _peer(7), "b": _peer(3)}, 3, NOW) == (True, "standby")
    healthy, message = process.peering_verdict({"a": _peer(5), "b": _peer(5)}, 5, NOW)
    assert not healthy and "none reconciles" in message
    # A peer whose keep-alive expired no longer pauses anyone.
    assert process.peering_verdict({"a": _peer(9, seconds_ago=600), "b": _peer(3)}, 3, NOW) == (True, "active")
