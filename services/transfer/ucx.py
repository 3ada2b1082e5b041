"""UCX backend (ucxx): chunks pushed zero-copy into the destination's posted buffers.

    ucx_wire.py      tags, authenticated control messages, addresses (version 2)
    ucx_runtime.py   the process's UCX worker: endpoints from worker addresses
                     (shared memory on one host), posted sends/receives, the sweep of
                     messages nobody receives
    ucx_mailbox.py   a mailbox of control messages on one tag; posting them under a key
    ucx_sender.py    UcxSender: byte credits, CHUNK + data then VISIBLE per chunk, timeouts, fences
    ucx_exchange.py  the sender's AUTH, its messages under the transfer's key, the replies it takes
    ucx_outgoing.py  the sender's records: peers, keys, outgoing transfers and messages
    ucx_credits.py   the sender's byte credit per peer
    ucx_receiver.py  UcxReceiver: posting views, keyed checksums, fence by drain
    ucx_intake.py    the receiver's way in: every message checked under its transfer's key
    ucx_inbound.py   the receiver's record of each transfer's sender; what it drops, counted

keys.py has the transfer key every message and chunk checksum is made with.

This module re-exports their public names; import the backend from here.
"""

from .ucx_receiver import UcxReceiver
from .ucx_sender import UcxSender

__all__ = ["UcxReceiver", "UcxSender"]
