"""The operator's handlers, plain functions: `strata_operator.routes` lists the kopf triggers that call them.

`controller` runs one daemon per object (both kinds); `modelcache/` and `kvcachetier/` each hold a kind's
trigger functions (`events`), its reconcile (`reconcile`: gather → pure plan → execute → status) and its reads
and writes (`io`); `consumers` counts the pods that use a cache or tier; `process` is kopf's and Strata's
settings, login and the readiness probe.
"""
