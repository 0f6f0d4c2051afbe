"""kopf entry points; importing this package registers every handler Strata runs."""

from strata_operator.handlers import kvcachetier, modelcache, process  # noqa: F401
