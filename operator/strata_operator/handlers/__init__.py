"""kopf entry points; importing this package registers every handler Strata runs."""

from strata_operator.handlers import consumers, kvcachetier, modelcache, process, webhook  # noqa: F401
