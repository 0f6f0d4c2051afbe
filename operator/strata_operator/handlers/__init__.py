"""kopf entry points; importing this package registers every handler Strata runs."""

from strata_operator import settings  # noqa: F401  (registers the startup hook and probes)
from strata_operator.handlers import consumers, kvcachetier, modelcache, webhook  # noqa: F401
