"""Every ModelCache plan a unit test makes has its status checked against ModelCacheStatus (the API server
would drop a field the model lacks without a word)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from strata_operator.resources.modelcache.plan import Plan
from strata_testsupport.status import check_status


@pytest.fixture(autouse=True)
def plans_write_status_that_fits_the_model(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    made = Plan.__init__

    def checked(self: Plan, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        check_status("ModelCache", self.status)

    monkeypatch.setattr(Plan, "__init__", checked)
    yield
