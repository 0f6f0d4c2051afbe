"""The RESP AUTH token a tier's servers require: a Secret the user names, or one the operator generates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.kvcachetier.names import AUTH_FILE, TierRef

TOKEN_BYTES = 32
"""Random bytes in a generated token (the server warns below 16)."""


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


def build_token_secret(tier: TierRef, token: str) -> dict[str, Any]:
    """The generated Secret: immutable, so nothing (the operator included) rewrites a token clients hold."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": tier.metadata(tier.generated_token_secret),
        "type": "Opaque",
        "immutable": True,
        "stringData": {AUTH_FILE: token},
    }
