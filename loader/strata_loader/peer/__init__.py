"""The peer fan-out: `serve-peer` serves a verified copy's files to other nodes, and fetches read from those
peers first (`source.with_peers`), trusting a peer only once it has proved it holds the token and the first copy's
manifest (`trust`).

Builds on `core` only; `fetch` uses it.
"""
