"""The operator's handlers, plain functions: `strata_operator.routes` lists the kopf triggers that call them.

`controller` is what both kinds share: one daemon per object, the consumer-pod index it counts, and the one
reconcile loop (gather → plan → execute → settle → status). `modelcache/` and `kvcachetier/` each hold a kind's
trigger functions (`events`), its stops of that loop (`reconcile`) and its reads and writes (`io`, the only module
of the kind that talks to the API server or a server); `process` is kopf's and Strata's settings, login and the
readiness probe.
"""
