"""The engine link's circuit breaker: when calls go out, and when they are held back without I/O."""

from __future__ import annotations

import pytest
from strata_kv.vllm.engine_link import CircuitBreaker


def test_opens_after_the_threshold_of_failures_in_a_row() -> None:
    breaker = CircuitBreaker(failure_threshold=3, reset_after_s=3600)
    breaker.failure()
    breaker.failure()
    breaker.success()  # a success resets the count
    breaker.failure()
    breaker.failure()
    assert breaker.allow() and not breaker.is_open
    breaker.failure()
    assert breaker.is_open and breaker.opens == 1
    assert not breaker.allow() and not breaker.would_allow()


def test_one_probe_after_the_pause_and_a_failed_probe_reopens() -> None:
    breaker = CircuitBreaker(failure_threshold=1, reset_after_s=0)
    breaker.failure()
    assert breaker.would_allow() and breaker.would_allow()  # asking does not take the probe
    assert breaker.allow()
    assert not breaker.allow() and not breaker.would_allow()  # one probe at a time
    breaker.failure()
    assert breaker.is_open and breaker.opens == 1  # still the same outage
    assert breaker.allow()
    breaker.success()
    assert not breaker.is_open and breaker.allow() and breaker.allow()


def test_bad_settings_are_named() -> None:
    with pytest.raises(ValueError, match="failure_threshold must be at least 1, got 0"):
        CircuitBreaker(failure_threshold=0)
    with pytest.raises(ValueError, match="reset_after_s must be 0 or more, got -1"):
        CircuitBreaker(reset_after_s=-1)
