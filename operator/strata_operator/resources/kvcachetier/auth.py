"""The RESP AUTH token a tier's servers require: a Secret the user names, or one the operator generates."""

from __future__ import annotations

from dataclasses import dataclass

from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.core import GeneratedToken
from strata_operator.resources.kvcachetier.names import AUTH_FILE, TierRef


@dataclass(frozen=True)
class TokenSecret:
    """Where the token is: the servers mount `name`/`key`; clients read the same key."""

    name: str
    key: str
    generated: bool


def token_secret(spec: KVCacheTierSpec, tier: TierRef) -> TokenSecret | None:
    """The Secret holding the token, or None when auth is explicitly disabled."""
    if spec.auth.disabled:
        return None
    if spec.auth.secret_ref is not None:
        return TokenSecret(spec.auth.secret_ref.name, spec.auth.secret_ref.key or AUTH_FILE, generated=False)
    return TokenSecret(tier.generated_token_secret, AUTH_FILE, generated=True)


def generated_token(tier: TierRef) -> GeneratedToken:
    """The Secret the operator generates when the spec names none (see `GeneratedToken`)."""
    return GeneratedToken(
        tier.metadata(tier.generated_token_secret), AUTH_FILE, " (or set auth.secretRef to use that Secret's token)"
    )
