"""vLLM's own code, run on CPU in vLLM's own virtualenv (hack/build-vllm-venv.sh), never in the test process.

vLLM pins torch, numpy, protobuf and more than the main venv holds, so tests never import it: they run a script
with that venv's python in a subprocess and read its JSON result. The script sees the repo's `kvserver` (the
Strata tier, `strata_kv.vllm_tier`, and the stdlib-only client it uses) on PYTHONPATH, as a serving image would
see `pip install strata` without extras.
"""

from __future__ import annotations

import json
import os
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "hack" / "build-vllm-venv.sh"


@cache
def vllm_python() -> Path:
    """The venv's python: the build script prints it (building the venv first if it is missing, ~6 minutes;
    `make test`'s setup has built it by then)."""
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def vllm_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of a vLLM subprocess: CPU device, the repo's kvserver importable, nothing of the test venv's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(
        {
            "VLLM_TARGET_DEVICE": "cpu",
            "PYTHONPATH": str(REPO / "kvserver"),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
    )
    env.update(extra or {})
    return env


def run_vllm_script(
    script: Path, request: dict[str, Any], *, env: dict[str, str] | None = None, timeout: float = 300
) -> dict[str, Any]:
    """Run `script` with vLLM's python, `request` as JSON on stdin; return the JSON object it prints last.

    A script that fails, hangs past `timeout` or prints no JSON raises with its output, so the test shows why.
    """
    proc = subprocess.run(
        [str(vllm_python()), str(script)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=vllm_env(env),
        timeout=timeout,
        cwd=script.parent,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(
            f"{script.name} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n"
            f"{proc.stderr[-8000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1])
    return result
