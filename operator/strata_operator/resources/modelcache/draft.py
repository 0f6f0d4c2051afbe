"""A ModelCache plan while it is drafted: the `Plan` value, the `Planner` that collects one plan's writes while a
storage mode decides (`shared_pvc`, `node_modes`, `node_states`), and what gather asks of a spec (`job_role`,
`settled_jobs`). `plan.py` picks the mode and turns the draft into the final `Plan`.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from strata_loader.contract import FetchResult

from strata_operator.api.modelcache import ModelCacheSpec, StorageMode
from strata_operator.resources.core import Action, Event, GeneratedToken, Problem
from strata_operator.resources.modelcache import status as st
from strata_operator.resources.modelcache import storage
from strata_operator.resources.modelcache.jobs import CONTAINER
from strata_operator.resources.modelcache.observed import Observed

RECREATE_BASE_SECONDS = 30


RECREATE_MAX_SECONDS = 1800


INSUFFICIENT_RETRY_SECONDS = 300
"""A node whose copy did not fit its budget is tried again after this long (space may have been freed, a cache
unpinned or deleted, a pod ended), with a fresh list of copies it may evict."""


TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True)
class LabelChange:
    """`key=value` on a node; None removes the label."""

    node: str
    key: str
    value: str | None
    foreign: bool = False
    """Another cache's label (an eviction): written without recording the answer, so the node watch sees the
    change and wakes that cache."""


@dataclass
class Plan:
    status: dict[str, Any]
    actions: list[Action] = field(default_factory=list)
    labels: list[LabelChange] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    """Events that follow from the observation itself (transitions, a Job found that status never named)."""
    needs_inputs: bool = False
    again: bool = False
    token_secret: GeneratedToken | None = None
    """A Secret that must exist (created once with a random token) before the actions run."""
    wake_again: bool = False
    """Reconcile once more after this one: fan-out decides from the node states a plan starts with, and this
    plan saw a copy become Ready (the node label it sets wakes nobody: the operator's own write)."""
    recheck_seconds: float | None = None
    """Reconcile again this soon although nothing wakes the cache: a capture is awaited, and its sidecar's log,
    which no watch sees, will say how it ended (`compile_cache.capture_poll_seconds`)."""


class Planner:
    """Collects one plan's writes while the mode functions decide."""

    def __init__(self, observed: Observed) -> None:
        self.observed = observed
        self.actions: list[Action] = []
        self.labels: list[LabelChange] = []
        self.events: list[Event] = []
        self.needs_inputs = False
        self.again = False
        self.node_label: str | None = None
        """NodeLocal: this cache's node label key (its value Evicted marks an evicted copy)."""
        self.build: Callable[[str], Mapping[str, Any]] = lambda node: {}
        """NodeLocal: the preload Job for a node (to start one again after an eviction)."""
        self.needed_again: dict[str, str] = {}
        """NodeLocal: evicted node → the waiting pod its copy is fetched again for (`demand`)."""
        self.token_secret: GeneratedToken | None = None
        self.wake_again = False

    def create(self, body: Mapping[str, Any], event: Event | None) -> str | None:
        """Plan an apply; returns the API server's refusal instead when an earlier plan's apply was refused."""
        action = Action("apply", body, event)
        if refusal := self.observed.rejected.get(action.key):
            return refusal
        self.actions.append(action)
        return None

    def delete_job(self, name: str, event: Event | None = None) -> None:
        body = {"kind": "Job", "metadata": {"name": name, "namespace": self.observed.owner.namespace}}
        self.actions.append(Action("delete", body, event))

    def input_problem(self) -> Problem | None:
        if not self.observed.inputs_checked:
            self.needs_inputs = True
        return self.observed.input_problem


JobBuilder = Callable[[str, str], tuple[str, dict[str, Any]]]


def job_result(
    observed: Observed, spec: ModelCacheSpec, job: Mapping[str, Any], *, succeeded: bool
) -> tuple[FetchResult | None, str | None]:
    """The preloader's FetchResult from its pod's termination message, verified; or why there is none."""
    pods = observed.pods.get(job["metadata"]["name"]) or []
    message = st.termination_message(pods, CONTAINER, succeeded=succeeded)
    if message is None:
        if not succeeded:
            return None, st.job_failure_message(job)
        return None, "succeeded but its pod left no termination message (the preloader's FetchResult JSON)"
    result = FetchResult.from_termination_message(message)
    return result, st.verify_result(result, spec.source.uri, spec.source.revision)


def parse_time(value: str) -> datetime.datetime:
    return datetime.datetime.strptime(value, TIME_FORMAT).replace(tzinfo=datetime.UTC)


def job_role(spec: ModelCacheSpec) -> str | None:
    """The role of the Jobs a mode runs (what gather lists), or None when it runs none."""
    if spec.storage.mode == StorageMode.IMAGE_VOLUME:
        return storage.ROLE_PREPULL if storage.image_volume(spec).pre_pull else None
    return storage.ROLE_PRELOAD


def settled_jobs(previous: Mapping[str, Any]) -> set[str]:
    """Jobs whose verified result status already holds: their pods need not be read again."""
    settled = {s["job"] for s in previous.get("nodes") or [] if s.get("phase") == st.PHASE_READY and s.get("job")}
    if previous.get("phase") == st.PHASE_READY and previous.get("job"):
        settled.add(previous["job"])
    return settled
