"""The operator's command line and kopf settings."""

from __future__ import annotations

from pathlib import Path

import kopf
import pytest
from strata_operator import cli, settings


def test_run_defaults_to_all_namespaces_standalone_with_liveness() -> None:
    parser_args = ["run"]
    argv = _kopf_argv(parser_args)
    assert argv[:3] == ["run", "-m", "strata_operator.handlers"]
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
    settings.configure(operator_settings)
    assert operator_settings.persistence.finalizer == "strata.dev/finalizer"
    assert operator_settings.watching.server_timeout == settings.WATCH_SERVER_TIMEOUT_SECONDS
    assert operator_settings.watching.client_timeout > operator_settings.watching.server_timeout
    assert operator_settings.posting.enabled


def test_each_replica_gets_its_own_stable_peering_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_ID", "strata-operator-abc")
    first, again = kopf.OperatorSettings(), kopf.OperatorSettings()
    settings.configure(first)
    settings.configure(again)
    assert first.peering.priority == again.peering.priority > 0
    monkeypatch.setenv("POD_ID", "strata-operator-def")
    other = kopf.OperatorSettings()
    settings.configure(other)
    assert other.peering.priority != first.peering.priority
