"""The status the operator writes, checked against the status models its CRDs are generated from.

The API server prunes a status field its schema lacks without a word, so a status builder that writes
`readyNode` instead of `readyNodes` would pass every test that reads back only the fields it expects. Here every
status is validated against the kind's pydantic status model (`extra="forbid"`, as every CRD model is), both in
unit tests (`check_status` on what a builder returns) and for every write of the in-process operator
(`checked_status_writes` around `strata_operator.kube.patch_status`, which every status write goes through).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from pydantic import ValidationError


def status_models() -> dict[str, Any]:
    from strata_operator.api.kinds import KINDS

    return {kind.kind: kind.status_model for kind in KINDS}


def check_status(kind: str, status: Mapping[str, Any]) -> None:
    """Raises AssertionError naming each field of `status` that the kind's status model lacks or refuses."""
    try:
        status_models()[kind].model_validate(dict(status))
    except ValidationError as error:
        found = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise AssertionError(
            f"{kind} status does not fit {kind}Status (the API server would drop or refuse it): {found}"
        ) from None


def merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386: what the API server makes of a merge patch (None deletes, objects merge, lists replace)."""
    merged = dict(target)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_patch(merged[key], value)
        elif isinstance(value, Mapping):
            merged[key] = merge_patch({}, value)
        else:
            merged[key] = value
    return merged


@contextmanager
def checked_status_writes() -> Iterator[list[str]]:
    """While open, every status patch the operator sends is merged into what it wrote before for that object and
    the result checked; a patch that does not fit raises in the handler (its write fails, loudly) and is listed
    in the yielded list, so the fixture that opened this can fail the test that caused it."""
    from strata_operator import kube

    written: dict[tuple[str, str, str], dict[str, Any]] = {}
    violations: list[str] = []
    patch_status = kube.patch_status

    def checked(
        api_version: str, kind: str, name: str, namespace: str, status: Mapping[str, Any], **options: Any
    ) -> bool:
        key = (kind, namespace, name)
        merged = merge_patch(written.get(key, {}), status)
        try:
            check_status(kind, merged)
        except AssertionError as error:
            violations.append(f"{namespace}/{name}: {error}")
            raise
        # Recorded only once written: a conditional write that meets a newer version raises `kube.Conflict`
        # and changes nothing.
        applied = patch_status(api_version, kind, name, namespace, status, **options)
        written[key] = merged
        return applied

    kube.patch_status = checked  # type: ignore[assignment]
    try:
        yield violations
    finally:
        kube.patch_status = patch_status  # type: ignore[assignment]
