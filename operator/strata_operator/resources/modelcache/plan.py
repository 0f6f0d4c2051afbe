"""A ModelCache reconcile's decisions: one pure function from what was observed to what to do.

The controller runs the loop both kinds share (`handlers/controller.converge`: gather → plan → execute → settle,
then the status if it changed): `handlers/modelcache/io.py` makes every read (`gather`) and fills an `Observed`;
`plan` turns it into the objects to apply, the Jobs to delete, the node labels to set, the status (status.consumers
included, from the daemon's pod index) and the Events, without touching the cluster (each storage mode decides in
its own module: `shared_pvc`, `node_modes`, with `node_states` per node); `io.execute` carries the plan out. So
every storage mode's behaviour is a unit test on plain data (`operator/tests/unit/test_modelcache_plan.py`).

Two facts a plan cannot always have up front, and how it asks for them:
- whether a Job's references (Secret, ServiceAccount, source claim) exist is read only when a Job is about to be
  created; a plan that needs it sets `needs_inputs`, is discarded, and runs again with the answer;
- a SharedPVC preload is named after its claim's uid, so a plan that creates the claim sets `again`: it is
  carried out, and the controller gathers and plans once more in the same reconcile.
An object the API server refuses comes back as `Observed.rejected`, and the plan run again with it says why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from strata_operator.api.modelcache import ModelCacheSpec, StorageMode
from strata_operator.conditions import transition_events
from strata_operator.resources.core import SPEC_INVALID, Event, Problem, with_consumers
from strata_operator.resources.modelcache import compile_cache as cc
from strata_operator.resources.modelcache import node_loss, volume
from strata_operator.resources.modelcache import status as st
from strata_operator.resources.modelcache.draft import TIME_FORMAT, Plan, Planner
from strata_operator.resources.modelcache.node_modes import plan_image_volume, plan_node_local
from strata_operator.resources.modelcache.observed import Observed
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.modelcache.shared_pvc import plan_shared_pvc
from strata_operator.resources.modelcache.status import Outcome, SpecError


def plan(observed: Observed) -> Plan:
    """What to do about one ModelCache, given what was observed. The modes plan from the node states with those
    of nodes Ready again put back as they were before their node was lost (`node_loss`); status transitions and
    Events compare with the stored status."""
    resumed = replace(observed, previous=node_loss.with_returned(observed.previous, observed.nodes))
    planner = Planner(resumed)
    spec = observed.spec
    if observed.spec_problem is not None or spec is None:
        outcome = st.blocked_outcome(observed.spec_problem or Problem(SPEC_INVALID, "no spec"), {})
    else:
        try:
            outcome = MODES[spec.storage.mode].plan(planner, spec)
        except SpecError as error:  # the builders refuse what the CRD let through: a person must change it
            planner = Planner(resumed)
            outcome = st.blocked_outcome(error.problem(), {})
    previous = observed.previous
    desired = st.render_status(previous, outcome, observed.owner.generation, now=observed.now.strftime(TIME_FORMAT))
    desired = with_consumers(desired, previous, observed.consumers)
    compile_events: list[Event] = []
    recheck = None
    if spec is not None and spec.compile_cache.enabled:
        desired["compileCache"], compile_events = cc.compile_status(
            previous,
            observed.consumer_pods,
            store=cc.store_location(observed.owner, spec),
            per_node=spec.storage.mode == StorageMode.NODE_LOCAL,
            logs=observed.capture_logs,
        )
        recheck = cc.capture_poll_seconds(desired["compileCache"])
    return Plan(
        status=desired,
        actions=planner.actions,
        labels=planner.labels,
        events=planner.events
        + transition_events(observed.owner.KIND, previous.get("conditions") or [], desired["conditions"])
        + st.node_events(previous, desired)
        + compile_events,
        needs_inputs=planner.needs_inputs,
        again=planner.again,
        token_secret=planner.token_secret,
        wake_again=planner.wake_again,
        recheck_seconds=recheck,
    )


def with_rejections(observed: Observed, rejected: Mapping[tuple[str, str], str]) -> Observed:
    return replace(observed, rejected={**observed.rejected, **rejected})


@dataclass(frozen=True)
class Mode:
    """What a storage mode decides: its plan, and the consumption contract (status.volume) as its plan writes it,
    which the webhook builds itself for a pod created before the status has it."""

    plan: Callable[[Planner, ModelCacheSpec], Outcome]
    volume: Callable[[CacheRef, ModelCacheSpec], dict[str, Any]]


MODES: dict[StorageMode, Mode] = {
    StorageMode.SHARED_PVC: Mode(plan_shared_pvc, volume.shared_pvc_snippet),
    StorageMode.NODE_LOCAL: Mode(plan_node_local, volume.node_local_snippet),
    StorageMode.IMAGE_VOLUME: Mode(plan_image_volume, volume.image_volume_snippet),
}
"""The one place the storage mode is dispatched."""
