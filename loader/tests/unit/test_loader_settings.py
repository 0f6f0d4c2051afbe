"""The loader's tuning settings: read from the environment once, into one object, with a clear error for a value
that is not one (nothing reads them at import)."""

from __future__ import annotations

import pytest
from strata_loader import cli
from strata_loader.core import settings
from strata_loader.core.settings import LoaderSettings, SettingError


def test_defaults_and_the_environment() -> None:
    assert LoaderSettings.from_env({}) == LoaderSettings(hf_retries=8, s3_retries=8, peer_busy_seconds=10.0)
    env = {"STRATA_HF_RETRIES": "3", "STRATA_S3_RETRIES": " 5 ", "STRATA_PEER_BUSY_S": "0.5"}
    assert LoaderSettings.from_env(env) == LoaderSettings(hf_retries=3, s3_retries=5, peer_busy_seconds=0.5)


@pytest.mark.parametrize(
    ("name", "value"),
    [("STRATA_HF_RETRIES", "0"), ("STRATA_S3_RETRIES", "many"), ("STRATA_PEER_BUSY_S", "-1"),
     ("STRATA_PEER_BUSY_S", "nan")],
)  # fmt: skip
def test_a_value_that_is_not_one_names_the_variable(name: str, value: str) -> None:
    with pytest.raises(SettingError, match=name):
        LoaderSettings.from_env({name: value})


def test_they_are_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    previous = settings.configure(None)
    try:
        monkeypatch.setenv("STRATA_S3_RETRIES", "3")
        assert settings.current().s3_retries == 3
        monkeypatch.setenv("STRATA_S3_RETRIES", "4")
        assert settings.current().s3_retries == 3
    finally:
        settings.configure(previous)


def test_the_cli_refuses_a_bad_one_before_doing_anything(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    previous = settings.configure(None)
    try:
        monkeypatch.setenv("STRATA_S3_RETRIES", "zero")
        assert cli.main(["fetch", "s3://bucket/model", "/nonexistent/dest"]) == 2
        assert "STRATA_S3_RETRIES='zero'" in capsys.readouterr().err
    finally:
        settings.configure(previous)
