"""Read planning is pure: batches tile the data exactly, and slice runs are the bytes of the slice."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save
from strata_loader.core.format import parse_file_bytes
from strata_loader.tensor.planner import Run, coalesce, plan_file, plan_files, slice_runs, split_range


@given(length=st.integers(0, 10_000), block=st.integers(1, 3000))
def test_split_range_tiles_the_range(length, block):
    parts = split_range(length, block)
    assert sum(n for _, n in parts) == length
    assert all(0 < n <= block for _, n in parts)
    assert [o for o, _ in parts] == list(range(0, length, block))


@settings(deadline=None, max_examples=50)
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=20), batch=st.integers(1, 1000))
def test_batches_cover_every_tensor_once_in_order(sizes, batch):
    blob = save({f"t{i:02d}": torch.zeros(n, dtype=torch.uint8) for i, n in enumerate(sizes)})
    header = parse_file_bytes(blob)
    batches = plan_file(header, 0, batch)
    names = [t.name for b in batches for t in b.tensors]
    assert sorted(names) == sorted(t.name for t in header.tensors)
    pos = header.data_offset
    for b in batches:
        assert b.offset == pos
        assert b.length == sum(t.nbytes for t in b.tensors)
        assert b.length <= batch or len(b.tensors) == 1
        pos += b.length
    assert pos == len(blob)


def test_files_are_interleaved_so_they_are_read_together():
    blob = save({f"t{i}": torch.zeros(100, dtype=torch.uint8) for i in range(3)})
    h = parse_file_bytes(blob)
    order = [b.file_index for b in plan_files([h, h], batch_bytes=100)]
    assert order == [0, 1, 0, 1, 0, 1]


shapes = st.lists(st.integers(1, 6), min_size=1, max_size=4)


@settings(deadline=None, max_examples=200)
@given(data=st.data(), shape=shapes, itemsize=st.sampled_from([1, 2, 4]))
def test_slice_runs_concatenate_to_the_slice(data, shape, itemsize):
    bounds = []
    for n in shape:
        a = data.draw(st.integers(0, n))
        b = data.draw(st.integers(a, n))
        bounds.append((a, b))
    base = data.draw(st.integers(0, 50))
    full = np.arange(base + int(np.prod(shape)) * itemsize, dtype=np.int64)
    runs, out_shape = slice_runs(base, shape, itemsize, bounds)
    got = np.concatenate([full[r.offset : r.offset + r.length] for r in runs]) if runs else np.array([])
    view = full[base:].reshape(*shape, itemsize)[tuple(slice(a, b) for a, b in bounds)]
    assert out_shape == view.shape[:-1]
    assert got.tolist() == view.reshape(-1).tolist()


@given(
    runs=st.lists(st.tuples(st.integers(0, 50), st.integers(1, 30)), max_size=30),
    gap=st.integers(0, 40),
    span=st.integers(1, 200),
)
def test_coalesce_keeps_runs_in_order_and_bounds(runs, gap, span):
    pos, rs = 0, []
    for skip, n in runs:
        pos += skip
        rs.append(Run(pos, n))
        pos += n
    spans = coalesce(rs, gap, span)
    assert [r for s in spans for r in s.runs] == rs
    for s in spans:
        assert s.offset == s.runs[0].offset
        assert s.offset + s.length == s.runs[-1].offset + s.runs[-1].length
        assert s.length <= span or len(s.runs) == 1
        for a, b in zip(s.runs, s.runs[1:], strict=False):
            assert b.offset - (a.offset + a.length) <= gap
