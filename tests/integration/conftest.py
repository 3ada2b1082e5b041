"""Fixtures shared by the integration modules."""

from __future__ import annotations

import pytest

from tests.support.directory.grpc_process import DirectoryProcess


@pytest.fixture(scope="module")
def directory(redis_server):
    """A directory process (``python -m kv_directory``) per module that asks for one; its
    clean SIGTERM exit is checked at the end."""
    proc = DirectoryProcess(redis_server.url)
    yield proc
    assert proc.stop() == 0, proc.output()
