"""The ModelCache controller: `events` (what kopf calls), `reconcile` (gather → plan → execute → status),
`io` (its reads), `nodes` (the node watch's cache), `capacity` (node budgets' reads), `cleanup` (deletion)."""
