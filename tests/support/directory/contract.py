"""The DirectoryStore contract, run against every implementation.

A test module subclasses ``DirectoryContract`` and provides a ``harness``
fixture (a ``Harness``, tests/support/directory/harness.py): the memory store in
tests/unit, Redis in tests/integration. Every test ends with
``harness.assert_no_leaks(store)``: no transaction outside PUBLISHED / ABORTED /
RELEASED.
"""

from __future__ import annotations

from tests.support.directory.leases import LeaseContract
from tests.support.directory.lifecycle import LifecycleContract
from tests.support.directory.release import ReleaseContract


class DirectoryContract(LifecycleContract, LeaseContract, ReleaseContract):
    """Tests every DirectoryStore must pass. Subclasses supply ``harness``."""
