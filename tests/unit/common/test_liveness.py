"""runtime/common/liveness.py: a zombie (exited, not reaped) is gone, like a reaped
process; a running one is running."""

from __future__ import annotations

import os
import subprocess
import time

from runtime.common.liveness import process_running


def test_running_exited_unreaped_and_reaped():
    assert process_running(os.getpid())
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert process_running(child.pid)
    finally:
        child.kill()
    deadline = time.monotonic() + 5
    while process_running(child.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not process_running(child.pid)  # a zombie until waited for
    child.wait()
    assert not process_running(child.pid)
    assert not process_running(0) and not process_running(-1)
