"""The KVCacheTier controller: `events` (what kopf calls), `reconcile` (gather → plan → execute → status),
`io` (its reads and writes), `usage` (the servers' metrics scraped into status.usage)."""
