"""What every product of the loader shares: the safetensors header format (pure), byte-range readers (local, S3),
the copy's manifest, worker threads, the copy lock that eviction respects, and one-line errors.

Imports the contract layer (`contract`, `capacity`, `paths`) and nothing else of strata_loader; no torch.
"""
