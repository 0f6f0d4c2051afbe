"""`strata-loader compile` as the pod runs it: a subprocess per command, real directories, the engine's
environment. A restore never fails the engine (a miss exits 0 with its reason); a refused capture is one line and
exit status 1; `--follow` captures only once the compiler has written its last file (vLLM's completion file, or
inductor's cache entries where vLLM compiles nothing of its own); none of it needs torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import strata_loader
from strata_loader.contract import CompileCaptureReport, CompileRestoreReport
from strata_testsupport.compilecache import (
    AVX2_TARGET,
    COMPLETION_FILE,
    real_key,
    tree_bytes,
    write_engine_cache,
    write_torch_cache,
)

KEY = real_key()
SOURCES = [str(Path(strata_loader.__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[3] / "units")]
NO_TORCH = """
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "vllm"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)

sys.meta_path.insert(0, Refuse())
from strata_loader.cli import main
sys.exit(main(sys.argv[1:]))
"""
"""The CLI with torch and vLLM unimportable: the runtime image, where restore and capture may also run."""


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-c", NO_TORCH, "compile", *args]


def cli_env(vllm_cache_root: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR")}
    env["PYTHONPATH"] = os.pathsep.join([*SOURCES, os.environ.get("PYTHONPATH", "")])
    if vllm_cache_root is not None:
        env["VLLM_CACHE_ROOT"] = str(vllm_cache_root)
    return env


def compile_cli(*args: str, vllm_cache_root: Path | None = None) -> tuple[int, dict[str, Any], str]:
    r = subprocess.run(
        cli_command(*args), capture_output=True, text=True, env=cli_env(vllm_cache_root), timeout=120, check=False
    )
    lines = r.stdout.strip().splitlines()
    return r.returncode, json.loads(lines[-1]) if lines else {}, r.stderr


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "key.json"
    path.write_text(KEY.to_json())
    return path


def test_capture_then_restore_in_the_engines_environment(tmp_path: Path, key_file: Path) -> None:
    files = write_engine_cache(tmp_path / "engine")
    store = str(tmp_path / "store")
    rc, out, err = compile_cli("capture", "--store", store, "--key", str(key_file), vllm_cache_root=tmp_path / "engine")
    assert rc == 0, err
    assert out["event"] == "captured" and out["key"] == KEY.digest and out["files"] == len(files)
    report = CompileCaptureReport.from_log(json.dumps(out))  # what the operator reads from the sidecar's log
    assert report is not None and report.summary == KEY.summary and report.bytes == sum(map(len, files.values()))
    rc, out, err = compile_cli("restore", "--store", store, "--key", str(key_file), vllm_cache_root=tmp_path / "node")
    assert (rc, out["event"], out["files"]) == (0, "restored", len(files)), err
    assert tree_bytes(tmp_path / "node") == files
    rc, out, _ = compile_cli("list", "--store", store)
    assert [c["key"] for c in out["caches"]] == [KEY.digest] and out["used_bytes"] == sum(map(len, files.values()))


@pytest.mark.parametrize("case", ["no-store", "damaged-key-file", "other-cpu"])
def test_a_restore_miss_exits_0_with_its_reason(tmp_path: Path, key_file: Path, case: str) -> None:
    store = tmp_path / "store"
    if case == "damaged-key-file":
        key_file.write_text(KEY.to_json()[:30])
    if case == "other-cpu":
        write_engine_cache(tmp_path / "engine")
        rc, _, err = compile_cli(
            "capture", "--store", str(store), "--key", str(key_file), vllm_cache_root=tmp_path / "engine"
        )
        assert rc == 0, err
        key_file.write_text(real_key(target=AVX2_TARGET).to_json())
    rc, out, err = compile_cli("restore", "--store", str(store), "--key", str(key_file), vllm_cache_root=tmp_path / "n")
    assert rc == 0, err
    assert out["event"] == "miss"
    reason = {
        "no-store": "holds no compile cache yet",
        "damaged-key-file": "compile key: not JSON",
        "other-cpu": "target differs (this engine: 'x86_64:avx,avx2,f16c,fma,sse4_2 aten:AVX2'",
    }[case]
    assert reason in out["reason"]
    assert not (tmp_path / "n").exists() or tree_bytes(tmp_path / "n") == {}


def test_a_capture_through_a_link_is_refused_in_one_line(tmp_path: Path, key_file: Path) -> None:
    write_engine_cache(tmp_path / "engine")
    link = tmp_path / "engine" / "torch_compile_cache" / "passwd"
    link.symlink_to("/etc/passwd")
    rc, out, err = compile_cli(
        "capture", "--store", str(tmp_path / "store"), "--key", str(key_file), vllm_cache_root=tmp_path / "engine"
    )
    assert rc == 1 and out == {}
    assert err.strip().splitlines() == [
        f"strata-loader compile: error: {link} is a symlink; a compile cache holds only files and directories;"
        " not captured"
    ]


def test_a_capture_over_max_bytes_is_refused(tmp_path: Path, key_file: Path) -> None:
    files = write_engine_cache(tmp_path / "engine")
    size = sum(map(len, files.values()))
    rc, _, err = compile_cli(
        "capture",
        *("--store", str(tmp_path / "store"), "--key", str(key_file), "--max-bytes", str(size - 1)),
        vllm_cache_root=tmp_path / "engine",
    )
    assert rc == 1
    assert f"capturing {size} bytes would take the compile cache store" in err
    assert f"over its limit of {size - 1} (0 in use)" in err


def test_if_missing_leaves_a_stored_cache_alone(tmp_path: Path, key_file: Path) -> None:
    write_engine_cache(tmp_path / "engine")
    args = ("capture", "--store", str(tmp_path / "store"), "--key", str(key_file), "--if-missing")
    assert compile_cli(*args, vllm_cache_root=tmp_path / "engine")[1]["event"] == "captured"
    write_engine_cache(tmp_path / "engine", seed=3)
    assert compile_cli(*args, vllm_cache_root=tmp_path / "engine")[1]["event"] == "present"


def follow_then_finish(
    tmp_path: Path, key_file: Path, vllm_cache_root: Path, finish: Callable[[], dict[str, bytes]], *args: str
) -> dict[str, bytes]:
    """`compile capture --follow` into `tmp_path/store` (polling fast, a short quiet period) while the engine's
    output is incomplete: it must still be waiting after 3 s. Then `finish` writes the rest, and the capture must
    take all of it. Returns what `finish` wrote."""
    follow = subprocess.Popen(
        cli_command(
            "capture",
            *("--store", str(tmp_path / "store"), "--key", str(key_file), "--follow"),
            *("--quiet-seconds", "0.3", "--poll-seconds", "0.05", *args),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(vllm_cache_root),
    )
    try:
        with pytest.raises(subprocess.TimeoutExpired):  # stable, but the compiler has not written its last file
            follow.wait(timeout=3)
        files = finish()
        out, err = follow.communicate(timeout=120)
    finally:
        follow.kill()
        follow.wait()
    assert follow.returncode == 0, err
    event = json.loads(out.strip().splitlines()[-1])
    assert event["event"] == "captured" and event["files"] == len(files)
    return files


def test_follow_captures_only_once_the_compile_is_complete(tmp_path: Path, key_file: Path) -> None:
    engine = tmp_path / "engine"
    write_engine_cache(engine, complete=False)
    files = follow_then_finish(tmp_path, key_file, engine, lambda: write_engine_cache(engine))  # vllm_compile_cache.py
    rc, _, err = compile_cli(
        "restore", "--store", str(tmp_path / "store"), "--key", str(key_file), vllm_cache_root=tmp_path / "node"
    )
    assert rc == 0, err
    assert (tmp_path / "node" / COMPLETION_FILE).read_bytes() == files[COMPLETION_FILE]


def test_follow_captures_a_stock_torch_compile_once_inductor_has_written_its_entries(
    tmp_path: Path, key_file: Path
) -> None:
    """vLLM on CPU compiles with stock torch.compile: nothing under a directory of vLLM's own and no completion file
    of its own; inductor's cache entries in TORCHINDUCTOR_CACHE_DIR are what says the graph is compiled."""
    engine, inductor = tmp_path / "engine", tmp_path / "inductor"
    write_torch_cache(inductor, entries=False)  # kernels being built, no entry yet
    files = follow_then_finish(
        tmp_path, key_file, engine, lambda: write_torch_cache(inductor), "--inductor-cache-dir", str(inductor)
    )
    rc, out, err = compile_cli(
        "restore",
        *("--store", str(tmp_path / "store"), "--key", str(key_file)),
        *("--inductor-cache-dir", str(tmp_path / "node-inductor")),
        vllm_cache_root=tmp_path / "node",
    )
    assert (rc, out["event"]) == (0, "restored"), err
    assert tree_bytes(tmp_path / "node-inductor") == files


def test_follow_gives_up_without_a_complete_compile(tmp_path: Path, key_file: Path) -> None:
    write_engine_cache(tmp_path / "engine", complete=False)
    rc, out, err = compile_cli(
        "capture",
        *("--store", str(tmp_path / "store"), "--key", str(key_file), "--follow"),
        *("--quiet-seconds", "0", "--poll-seconds", "0.05", "--timeout-seconds", "0.5"),
        vllm_cache_root=tmp_path / "engine",
    )
    assert rc == 0, err
    assert out["event"] == "not-captured" and "no complete, stable compile output" in out["reason"]
    assert not (tmp_path / "store").exists() or list((tmp_path / "store").iterdir()) == []


def test_prune_removes_a_replaced_generation(tmp_path: Path, key_file: Path) -> None:
    store = str(tmp_path / "store")
    write_engine_cache(tmp_path / "engine")
    first = compile_cli("capture", "--store", store, "--key", str(key_file), vllm_cache_root=tmp_path / "engine")[1]
    write_engine_cache(tmp_path / "engine", seed=5)
    second = compile_cli("capture", "--store", store, "--key", str(key_file), vllm_cache_root=tmp_path / "engine")[1]
    assert first["generation"] != second["generation"]
    rc, out, _ = compile_cli("prune", "--store", store, "--grace-seconds", "0")
    assert rc == 0 and [Path(p).name for p in out["removed"]] == [first["generation"]]
    assert sorted(p.name for p in (tmp_path / "store" / KEY.digest).iterdir()) == ["CURRENT", second["generation"]]


def test_two_engines_capturing_one_key_at_once_leave_one_whole_cache(tmp_path: Path, key_file: Path) -> None:
    """Two first engines of a revision on two nodes, one shared store: the last rename wins, whole."""
    trees = {n: write_engine_cache(tmp_path / f"engine{n}", seed=n) for n in (1, 2)}
    runs = [
        subprocess.Popen(
            cli_command("capture", "--store", str(tmp_path / "store"), "--key", str(key_file)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(tmp_path / f"engine{n}"),
        )
        for n in (1, 2)
    ]
    results = [r.communicate(timeout=120) for r in runs]
    assert [r.returncode for r in runs] == [0, 0], [err for _, err in results]
    generations = {json.loads(out)["generation"]: n for (out, _), n in zip(results, (1, 2), strict=True)}
    rc, out, err = compile_cli(
        "restore", "--store", str(tmp_path / "store"), "--key", str(key_file), vllm_cache_root=tmp_path / "node"
    )
    assert rc == 0 and out["event"] == "restored", err
    assert tree_bytes(tmp_path / "node") == trees[generations[out["generation"]]]


def test_compile_key_without_vllm_is_one_line(tmp_path: Path) -> None:
    r = subprocess.run(
        cli_command("key", "--out", str(tmp_path / "key.json"), "--", "--model", str(tmp_path)),
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
    )
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "strata-loader compile: error: No module named 'torch' (blocked by the test)"
    ]
    assert not (tmp_path / "key.json").exists()


@pytest.mark.parametrize("stored", [True, False])
def test_a_restore_reports_its_hit_or_miss_in_the_termination_message(
    tmp_path: Path, key_file: Path, stored: bool
) -> None:
    """The restore init container's termination message is how the operator counts hits and misses."""
    store = str(tmp_path / "store")
    if stored:
        write_engine_cache(tmp_path / "engine")
        assert (
            compile_cli("capture", "--store", store, "--key", str(key_file), vllm_cache_root=tmp_path / "engine")[0]
            == 0
        )
    message = tmp_path / "termination-log"
    env = {**cli_env(tmp_path / "node"), "STRATA_TERMINATION_MESSAGE_PATH": str(message)}
    r = subprocess.run(
        cli_command("restore", "--store", store, "--key", str(key_file)), env=env, capture_output=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    report = CompileRestoreReport.from_termination_message(message.read_text())
    assert report is not None and report.key == KEY.digest and report.summary == KEY.summary
    assert report.event == ("restored" if stored else "miss")
    assert (report.reason is None) == stored


def test_a_capture_that_stays_waits_for_sigterm_even_after_a_refusal(tmp_path: Path, key_file: Path) -> None:
    """A native sidecar that exits is restarted by the kubelet: `--stay` keeps it until the pod stops it. The
    refusal is also a `refused` report on stdout, the line the operator reads from the sidecar's log."""
    proc = subprocess.Popen(
        cli_command("capture", "--store", str(tmp_path / "store"), "--key", str(key_file), "--stay"),
        env=cli_env(tmp_path / "empty"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()  # the refusal (nothing to capture) is said once, then it waits
    assert line.startswith("strata-loader compile: error:"), line
    assert proc.stdout is not None
    report = CompileCaptureReport.from_log(proc.stdout.readline())
    assert report is not None and report.event == "refused" and report.failed and report.key == KEY.digest
    assert report.reason is not None and "nothing to capture" in report.reason
    assert proc.poll() is None
    proc.terminate()
    assert proc.wait(timeout=60) == 0  # stopped; one that did not stay would have exited 1 by itself
