"""The one reconcile loop both kinds run (`handlers/controller.converge`): its rounds and re-plan rule, on a kind
whose stops record what they were asked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from strata_operator.handlers import controller
from strata_operator.handlers.controller import Next


@dataclass
class Planned:
    status: dict[str, Any]
    writes: bool = False
    needs_more: bool = False


@dataclass
class Script:
    """Plans handed out in order; `settled` says what follows each execute."""

    plans: list[Planned]
    settled: list[Next] = field(default_factory=list)
    previous: Mapping[str, Any] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    written: list[Mapping[str, Any]] = field(default_factory=list)

    def gather(self, more: bool) -> str:
        self.log.append(f"gather(more={more})")
        return "observed"

    def plan(self, observed: str) -> Planned:
        self.log.append("plan")
        return self.plans.pop(0)

    def needs_more(self, plan: Planned) -> bool:
        return plan.needs_more

    def has_writes(self, plan: Planned) -> bool:
        return plan.writes

    def execute(self, plan: Planned) -> str:
        self.log.append("execute")
        return "results"

    def settle(self, observed: str, plan: Planned, results: str) -> tuple[str, Planned, Next]:
        self.log.append("settle")
        return observed, plan, self.settled.pop(0)

    def write_status(self, patch: Mapping[str, Any]) -> None:
        self.written.append(patch)


def test_a_plan_without_writes_is_final_and_an_unchanged_status_is_not_written() -> None:
    kind = Script([Planned({"phase": "Ready"})], previous={"phase": "Ready"})
    done = controller.converge(kind)
    assert kind.log == ["gather(more=False)", "plan"] and not done.status_written and kind.written == []


def test_a_plan_asking_for_more_reads_is_discarded_unexecuted() -> None:
    kind = Script([Planned({"a": 1}, writes=True, needs_more=True), Planned({"a": 2}, writes=True)], [Next.DONE])
    done = controller.converge(kind)
    assert kind.log == ["gather(more=False)", "plan", "gather(more=True)", "plan", "execute", "settle"]
    assert done.plan.status == {"a": 2} and kind.written == [{"a": 2}]


def test_plan_folds_writes_in_and_gather_reads_again() -> None:
    plans = [Planned({"n": 1}, writes=True), Planned({"n": 2}, writes=True), Planned({"n": 3})]
    kind = Script(plans, [Next.PLAN, Next.GATHER])
    controller.converge(kind)
    assert kind.log == [
        "gather(more=False)", "plan", "execute", "settle",
        "plan", "execute", "settle",
        "gather(more=False)", "plan",
    ]  # fmt: skip


def test_when_the_rounds_run_out_the_last_plan_executed_stands() -> None:
    plans = [Planned({"n": n}, writes=True) for n in range(controller.ROUNDS + 1)]
    kind = Script(plans, [Next.GATHER] * controller.ROUNDS)
    done = controller.converge(kind)
    assert kind.log.count("execute") == controller.ROUNDS and done.plan.status == {"n": controller.ROUNDS - 1}
