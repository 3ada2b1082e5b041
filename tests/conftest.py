"""Fixtures shared by every test tier."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Shared contract modules (tests/*_contract.py) import as top-level modules,
# whether or not tests/ later becomes a package.
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)


@pytest.fixture(scope="session")
def redis_server():
    """A private redis-server on a free loopback port for the whole session.

    Tests share it, so each must use its own key prefix (or database); tests
    that stop or restart Redis start their own with ``start_redis()`` instead.
    """
    from services.cluster.redis_proc import start_redis  # only sessions that need Redis pay for it

    with start_redis() as server:
        yield server
