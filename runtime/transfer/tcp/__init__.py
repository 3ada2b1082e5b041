"""TCP backend: chunks pushed over one framed TCP connection per (sender, receiver).

The protocol is documented with the code that implements it:

    wire.py      wire format, version 1: frames, the COMMIT JSON codec, which
                     frames get a reply
    receiver.py  TcpReceiver: the rules it applies to each frame, and the safety
                     invariant that no byte lands in a view after forget/stop/Failed
    sender.py    TcpSender: one connection per destination, timeouts, replies

This module re-exports their public names; import the backend from here.
"""

from .receiver import TcpReceiver
from .sender import TcpSender
from .wire import (
                       ABORT,
                       CHUNK,
                       CHUNK_HEAD,
                       COMMIT,
                       ERROR,
                       FRAME,
                       MAGIC,
                       MAX_CONTROL_BODY_BYTES,
                       MAX_ID_BYTES,
                       VERDICT,
                       VERSION,
                       ProtocolError,
                       chunk_frame,
                       control_frame,
                       decode_commit,
                       encode_commit,
                       frame,
                       parse_address,
)

__all__ = ["TcpReceiver", "TcpSender", "ProtocolError", "MAGIC", "VERSION", "CHUNK", "COMMIT",
           "ABORT", "VERDICT", "ERROR", "FRAME", "CHUNK_HEAD", "MAX_ID_BYTES",
           "MAX_CONTROL_BODY_BYTES", "frame", "chunk_frame", "control_frame", "encode_commit",
           "decode_commit", "parse_address"]
