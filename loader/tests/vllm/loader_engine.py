"""The vLLM side of the loader plugin's tests and bench: run with vLLM's own python (strata_testsupport.vllm),
never imported by pytest (it imports vllm).

Reads JSON requests on stdin, one per line, and answers each with one `STRATA-RESULT` JSON line. vLLM finds the
plugin the way a serving image does, through the `vllm.general_plugins` entry point (the test puts a dist-info
made from pyproject.toml on the path), and builds every model with its own `get_model_loader` on CPU, inside
`set_current_vllm_config`, over a gloo process group.

Modes:
- `plugins`: which `vllm.general_plugins` entry points vLLM sees and what `--load-format strata` resolves to.
- `load`: loads `model_dir` with `--load-format strata` and, for reference, with vLLM's own `safetensors` loader
  from `reference_dir`; reports any parameter that differs, each loader's time and what the plugin read. With
  `tp_size` > 1 every rank runs in its own process (`worker`), each with its own `model_dir` (`model_dirs`).
- `error`: what building the loader and loading with `extra` raises.
- `filtered`: whether the loader is registered in a fresh process under each `VLLM_PLUGINS` value.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from vllm.config import set_current_vllm_config
from vllm.distributed import parallel_state
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader import get_model_loader

RESULT_MARK = "STRATA-RESULT "  # strata_testsupport.vllm.RESULT_MARK: vLLM logs to stdout too


def rendezvous_file() -> str:
    """A fresh file for torch.distributed's FileStore rendezvous (vLLM takes `file://` init methods as they are).

    Not a TCP port: a port picked free here and bound later by torch can be taken in between by any other process
    on a busy machine (EADDRINUSE). A file in a new directory cannot."""
    return str(Path(tempfile.mkdtemp(prefix="strata-dist-")) / "rendezvous")


def ensure_distributed(rank: int, world: int, rendezvous: str | None) -> None:
    """One gloo group per process, as a CPU worker has (tensor parallel over every rank)."""
    if parallel_state.model_parallel_is_initialized():
        return
    rendezvous = rendezvous or rendezvous_file()
    # vLLM 0.32's CPU communicator names its shared-memory group from this, which its CPU worker sets first.
    os.environ.setdefault("VLLM_DIST_IDENT", Path(rendezvous).parent.name)
    parallel_state.init_distributed_environment(
        world_size=world,
        rank=rank,
        distributed_init_method=f"file://{rendezvous}",
        local_rank=rank,
        backend="gloo",
    )
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)


def engine_config(model_dir: str, load_format: str, extra: dict[str, Any], tp_size: int) -> Any:
    """What `vllm serve <dir> --load-format <f> --model-loader-extra-config <json> -tp <n>` builds."""
    args = EngineArgs(
        model=model_dir,
        skip_tokenizer_init=True,
        load_format=load_format,
        model_loader_extra_config=extra,
        dtype="float32",
        max_model_len=256,
        tensor_parallel_size=tp_size,
        distributed_executor_backend="mp" if tp_size > 1 else None,
    )
    return args.create_engine_config()


def build(
    model_dir: str, load_format: str, extra: dict[str, Any], tp_size: int, rank: int = 0, rendezvous: str | None = None
) -> tuple[Any, Any, float]:
    config = engine_config(model_dir, load_format, extra, tp_size)
    with set_current_vllm_config(config):
        ensure_distributed(rank, tp_size, rendezvous)
        loader = get_model_loader(config.load_config)
        keep_loaded_weights(loader)
        start = time.perf_counter()
        model = loader.load_model(vllm_config=config, model_config=config.model_config)
        return model, loader, time.perf_counter() - start


def keep_loaded_weights(loader: Any) -> None:
    """Keep a copy of the model's weights as the loader left them (`loader.loaded_weights`), before vLLM's
    post-load processing: on CPU it repacks some linear weights (down_proj, o_proj) for its GEMM kernels, so the
    parameters after `load_model` no longer hold the files' bytes even when the load was exact."""
    load_weights = loader.load_weights

    def load_and_keep(model: torch.nn.Module, model_config: Any) -> None:
        load_weights(model, model_config)
        loader.loaded_weights = {n: t.detach().clone() for n, t in model.state_dict().items()}

    loader.load_weights = load_and_keep


def same_bytes(x: torch.Tensor, y: torch.Tensor) -> bool:
    x, y = x.detach().contiguous().reshape(-1), y.detach().contiguous().reshape(-1)
    return x.shape == y.shape and x.dtype == y.dtype and torch.equal(x.view(torch.uint8), y.view(torch.uint8))


def differences(a: torch.nn.Module, b: torch.nn.Module) -> list[str]:
    """Parameters whose bytes differ (or that only one model has)."""
    sa, sb = a.state_dict(), b.state_dict()
    return sorted(set(sa) ^ set(sb)) + [n for n in sorted(set(sa) & set(sb)) if not same_bytes(sa[n], sb[n])]


def file_differences(params: dict[str, torch.Tensor], directory: str) -> tuple[int, list[str]]:
    """Parameters stored under their checkpoint name (vLLM fuses q/k/v and gate/up; the rest keep theirs), as the
    loader left them, compared with the files' tensors as safetensors reads them: (how many compared, which differ)."""
    from safetensors.torch import load_file

    files: dict[str, torch.Tensor] = {}
    for f in sorted(Path(directory).glob("*.safetensors")):
        files.update(load_file(f))
    both = sorted(set(params) & set(files))
    return len(both), [n for n in both if not same_bytes(params[n], files[n])]


def load_one(request: dict[str, Any], rank: int) -> dict[str, Any]:
    tp = request.get("tp_size", 1)
    rendezvous = request.get("rendezvous")
    model_dir = request["model_dirs"][rank] if "model_dirs" in request else request["model_dir"]
    if request.get("reference_first"):  # the bench alternates which loader pays first-time costs
        reference, _, reference_s = build(request["reference_dir"], "safetensors", {}, tp, rank, rendezvous)
    strata, loader, strata_s = build(model_dir, "strata", request.get("extra", {}), tp, rank, rendezvous)
    if not request.get("reference_first"):
        reference, _, reference_s = build(request["reference_dir"], "safetensors", {}, tp, rank, rendezvous)
    compared, file_differ = file_differences(loader.loaded_weights, request["reference_dir"]) if tp == 1 else (0, [])
    return {
        "file_compared": compared,
        "file_differ": file_differ,
        "rank": rank,
        "loader_class": f"{type(loader).__module__}.{type(loader).__qualname__}",
        "params": len(strata.state_dict()),
        "differ": differences(strata, reference),
        "stats": loader.stats,
        "strata_s": strata_s,
        "safetensors_s": reference_s,
    }


def load(request: dict[str, Any]) -> dict[str, Any]:
    tp = request.get("tp_size", 1)
    if tp == 1:
        return {"ranks": [load_one(request, 0)]}
    request = {**request, "rendezvous": rendezvous_file()}
    out = Path(request["workdir"])
    for rank in range(tp):
        (out / f"rank{rank}.request.json").write_text(json.dumps(request))
    workers = [  # vLLM logs to stdout: each rank's answer goes to a file, its output to this script's log
        subprocess.Popen([sys.executable, __file__, "worker", str(rank), str(out)], stdout=sys.stderr)
        for rank in range(tp)
    ]
    for w in workers:
        w.wait(timeout=request.get("timeout", 300))
    answers = []
    for rank, w in enumerate(workers):
        answer = out / f"rank{rank}.answer.json"
        answers.append(json.loads(answer.read_text()) if answer.exists() else {"error": f"exit {w.returncode}"})
    failed = [a["error"] for a in answers if "error" in a]
    if failed:
        raise RuntimeError("a rank failed:\n" + "\n".join(failed))
    return {"ranks": answers}


def error(request: dict[str, Any]) -> dict[str, Any]:
    try:
        build(request["model_dir"], "strata", request.get("extra", {}), 1)
    except Exception as e:
        return {"raised": type(e).__name__, "message": str(e)}
    return {"raised": None}


def plugins(request: dict[str, Any]) -> dict[str, Any]:
    from importlib.metadata import entry_points

    from vllm.config.load import LoadConfig
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    import strata_loader.vllm.plugin as plugin

    plugin.register()  # again: vLLM calls the hook in every process, sometimes more than once in one
    plugin.register()
    found = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    loader = get_model_loader(LoadConfig(load_format="strata"))
    return {
        "entry_points": found,
        "loader_class": f"{type(loader).__module__}.{type(loader).__qualname__}",
        "plugin_file": plugin.__file__,
    }


FILTERED = """
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader import get_model_loader
from vllm.plugins import load_general_plugins
load_general_plugins()
try:
    get_model_loader(LoadConfig(load_format="strata"))
    print("REGISTERED yes")
except ValueError:
    print("REGISTERED no")
"""


def filtered(request: dict[str, Any]) -> dict[str, Any]:
    """Whether `--load-format strata` exists in a fresh process with `VLLM_PLUGINS` set to each of `values`
    (vLLM loads its general plugins once per process, so each value needs its own)."""
    out = {}
    for value in request["values"]:
        env = {**os.environ, "VLLM_PLUGINS": value}
        run = subprocess.run([sys.executable, "-c", FILTERED], env=env, capture_output=True, text=True, timeout=300)
        lines = [x for x in run.stdout.splitlines() if x.startswith("REGISTERED ")]
        if not lines:
            raise RuntimeError(f"VLLM_PLUGINS={value}: exit {run.returncode}\n{run.stderr[-3000:]}")
        out[value] = lines[-1] == "REGISTERED yes"
    return {"registered": out}


def answer(mode: str, request: dict[str, Any], rank: int = 0) -> dict[str, Any]:
    try:
        if mode == "worker":
            return load_one(request, rank)
        return {"load": load, "error": error, "plugins": plugins, "filtered": filtered}[mode](request)
    except Exception:
        return {"error": traceback.format_exc()}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":  # one rank of a tensor-parallel `load`
        rank, out = int(sys.argv[2]), Path(sys.argv[3])
        result = answer("worker", json.loads((out / f"rank{rank}.request.json").read_text()), rank)
        (out / f"rank{rank}.answer.json").write_text(json.dumps(result))
        os._exit(0)  # vLLM's process group threads would otherwise hold the exit
    for line in sys.stdin:
        if line.strip():
            request = json.loads(line)
            print(RESULT_MARK + json.dumps(answer(request["mode"], request)), flush=True)


if __name__ == "__main__":
    main()
