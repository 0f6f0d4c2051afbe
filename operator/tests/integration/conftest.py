"""Fixtures the integration modules share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes.dynamic import DynamicClient

from .test_modelcache_support import Heartbeat


@pytest.fixture
def nodes(k8s: DynamicClient) -> Iterator[Heartbeat]:
    """Fake nodes a test adds, kept Ready by heartbeats and deleted at its end."""
    heartbeat = Heartbeat(k8s)
    yield heartbeat
    heartbeat.stop()
