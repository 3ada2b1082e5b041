"""UCX backend (ucxx): chunks pushed zero-copy into the destination's posted buffers.

    ucx_wire.py      tags, control messages, addresses (version 1)
    ucx_runtime.py   the process's UCX worker: endpoints from worker addresses
                     (shared memory on one host), posted sends/receives, mailboxes
    ucx_sender.py    UcxSender: byte credits, CHUNK + data then VISIBLE per chunk, timeouts, fences
    ucx_receiver.py  UcxReceiver: posting views, checksums, fence by drain

This module re-exports their public names; import the backend from here.
"""

from .ucx_receiver import UcxReceiver
from .ucx_sender import UcxSender

__all__ = ["UcxReceiver", "UcxSender"]
