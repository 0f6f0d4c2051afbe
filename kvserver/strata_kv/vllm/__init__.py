"""Strata inside a vLLM engine: the secondary tier (`tier`), the CPU backend's offloading spec (`cpu_offload`), the
seam between vLLM versions (`compat`), the engine's link to its node's server (`engine_link`) and the primary
tier's /dev/shm regions (`shm_regions`).

Builds on the client (and through it `wire`) only: a serving image gets it with `pip install strata` and no
extras. vLLM names it by the top-level entry modules `strata_kv.vllm_tier` and `strata_kv.vllm_cpu_offload`.
"""
