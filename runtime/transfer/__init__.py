"""pdserve data plane: K/V transfer backends behind one interface (see base.py)."""

from .base import (
                   CHECKSUM_ALGORITHM,
                   TOKEN_FOLLOWS,
                   Chunk,
                   ChunkArrived,
                   ChunkKey,
                   Expectation,
                   Failed,
                   KVReceiver,
                   KVSender,
                   TransferCommit,
                   TransferError,
                   Verdict,
                   checksum,
                   chunk_checksum,
                   token_follows,
)
from .keys import TransferKey, new_key

__all__ = ["CHECKSUM_ALGORITHM", "Chunk", "ChunkArrived", "ChunkKey", "Expectation", "Failed",
           "KVReceiver", "KVSender", "TOKEN_FOLLOWS", "TransferCommit", "TransferError", "Verdict",
           "TransferKey", "checksum", "chunk_checksum", "new_key", "token_follows"]
