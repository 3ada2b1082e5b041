"""Fixtures shared by every test tier (helpers: tests/support)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def redis_server():
    """A private redis-server on a free loopback port for the whole session.

    Tests share it, so each must use its own key prefix (or database); tests
    that stop or restart Redis start their own with ``start_redis()`` instead.
    """
    from tooling.cluster.redis_proc import start_redis  # only sessions that need Redis pay for it

    with start_redis() as server:
        yield server
