"""The writes both controllers share (the pure half of the kit is `resources/core.py`)."""

from __future__ import annotations

import secrets
from typing import Any

from strata_operator import kube
from strata_operator.resources.core import TOKEN_BYTES, GeneratedToken, Owner, Problem, name_conflict


def ensure_token_secret(owner: Owner, token: GeneratedToken) -> tuple[dict[str, Any] | None, Problem | None]:
    """Create the token Secret once, with a random token; an existing one is kept as it is (clients hold it).
    Returns the live Secret, or the name conflict when a Secret of that name is not the owner's."""
    live = kube.read("v1", "Secret", token.name, owner.namespace)
    if live is None:
        live = kube.create(token.secret(secrets.token_urlsafe(TOKEN_BYTES)))
        if live is None:  # created meanwhile by someone else: read what is there now
            live = kube.read("v1", "Secret", token.name, owner.namespace)
    if conflict := name_conflict(owner, "Secret", token.name, live, token.hint):
        return None, conflict
    return live, None
