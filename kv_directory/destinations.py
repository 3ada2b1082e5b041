"""A transfer's identity as this directory replica reserved it, and the destination a
signed capability names: what the hand-off's calls are checked against without reading
the transaction's record from Redis again.

Every transition (Begin, Publish, Abort, Release) and the nonce check (ConsumeNonce)
checks its caller and fences its request against the transaction's identity: the ends,
their epochs, the request id and the generation (``TransferSpec``). That identity never
changes once reserved, so the replica that answered the Reserve keeps it
(`KnownTransfers`) and checks those calls without the record's read: one Redis round
trip fewer on each, the destination's Publish on the hand-off's critical path among them.
What does change — the state, the source's declaration — is judged where it always was,
inside the store's one atomic script; a call that needs it before (a Publish with no
sealed declaration, a refusal that reports the state) reads the record as before.
Another replica (the router's and the decode's calls may reach different ones) reads it.

A kept identity cannot outlive its record: a record lives at least the directory's record
retention (kept that long once its transaction ended), and an entry lasts half of it
(`lifetime_s`; a retention of 0 keeps nothing), so no other transfer can have taken its id
meanwhile. An entry leaves once the transaction ended (released or aborted here) or, past
`limit` entries, oldest first. Used on the event loop's thread only.

A directory that holds the capability public keys (PD_CAPABILITY_PUBLIC_KEYS) needs no
record for the nonce check at all: the destination sends the router-signed capability with
its nonce, and the destination it names is the one (`signed_destination`). Every replica
can then check a nonce the moment a destination asks, before the router's Reserve of the
transfer landed anywhere: no asking again, no read. A capability under a key it has not
loaded (a rotation under way) falls back to the identity kept or the record.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict

from kv_directory.access import Denied
from pdserve_client.rpc.pd.v1 import directory_pb2
from runtime.directory.records import TransferSpec
from runtime.security.capability import CapabilityDenied, Verifier, nonce_key

MAX_KEPT = 16384
"""Identities kept at most (a few hundred bytes each): transfers in flight at once, per replica."""


class KnownTransfers:
    """transfer id -> its identity as reserved here, for `lifetime_s` at most; see the module docstring."""

    def __init__(self, lifetime_s: float, limit: int = MAX_KEPT):
        self.lifetime_s, self.limit = lifetime_s, limit
        self._kept: OrderedDict[str, tuple[TransferSpec, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def remember(self, spec: TransferSpec) -> None:
        """Keep `spec` (without its manifest: not part of the identity, and the largest part)."""
        if self.lifetime_s <= 0 or self.limit <= 0:
            return
        tid = spec.transfer_id
        self._kept[tid] = (dataclasses.replace(spec, manifest_blob=""), time.monotonic() + self.lifetime_s)
        self._kept.move_to_end(tid)
        while len(self._kept) > self.limit:
            self._kept.popitem(last=False)

    def get(self, transfer_id: str) -> TransferSpec | None:
        """The kept identity of `transfer_id` (None: not kept, or kept too long, then forgotten)."""
        entry = self._kept.get(transfer_id)
        if entry is None:
            return None
        if entry[1] < time.monotonic():
            del self._kept[transfer_id]
            return None
        return entry[0]

    def forget(self, transfer_id: str) -> None:
        """Its transaction ended: nothing will ask again (a late call reads the record)."""
        self._kept.pop(transfer_id, None)


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
