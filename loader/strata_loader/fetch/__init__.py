"""The fetch CLI the preloader Jobs run: list a source (directory, `pvc://`, S3, `hf://`), copy it into DEST in
parallel and resumably, verify it, make room on the node (eviction), and mark it complete with the manifest.

Builds on `core`, and on two products: `peer` (when the operator passes peers, files come from them first) and
`tensor.shard` (the request's `shard` option pre-shards the copy). Imported by nothing but the CLI.
"""
