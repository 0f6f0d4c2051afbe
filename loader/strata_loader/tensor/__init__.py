"""The tensor API: safetensors streamed into torch tensors (`load_file`, `load_files`, `iter_tensors`), read
planning and the executor, and pre-sharding for tensor-parallel ranks (`shard`, bytes only).

Builds on `core`. Only `api` and `torch_dtypes` import torch; the package itself imports nothing, so the fetch
CLI can use `shard` without loading torch. The public names are re-exported by `strata_loader`.
"""
