"""`vllm serve --load-format strata`: the vLLM plugin (`plugin`, the only module that imports vLLM) and what it
decides without vLLM (`serving`: options, which files a rank reads).

Builds on `tensor` (the streamer it feeds vLLM from) and `core`.
"""
