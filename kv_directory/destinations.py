"""The destinations of the transfers this directory replica recorded, kept for the nonce check.

A destination consumes its capability's nonce (ConsumeNonce) under mutual TLS, and only the
destination the transfer's record names may: its name was read from Redis on every call,
one more round trip on the hand-off's critical path before the nonce itself. The record's
destination never changes once reserved, so the replica that recorded the transfer keeps it
from the Reserve it answered and the nonce check reads no record; another replica (the
router's and the decode's calls may reach different ones) still reads it.

A kept name cannot outlive its record: a record lives at least the directory's record
retention (kept that long once its transaction ended), and an entry lasts half of it
(`lifetime_s`; a retention of 0 keeps nothing), so no other transfer can have taken its id
meanwhile.
An entry leaves at its nonce check (one capability, one check per transfer) or, past
`limit` entries, oldest first. Used on the event loop's thread only.
"""

from __future__ import annotations

import time
from collections import OrderedDict

MAX_KEPT = 65536


class KnownDestinations:
    """transfer id -> destination worker id, for `lifetime_s` at most; see the module docstring."""

    def __init__(self, lifetime_s: float, limit: int = MAX_KEPT):
        self.lifetime_s, self.limit = lifetime_s, limit
        self._kept: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def remember(self, transfer_id: str, destination: str) -> None:
        if self.lifetime_s <= 0 or self.limit <= 0:
            return
        self._kept[transfer_id] = (destination, time.monotonic() + self.lifetime_s)
        self._kept.move_to_end(transfer_id)
        while len(self._kept) > self.limit:
            self._kept.popitem(last=False)

    def take(self, transfer_id: str) -> str | None:
        """The kept destination of `transfer_id` (None: not kept, or kept too long), forgotten."""
        entry = self._kept.pop(transfer_id, None)
        if entry is None or entry[1] < time.monotonic():
            return None
        return entry[0]
