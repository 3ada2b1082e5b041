"""UCX backend (ucxx): chunks pushed zero-copy into the destination's posted buffers.

    wire.py      tags, authenticated control messages, addresses (version 2)
    runtime.py   the process's UCX worker: endpoints from worker addresses
                     (shared memory on one host), posted sends/receives, the sweep of
                     messages nobody receives
    mailbox.py   a mailbox of control messages on one tag; posting them under a key
    sender.py    UcxSender: byte credits, CHUNK + data then VISIBLE per chunk, timeouts, fences
    exchange.py  the sender's AUTH, its messages under the transfer's key, the replies it takes
    outgoing.py  the sender's records: peers, keys, outgoing transfers and messages
    credits.py   the sender's byte credit per peer
    receiver.py  UcxReceiver: posting views, keyed checksums, fence by drain
    intake.py    the receiver's way in: every message checked under its transfer's key
    inbound.py   the receiver's record of each transfer's sender; what it drops, counted

keys.py has the transfer key every message and chunk checksum is made with.

This module re-exports their public names; import the backend from here.
"""

from .receiver import UcxReceiver
from .sender import UcxSender

__all__ = ["UcxReceiver", "UcxSender"]
