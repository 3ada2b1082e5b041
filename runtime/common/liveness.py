"""Whether a process on this host is still running (psutil): exited, or a zombie
not reaped yet, counts as gone; one we may not signal but that exists counts as
running."""

from __future__ import annotations

import psutil


def process_running(pid: int) -> bool:
    """True while `pid` is a running (or sleeping, stopped...) process, not a zombie."""
    if pid <= 0:
        return False
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
