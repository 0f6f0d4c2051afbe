"""The API calls the ModelCache controller makes beyond `strata_operator.kube`, and one reconcile's context.

Everything here runs in a worker thread (the kubernetes client blocks); Events are collected and posted by
the caller on kopf's event loop.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.dynamic.exceptions import ApiException, NotFoundError
from strata_loader.contract import FetchResult

from strata_operator import kube
from strata_operator.api import API_VERSION
from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.resources.modelcache import status as st
from strata_operator.resources.modelcache.jobs import CONTAINER
from strata_operator.resources.modelcache.names import CACHE_LABEL, ROLE_LABEL, selector
from strata_operator.resources.modelcache.owner import Owner
from strata_operator.resources.modelcache.status import Problem


@dataclass
class Context:
    """One reconcile of one ModelCache: what it read, and the Events it wants posted."""

    body: Mapping[str, Any]
    owner: Owner
    spec: ModelCacheSpec
    previous: dict[str, Any]
    events: list[tuple[str, str, str]] = field(default_factory=list)
    _problem: Problem | None = None
    _checked: bool = False

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def input_problem(self) -> Problem | None:
        """Checked only when a Job is about to be created, and once per reconcile."""
        if not self._checked:
            self._problem = input_problem(self.owner, self.spec)
            self._checked = True
        return self._problem


def input_problem(owner: Owner, spec: ModelCacheSpec) -> Problem | None:
    """References a preloader pod would fail on silently (it would sit in CreateContainerConfigError)."""
    credentials = spec.source.credentials
    ns = owner.namespace
    if credentials and credentials.secret_ref and kube.get("v1", "Secret", credentials.secret_ref.name, ns) is None:
        return Problem(
            "SecretNotFound",
            f"Secret {credentials.secret_ref.name!r} (source.credentials.secretRef) does not exist in "
            f"namespace {ns!r}: create it with the keys the source needs (AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or HF_TOKEN), or remove secretRef",
        )
    sa = credentials.service_account_name if credentials else None
    if sa and kube.get("v1", "ServiceAccount", sa, ns) is None:
        return Problem(
            "ServiceAccountNotFound",
            f"ServiceAccount {sa!r} (source.credentials.serviceAccountName) does not exist in namespace {ns!r}",
        )
    if spec.source.uri.startswith("pvc://"):
        claim = spec.source.uri.removeprefix("pvc://").split("/", 1)[0]
        if kube.get("v1", "PersistentVolumeClaim", claim, ns) is None:
            return Problem(
                "SourceClaimNotFound",
                f"source claim {claim!r} (from {spec.source.uri}) does not exist in namespace {ns!r}",
            )
    return None


def api_error_message(error: ApiException) -> str:
    """The API server's own message (what a person would see from kubectl), not the client's repr."""
    try:
        return str(json.loads(error.body).get("message") or error.reason)
    except (TypeError, ValueError, AttributeError):
        return str(getattr(error, "reason", error))


def list_children(owner: Owner, api_version: str, kind: str, role: str) -> list[dict[str, Any]]:
    api = kube.dynamic_client().resources.get(api_version=api_version, kind=kind)
    found = api.get(namespace=owner.namespace, label_selector=selector({CACHE_LABEL: owner.name, ROLE_LABEL: role}))
    return list(found.to_dict().get("items") or [])


def job_pods(namespace: str, job_name: str) -> list[dict[str, Any]]:
    pods = kube.dynamic_client().resources.get(api_version="v1", kind="Pod")
    found = pods.get(namespace=namespace, label_selector=f"batch.kubernetes.io/job-name={job_name}")
    return list(found.to_dict().get("items") or [])


def get_dict(api_version: str, kind: str, name: str, namespace: str | None) -> dict[str, Any] | None:
    found = kube.get(api_version, kind, name, namespace)
    return None if found is None else dict(found.to_dict())


def delete_job(namespace: str, name: str) -> bool:
    """Foreground-free delete that also removes the Job's pods (background propagation)."""
    return kube.delete("batch/v1", "Job", name, namespace)


def patch_status(owner: Owner, patch: Mapping[str, Any]) -> None:
    api = kube.dynamic_client().resources.get(api_version=API_VERSION, kind="ModelCache")
    with contextlib.suppress(NotFoundError):  # deleted meanwhile: nothing left to report on
        api.status.patch(
            name=owner.name,
            namespace=owner.namespace,
            body={"status": dict(patch)},
            content_type="application/merge-patch+json",
        )


def is_subset(desired: Any, live: Any) -> bool:
    """True when every field we render already has that value live (server defaults may add more)."""
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(is_subset(v, live.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(desired) == len(live)
            and all(is_subset(d, v) for d, v in zip(desired, live, strict=True))
        )
    return bool(desired == live)


def job_result(ctx: Context, job: dict[str, Any], *, succeeded: bool) -> tuple[FetchResult | None, str | None]:
    """The preloader's FetchResult from its pod's termination message, verified; or why there is none."""
    name = job["metadata"]["name"]
    message = st.termination_message(job_pods(ctx.owner.namespace, name), CONTAINER, succeeded=succeeded)
    if message is None:
        if not succeeded:
            return None, st.job_failure_message(job)
        return None, "succeeded but its pod left no termination message (the preloader's FetchResult JSON)"
    result = FetchResult.from_termination_message(message)
    return result, st.verify_result(result, ctx.spec.source.uri, ctx.spec.source.revision)
