"""`--load-format strata`'s options and file choice (strata_loader.vllm.serving), without vLLM: which files a rank
reads from a ModelCache directory, and the errors a user sees for bad options or a missing mount."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from strata_loader.tensor.shard import shard_directory
from strata_loader.vllm.serving import MODEL_DIR_ENV, LoaderOptions, select_files


def model_dir(path: Path) -> Path:
    path.mkdir()
    save_file({"model.embed_tokens.weight": torch.zeros(8, 4)}, str(path / "model-00001-of-00002.safetensors"))
    save_file(
        {"model.layers.0.self_attn.o_proj.weight": torch.ones(4, 4)}, str(path / "model-00002-of-00002.safetensors")
    )
    (path / "config.json").write_text("{}")
    return path


def names(files: list[str]) -> list[str]:
    return [str(Path(f).relative_to(Path(f).parents[1] if "sharded" in f else Path(f).parent)) for f in files]


def test_defaults_and_every_option() -> None:
    assert LoaderOptions.from_extra(None) == LoaderOptions()
    opts = LoaderOptions.from_extra({"concurrency": 8, "block_size": 2**20, "sharded": "never", "source": "/m"})
    assert (opts.concurrency, opts.block_size, opts.sharded, opts.source) == (8, 2**20, "never", "/m")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"buffer": 1}, "unknown key(s) ['buffer']; the keys are ['batch_bytes', 'block_size', 'concurrency'"),
        ({"concurrency": 0}, "concurrency must be a positive integer, got 0"),
        ({"memory_limit": True}, "memory_limit must be a positive integer, got True"),
        ({"block_size": None}, "block_size must be a positive integer, got None"),
        ({"sharded": "yes"}, "sharded must be 'auto', 'never' or 'require', got 'yes'"),
        ({"source": 3}, "source must be a string, got 3"),
    ],
)
def test_a_bad_option_names_the_key(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match="--model-loader-extra-config") as e:
        LoaderOptions.from_extra(extra)
    assert message in str(e.value)


def test_the_source_is_the_option_then_model_then_the_mount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = model_dir(tmp_path / "a"), model_dir(tmp_path / "b")
    monkeypatch.setenv(MODEL_DIR_ENV, str(b))
    assert LoaderOptions(source=str(a)).resolve_source(str(b)) == str(a)
    assert LoaderOptions().resolve_source(str(a)) == str(a)
    assert LoaderOptions().resolve_source("org/some-hub-id") == str(b)  # --model a hub id: the mounted cache
    assert LoaderOptions().resolve_source("s3://bucket/prefix/") == "s3://bucket/prefix"
    monkeypatch.delenv(MODEL_DIR_ENV)
    with pytest.raises(ValueError, match=f"neither a directory nor an s3:// URI and \\${MODEL_DIR_ENV} is not set"):
        LoaderOptions().resolve_source("org/some-hub-id")
    monkeypatch.setenv(MODEL_DIR_ENV, str(tmp_path / "gone"))
    with pytest.raises(FileNotFoundError, match=f"model directory {tmp_path / 'gone'} does not exist"):
        LoaderOptions().resolve_source("org/some-hub-id")


def test_a_rank_reads_its_parts_when_a_complete_set_exists(tmp_path: Path) -> None:
    src = model_dir(tmp_path / "m")
    whole = select_files(str(src), LoaderOptions(), 0, 1)
    assert not whole.presharded
    assert names(whole.files) == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    shard_directory(src, src / "sharded", 2, max_part_bytes=64)
    for rank in (0, 1):
        mine = select_files(str(src), LoaderOptions(), rank, 2)
        assert mine.presharded
        assert names(mine.files) == [f"sharded/model-rank-{rank}-part-{p}.safetensors" for p in (0, 1)]
    assert not select_files(str(src), LoaderOptions(sharded="never"), 0, 2).presharded
    # cut for 2 ranks: an engine of another size reads the whole checkpoint, or refuses under `require`
    assert not select_files(str(src), LoaderOptions(), 0, 4).presharded
    assert not select_files(str(src), LoaderOptions(), 0, 1).presharded
    with pytest.raises(FileNotFoundError, match="no complete set of parts for tensor-parallel size 4"):
        select_files(str(src), LoaderOptions(sharded="require"), 0, 4)


def test_an_incomplete_set_of_parts_is_not_used(tmp_path: Path) -> None:
    src = model_dir(tmp_path / "m")
    shard_directory(src, src / "sharded", 2, max_part_bytes=2**20)
    (src / "sharded" / "model-rank-1-part-0.safetensors").unlink()
    assert not select_files(str(src), LoaderOptions(), 0, 2).presharded


def test_a_directory_without_weights_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no \.safetensors files in"):
        select_files(str(tmp_path / "empty"), LoaderOptions(), 0, 1)
