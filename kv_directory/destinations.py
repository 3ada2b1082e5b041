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

A directory that holds the capability public keys (PD_CAPABILITY_PUBLIC_KEYS) needs neither:
the destination sends the router-signed capability with its nonce, and the destination it
names is the one (`signed_destination`). Every replica can then check a nonce the moment a
destination asks, before the router's Reserve of the transfer landed anywhere: no asking
again, no read. A capability under a key it has not loaded (a rotation under way) falls
back to the record.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from kv_directory.access import Denied
from pdserve_client.rpc.pd.v1 import directory_pb2
from services.security.capability import CapabilityDenied, Verifier, nonce_key

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


def signed_destination(verifier: Verifier, request: directory_pb2.ConsumeNonceRequest, now_ms: int) -> str | None:
    """The destination worker id the request's capability names, once it is the router's
    (signature, trusted issuer, not expired) and minted for exactly this nonce check (its
    transfer, nonce, expiry and route epoch are the request's); else Denied, saying which.
    None for a capability signed with a key this directory has not loaded (a rotation
    under way: the workers hold the new key set, this process was started before it):
    the transfer's record names the destination then, as without keys."""
    tid = request.transfer_id
    try:
        signed = verifier.signed(request.capability)
        if signed.key_id not in verifier.keys:
            return None
        cap = verifier.opened(signed, request.capability)
    except CapabilityDenied as e:
        raise Denied(f"{e} (transfer {tid!r})") from None
    try:
        verifier.current(cap, now_ms, tid)
    except CapabilityDenied as e:
        raise Denied(str(e)) from None
    checks = (
        (cap.transfer_id == tid, lambda: f"minted for transfer {cap.transfer_id!r}"),
        (nonce_key(cap.nonce) == request.nonce, lambda: "minted for another nonce"),
        (cap.expires_unix_ms == request.expires_unix_ms,
         lambda: f"expires at {cap.expires_unix_ms}, not {request.expires_unix_ms}"),
        (cap.route_epoch == request.route_epoch, lambda: f"route epoch {cap.route_epoch} != {request.route_epoch}"),
    )
    for passed, detail in checks:
        if not passed:
            raise Denied(f"capability denied: {detail()} (transfer {tid!r})")
    return cap.destination_worker_id
