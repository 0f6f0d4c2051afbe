"""`kv.strata.dev`, a CSI node plugin that shares a KV server's Unix socket with restricted pods (plugin.py).

Needs the `csi` extra (grpcio, protobuf); nothing else in strata_kv imports this package. The `*_pb2*` modules
are generated from the two `.proto` files here by `make csi-protos` and committed (a unit test regenerates them
and compares).
"""
