"""CLI flags override the config file; bad input exits with a readable message."""

from pathlib import Path

import pytest
import yaml
from strata_kv.cli import main


def test_flags_override_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"l1": {"size": "2GiB"}, "listen": {"port": 7000}}))
    assert main(["config", "--config", str(cfg), "--port", "6379", "--l2-dir", "/data/kv"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["listen"]["port"] == 6379
    assert out["l1"]["size"] == "2GiB"
    assert out["l2"]["fs"]["root_dir"] == "/data/kv"


def test_no_file_needed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--l1-size", "1GiB", "--eviction-policy", "lru"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["l1"] == {**out["l1"], "size": "1GiB", "eviction_policy": "lru"}


def test_bad_size_is_reported_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--l1-size", "lots"]) == 2
    err = capsys.readouterr().err
    assert "l1.size" in err and "'lots' must be a whole number of bytes" in err


def test_serve_without_a_bind_setting_listens_on_loopback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--port", "7000"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["listen"]["bind"] == "127.0.0.1" and out["metrics"]["bind"] == "127.0.0.1"
    assert main(["config", "--bind", "0.0.0.0", "--metrics-bind", "0.0.0.0"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["listen"]["bind"] == "0.0.0.0" and out["metrics"]["bind"] == "0.0.0.0"
