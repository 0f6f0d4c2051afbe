"""Where chunks live: L1 in DRAM (`memory`, its eviction `policy`), the L2 tiers behind it (`fstier`, `s3tier`, the
`l2` interface, the `blockfile` format both write), `writebehind`, the `tiered` store that puts them together, the
vLLM namespaces across tiers (`namespaces`), what offloading earns (`offload_stats`) and the KV events of what it
holds (`kvevents`).

Imports `config` only: no sockets, no RESP; the server drives it.
"""
