"""vLLM-tier namespaces as a unit: what each holds per tier, and dropping one from every tier.

A namespace is the directory part of a vLLM-tier key, `<model>_<digest12>` (all ranks): the one vLLM's own
FileMapper derives from the engine's model name and KV layout (`strata_kv.vllm.tier.namespace_prefix`). The
operator lists them (`STRATA.NAMESPACES`) and drops those of a model revision no pod serves any more
(`STRATA.DROPNS`): persisted KV must not outlive the weights it was computed with.

Dropping deletes every key of the namespace through `TieredStore.delete_many`, the path `DEL` takes, so L1, the
write-behind queue and every L2 tier forget each key and KV events report each block removed; then what is left of
the namespace's directories on the filesystem tier (vLLM's `config.json`, temp files, empty directories) goes too.
The server's own configured namespace (where LMCache and raw keys live) is never dropped this way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .blockfile import VLLM_RANK_DIR, split_vllm_tier_key, vllm_tier_key_of
from .fstier import FsTier
from .s3tier import S3Tier

if TYPE_CHECKING:
    from .tiered import TieredStore


Usage = dict[str, dict[str, int]]
"""tier name (`l1`, `fs`, `s3`) -> {"blocks": n, "bytes": n}."""


class NamespaceRefused(ValueError):
    """The name is not a vLLM-tier namespace this command may drop; the message says why."""


def namespace_of(key: bytes) -> str | None:
    """`<model>_<digest12>` of a vLLM-tier key; None for any other key."""
    parts = split_vllm_tier_key(key)
    return parts[0] if parts is not None else None


def check_droppable(store: TieredStore, namespace: str) -> None:
    """Refuse a name that is not a vLLM namespace, or is the server's own configured one."""
    if VLLM_RANK_DIR.match(f"{namespace}_r0") is None:
        raise NamespaceRefused(f"{namespace!r} is not a vLLM namespace (<model>_<12 hex digits>)")
    if namespace == store.cfg.namespace.directory_name:
        raise NamespaceRefused(f"{namespace!r} is this server's configured namespace; it is never dropped")


def _rank_dirs(root: Path, namespace: str | None = None) -> Iterable[tuple[str, int, Path]]:
    """(namespace, rank, path) of the vLLM rank directories under an fs tier's root."""
    for top in root.iterdir() if root.exists() else ():
        match = VLLM_RANK_DIR.match(top.name)
        if match is None or not top.is_dir() or (namespace is not None and match.group("dir") != namespace):
            continue
        yield match.group("dir"), int(match.group("rank")), top


def _fs_blocks(tier: FsTier, namespace: str | None = None) -> Iterable[tuple[str, bytes | None, int, Path]]:
    """(namespace, key or None, size, path) of every file under the vLLM rank directories, read from disk (vLLM's
    own `fs` tier writes files the index has not seen yet)."""
    for ns, _rank, top in _rank_dirs(tier.root, namespace):
        for dirpath, _dirs, files in os.walk(top):
            for name in files:
                full = Path(dirpath, name)
                try:
                    size = full.stat().st_size
                except FileNotFoundError:
                    continue
                yield ns, vllm_tier_key_of(str(full.relative_to(tier.root))), size, full


def _s3_objects(tier: S3Tier, namespace: str | None = None) -> Iterable[tuple[str, bytes | None, int]]:
    """(namespace, key or None, size) of every object under the bucket prefix's vLLM rank directories."""
    base = tier.cfg.prefix.strip("/")
    start = f"{base}/" if base else ""
    paginator = tier._client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=tier.cfg.bucket, Prefix=start + (namespace or "")):
        for item in page.get("Contents") or []:
            rel = item["Key"][len(start) :]
            top = rel.partition("/")[0]
            match = VLLM_RANK_DIR.match(top)
            if match is None or (namespace is not None and match.group("dir") != namespace):
                continue
            ns = match.group("dir")
            yield ns, vllm_tier_key_of(rel), int(item.get("Size") or 0)


def _add(usage: dict[str, Usage], namespace: str, tier: str, size: int) -> None:
    counts = usage[namespace].setdefault(tier, {"blocks": 0, "bytes": 0})
    counts["blocks"] += 1
    counts["bytes"] += size


def _l1_entries(store: TieredStore) -> Iterable[tuple[bytes, int]]:
    """(key, value bytes) of L1 and of the write-behind queue (not yet in L2: still memory)."""
    seen: set[bytes] = set()
    for key, value in store.l1.items():
        seen.add(key)
        yield key, len(value)
    if store.write_behind is not None:
        for key, value in list(store.write_behind.pending.items()):
            if key not in seen:
                yield key, len(value)


def _l2_usage(store: TieredStore) -> dict[str, Usage]:
    """Blocking: lists the L2 tiers (run in a thread)."""
    usage: dict[str, Usage] = defaultdict(dict)
    for tier in store.l2:
        if isinstance(tier, FsTier):
            for ns, _key, size, _path in _fs_blocks(tier):
                _add(usage, ns, tier.name, size)
        elif isinstance(tier, S3Tier):
            for ns, _key, size in _s3_objects(tier):
                _add(usage, ns, tier.name, size)
    return usage


async def namespace_usage(store: TieredStore) -> dict[str, Usage]:
    """Every vLLM-tier namespace any tier holds, with its blocks and bytes per tier."""
    usage: dict[str, Usage] = defaultdict(dict)
    for key, size in _l1_entries(store):
        if (ns := namespace_of(key)) is not None:
            _add(usage, ns, "l1", size)
    for ns, tiers in (await asyncio.to_thread(_l2_usage, store)).items():
        usage[ns].update(tiers)
    usage.pop(store.cfg.namespace.directory_name, None)  # the server's own: LMCache and raw keys, never dropped
    return dict(usage)


def _l2_members(store: TieredStore, namespace: str) -> tuple[dict[str, dict[bytes, int]], list[Path]]:
    """Blocking: per L2 tier, the namespace's keys and their stored sizes; and the fs rank directories."""
    members: dict[str, dict[bytes, int]] = {}
    dirs: list[Path] = []
    for tier in store.l2:
        found: dict[bytes, int] = {}
        if isinstance(tier, FsTier):
            for _ns, key, size, _path in _fs_blocks(tier, namespace):
                if key is not None:
                    found[key] = size
            dirs += [path for _ns, _rank, path in _rank_dirs(tier.root, namespace)]
            dirs.append(tier.root / namespace)  # where vLLM keeps the namespace's config.json
        elif isinstance(tier, S3Tier):
            found = {key: size for _ns, key, size in _s3_objects(tier, namespace) if key is not None}
        members[tier.name] = found
    return members, dirs


def _remove_leftovers(dirs: list[Path]) -> int:
    """Remove what is left under the namespace's directories (config.json, temp files); the bytes it held."""
    freed = 0
    for path in dirs:
        if not path.is_dir():
            continue
        for dirpath, _dirs, files in os.walk(path):
            for name in files:
                with contextlib.suppress(FileNotFoundError):
                    freed += Path(dirpath, name).stat().st_size
        shutil.rmtree(path, ignore_errors=True)
    return freed


async def drop_namespace(store: TieredStore, namespace: str) -> dict[str, Any]:
    """Forget every block of `namespace` in every tier; the blocks and bytes each tier freed.

    Idempotent: a namespace already gone frees nothing. Sizes are what each tier held (value bytes in L1, file or
    object bytes in L2), counted before the delete.
    """
    check_droppable(store, namespace)
    async with store.namespace_drops:
        return await _drop(store, namespace)


async def _drop(store: TieredStore, namespace: str) -> dict[str, Any]:
    freed: Usage = {}
    keys: set[bytes] = set()
    for key, size in _l1_entries(store):
        if namespace_of(key) == namespace:
            keys.add(key)
            counts = freed.setdefault("l1", {"blocks": 0, "bytes": 0})
            counts["blocks"] += 1
            counts["bytes"] += size
    members, dirs = await asyncio.to_thread(_l2_members, store, namespace)
    for tier, found in members.items():
        keys.update(found)
        if found:
            freed[tier] = {"blocks": len(found), "bytes": sum(found.values())}
    await store.delete_many(sorted(keys))
    leftover = await asyncio.to_thread(_remove_leftovers, dirs)
    for l2 in store.l2:
        if isinstance(l2, FsTier):
            l2.forget_namespace(namespace)
    if leftover:
        counts = freed.setdefault("fs", {"blocks": 0, "bytes": 0})
        counts["bytes"] += leftover
    return {"namespace": namespace, "freed": freed, "bytes": sum(c["bytes"] for c in freed.values())}
