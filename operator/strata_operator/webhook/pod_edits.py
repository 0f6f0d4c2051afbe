"""Edits the webhook makes to a pod's spec (as a plain dict), and the JSON Patch that takes the pod there.

Shared by every part of the wiring (`wiring`, `packages`): an edit never overwrites what the user set under a
name Strata uses; a difference is a `WiringConflict` whose message names the field and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SPEC_FIELDS = ("volumes", "initContainers", "affinity", "schedulingGates", "securityContext", "imagePullSecrets")
"""The pod-level fields the wiring edits; each becomes one `add` of its whole value when it changed."""
CONTAINER_FIELDS = ("volumeMounts", "env", "envFrom", "args")


class WiringConflict(ValueError):
    """The pod already sets something Strata would set, differently; the message names the field and the fix."""


def add_named(
    parent: dict[str, Any], key: str, item: dict[str, Any], field: str, whose: str, *, defaulted: bool = False
) -> None:
    """Append `item` to the named list `parent[key]`, unless an equal one is there; a different one of that name
    is a conflict. `defaulted`: one with more fields is equal when those of `item` match, and a list field when it
    holds every entry of `item`'s (a container the API server stored has defaults filled in, `terminationMessagePath`,
    `imagePullPolicy`, and other admission plugins' additions: the service account's token mount)."""
    items = parent.setdefault(key, [])
    for existing in items:
        if existing.get("name") == item["name"]:
            same = _covers(existing, item) if defaulted else existing == item
            if not same:
                raise WiringConflict(
                    f"{field}[{item['name']}] is already set to {existing!r}; {whose} needs {item!r}: "
                    "remove it from the pod, or drop the Strata label"
                )
            return
    items.append(item)


def _covers(existing: Mapping[str, Any], item: Mapping[str, Any]) -> bool:
    """Every field of `item` is in `existing`: equal, or for a list every entry of `item`'s among `existing`'s."""
    for k, v in item.items():
        there = existing.get(k)
        if isinstance(v, list) and isinstance(there, list):
            if any(entry not in there for entry in v):
                return False
        elif there != v:
            return False
    return True


def add_mount(container: dict[str, Any], mount: dict[str, Any], field: str, whose: str, fix: str) -> None:
    """Add `mount` unless the same is there; another mount at its path or of its volume is a conflict."""
    mounts = container.setdefault("volumeMounts", [])
    for existing in mounts:
        if existing.get("mountPath") == mount["mountPath"] or existing.get("name") == mount["name"]:
            if existing != mount:
                raise WiringConflict(f"{field}.volumeMounts already has {existing!r}; {whose} needs {mount!r} ({fix})")
            return
    mounts.append(mount)


def spec_patch(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One `add` per top-level spec field (and per container) that changed: `add` on an existing member replaces
    it, so the patch is exact whether or not the field was there."""
    ops: list[dict[str, Any]] = []
    for key in SPEC_FIELDS:
        if _changed(before, after, key):
            ops.append({"op": "add", "path": f"/spec/{key}", "value": after[key]})
    old_containers = before.get("containers") or []
    for i, container in enumerate(after.get("containers") or []):
        old = old_containers[i] if i < len(old_containers) else {}
        for key in CONTAINER_FIELDS:
            if _changed(old, container, key):
                ops.append({"op": "add", "path": f"/spec/containers/{i}/{key}", "value": container[key]})
    return ops


def _changed(before: Mapping[str, Any], after: Mapping[str, Any], key: str) -> bool:
    """An empty list or object left where there was none is no change."""
    if key not in after:
        return False
    return after[key] != before.get(key) and not (key not in before and not after[key])
