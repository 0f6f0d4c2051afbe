"""The runtime image ships neither torch nor safetensors: `fetch`, `verify` and `shard` run without them, and
`bench`, which needs torch, says so in one line. Each CLI run here is a fresh interpreter whose import system
refuses both packages and reports every attempt to import them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import strata_loader
import torch
from safetensors.torch import load_file as reference_load_file
from safetensors.torch import save_file

BLOCKED = ("torch", "safetensors")
RUN_BLOCKED = f"""
import json, sys

attempts = []

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {BLOCKED!r}:
            attempts.append(name)
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, Refuse())
code = 0
try:
    from strata_loader.cli import main

    if sys.argv[1:]:
        code = main(sys.argv[1:])
finally:
    print("blocked imports: " + json.dumps(attempts), file=sys.stderr)
sys.exit(code)
"""


def run_blocked(*args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run `strata-loader ARGS` with torch and safetensors unimportable; also returns the refused imports."""
    here = str(Path(strata_loader.__file__).resolve().parents[1])  # this checkout's loader, not an install
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", RUN_BLOCKED, *args], capture_output=True, text=True, env=env, timeout=120)
    lines = r.stderr.splitlines()
    assert lines and lines[-1].startswith("blocked imports: "), r.stderr
    attempts = json.loads(lines[-1].removeprefix("blocked imports: "))
    r.stderr = "\n".join(lines[:-1])
    return r, attempts


def raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def make_model(root: Path) -> dict[str, torch.Tensor]:
    root.mkdir(parents=True)
    gen = torch.Generator().manual_seed(11)
    full = {
        "model.embed_tokens.weight": torch.randn(32, 8, generator=gen).to(torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 8, generator=gen).to(torch.float8_e4m3fn),
        "model.layers.0.self_attn.k_proj.weight": torch.randn(3, 8, generator=gen).to(torch.float16),
        "model.layers.0.self_attn.o_proj.weight": torch.randn(8, 16, generator=gen).to(torch.bfloat16),
        "model.layers.0.mlp.down_proj.weight": torch.randn(8, 32, generator=gen),
        "model.norm.weight": torch.randn(8, generator=gen),
        "lm_head.weight": torch.randn(32, 8, generator=gen).to(torch.float16),
    }
    names = sorted(full)
    save_file({n: full[n] for n in names[:4]}, root / "model-00001-of-00002.safetensors", metadata={"format": "pt"})
    save_file({n: full[n] for n in names[4:]}, root / "model-00002-of-00002.safetensors", metadata={"format": "pt"})
    (root / "config.json").write_text('{"model_type": "llama"}')
    return full


def assert_rank_slices(out: Path, full: dict[str, torch.Tensor], tp: int) -> None:
    """Every rank's files hold, bit for bit, torch's slice of each split tensor and all of the others."""
    from strata_loader.tensor.shard import rank_files, shard_dim

    for rank in range(tp):
        got: dict[str, torch.Tensor] = {}
        for f in rank_files(out, rank):
            got.update(reference_load_file(f))
        assert sorted(got) == sorted(full)
        for name, t in full.items():
            dim = shard_dim(name, t.shape, tp)
            want = t if dim is None else torch.chunk(t, tp, dim)[rank]
            assert (got[name].dtype, got[name].shape) == (want.dtype, want.shape), name
            assert raw(got[name]) == raw(want), name


def test_importing_the_cli_imports_neither_torch_nor_safetensors():
    r, attempts = run_blocked()
    assert r.returncode == 0, r.stderr
    assert attempts == []


def test_shard_without_torch_writes_torchs_slices(tmp_path):
    full = make_model(tmp_path / "model")
    r, attempts = run_blocked(
        "shard", str(tmp_path / "model"), "--tp", "2", "--max-part-bytes", "600", "--out", str(tmp_path / "out")
    )
    assert r.returncode == 0, r.stderr
    assert attempts == []
    event = json.loads(r.stdout)
    assert event["event"] == "sharded" and event["tp"] == 2
    assert [Path(f).name for f in event["files"]] == sorted(p.name for p in (tmp_path / "out").iterdir())
    assert len(event["files"]) > 2  # the cap made several parts
    assert_rank_slices(tmp_path / "out", full, 2)


def test_fetch_with_shard_and_verify_without_torch(tmp_path):
    full = make_model(tmp_path / "src")
    r, attempts = run_blocked(
        "fetch",
        str(tmp_path / "src"),
        str(tmp_path / "dst"),
        "--progress",
        "none",
        "--verify",
        "checksums",
        "--shard-tp",
        "2",
    )
    assert r.returncode == 0, r.stderr
    assert attempts == []
    assert json.loads(r.stdout.splitlines()[-1])["event"] == "done"
    for f in (tmp_path / "src").iterdir():
        assert (tmp_path / "dst" / f.name).read_bytes() == f.read_bytes()
    assert_rank_slices(tmp_path / "dst" / "sharded", full, 2)

    r, attempts = run_blocked("verify", str(tmp_path / "dst"))
    assert r.returncode == 0, r.stderr
    assert attempts == []
    assert r.stdout.strip().endswith("; 4 safetensors file(s) valid")  # 2 copied, 2 rank parts


def test_bench_without_torch_says_what_to_install_in_one_line(tmp_path):
    make_model(tmp_path / "model")
    r, attempts = run_blocked("bench", str(tmp_path / "model" / "model-00001-of-00002.safetensors"))
    assert r.returncode == 1
    assert attempts
    assert r.stderr.count("\n") == 0 and "Traceback" not in r.stderr
    assert r.stderr.startswith("strata-loader bench: error: needs torch and safetensors")
    assert "pip install 'strata[tensor]'" in r.stderr
