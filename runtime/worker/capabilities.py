"""The workers' side of transfer capabilities (docs/design.md, Security; runtime/security/capability.py).

The router mints one capability per attempt and gives it to prefill with the manifest.

- Prefill (`SourceGate.check`) verifies it before reading any K/V or sending: it must
  grant exactly this manifest's transfer from this worker (its id and epoch) to the
  manifest's destination blocks. It then presents it to the destination (AUTH on the
  data plane) with the nonce it binds.
- Decode (`DestinationGate.check`) verifies it against its own reservation — its
  tenant, transfer, generation, the blocks reserved for the transfer set and their
  bytes — before any receive is posted; the sender's name must be the capability's
  source when the transport authenticated it (TLS); then the destination consumes
  the nonce once in the directory, which also refuses a capability of an older route
  epoch in the same atomic step (revocation). Only then may chunks land, each inside
  the granted blocks and the byte bound (`Grant` on the reservation).
- The router also hands decode its copy of the capability with DecodeStream, which it
  calls while prefill computes (`DestinationGate.ahead`): the checks and the nonce's
  directory round trip happen then, off the hand-off's critical path, and the
  sender's AUTH is a comparison (same capability, its source, not claimed before).

A denial is `CapabilityDenied` with its reason; nothing is written, nothing leaks.
Each gate tells its `on_denied` the reason of every denial it raises (the worker's
pd_capability_denials_total).
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pdserve_client.rpc.pd.v1 import capability_pb2
from runtime.directory.client import NonceRefused, StaleRouteEpoch, TransferNotRecorded
from runtime.security.capability import (
    PUSH,
    CapabilityDenied,
    Reason,
    TransferAsk,
    Verifier,
    nonce_key,
)
from runtime.transfer.base import ChunkKey


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def physical_blocks(block_ids: Sequence[int], chunks: Iterable[ChunkKey]) -> tuple[int, ...]:
    """The physical block ids the chunks' logical blocks land in (sorted, unique)."""
    out = set()
    for k in chunks:
        for b in range(k.block_start, k.block_start + k.block_count):
            if b >= len(block_ids):
                raise ValueError(f"chunk {k} is past the reservation's {len(block_ids)} blocks")
            out.add(block_ids[b])
    return tuple(sorted(out))


def _nonce_of(raw: bytes) -> bytes:
    """The nonce inside a signed capability, unverified (the receiver verifies)."""
    try:
        signed = capability_pb2.SignedCapability.FromString(raw)
        return capability_pb2.TransferCapability.FromString(signed.body).nonce
    except Exception:  # noqa: BLE001 - garbage is the verifier's to refuse (SIGNATURE)
        return b""


@dataclass(frozen=True, slots=True)
class Grant:
    """What an authorized transfer may write: these physical blocks, this many bytes."""

    blocks: frozenset[int]
    max_bytes: int


@dataclass
class Ahead:
    """A capability the router handed the destination ahead of the sender (DecodeStream):
    checked, and its nonce consumed, while prefill computes."""

    raw: bytes
    checked: asyncio.Future
    """-> the verified TransferCapability, or CapabilityDenied."""
    claimed: bool = False
    """A sender presented it and was admitted: nobody else may."""


@dataclass(frozen=True, slots=True)
class FromRouter:
    """What the router told a destination of a transfer, for its sender's check."""

    ahead: Ahead | None = None
    """Its copy of the capability (DecodeStream), checked ahead of the sender's."""
    recorded: asyncio.Event | None = None
    """Set once its DecodeStream came: the directory holds the transfer's record (the
    router sends the stream only then: docs/design.md, "The protocol is one-way")."""


def _ignore(_reason: str) -> None:
    pass


class SourceGate:
    """Prefill: a capability must grant exactly the manifest's transfer from this worker."""

    def __init__(self, verifier: Verifier, worker_id: str, epoch: Callable[[], int], abi_digest: str,
                 on_denied: Callable[[str], None] = _ignore):
        self.verifier, self.worker_id, self.epoch, self.abi_digest = verifier, worker_id, epoch, abi_digest
        self.on_denied = on_denied

    def check(self, raw: bytes, manifest, chunks: Sequence[ChunkKey], num_bytes: int) -> dict:
        """The credential to present to the destination; CapabilityDenied if refused."""
        try:
            return self._check(raw, manifest, chunks, num_bytes)
        except CapabilityDenied as e:
            self.on_denied(e.reason.value)
            raise

    def _check(self, raw: bytes, manifest, chunks: Sequence[ChunkKey], num_bytes: int) -> dict:
        if not raw:
            raise CapabilityDenied(Reason.SIGNATURE, f"no capability for transfer {manifest.transfer_id!r}")
        try:
            regions = physical_blocks(manifest.destination_block_ids, chunks)
        except ValueError as e:
            raise CapabilityDenied(Reason.REGION, str(e)) from None
        nonce, epoch = _nonce_of(raw), self.epoch()
        ask = TransferAsk(
            tenant=manifest.tenant, source_worker_id=self.worker_id, source_epoch=epoch,
            destination_worker_id=manifest.destination_worker_id, destination_epoch=manifest.destination_epoch,
            transfer_id=manifest.transfer_id, generation=manifest.generation, cache_abi_digest=self.abi_digest,
            direction=PUSH, regions=regions, num_bytes=num_bytes, nonce=nonce)
        self.verifier.authorize(raw, ask, manifest.route_epoch, _now_ms())
        return {"capability": base64.b64encode(raw).decode(), "source_worker_id": self.worker_id,
                "source_epoch": epoch, "nonce": nonce.hex()}


class DestinationGate:
    """Decode: a sender's credential against this worker's own reservation."""

    def __init__(self, verifier: Verifier, worker_id: str, epoch: Callable[[], int], abi_digest: str,
                 consume: Callable, on_denied: Callable[[str], None] = _ignore):
        """consume(nonce_hex, expires_unix_ms, transfer_id, route_epoch, capability) -> bool
        (the directory's ConsumeNonce, sent the signed capability; raises StaleRouteEpoch)."""
        self.verifier, self.worker_id, self.epoch, self.abi_digest = verifier, worker_id, epoch, abi_digest
        self._consume = consume
        self.on_denied = on_denied

    def ahead(self, raw: bytes, *, tenant: str, transfer_id: str, generation: int, regions: tuple[int, ...],
              num_bytes: int) -> Ahead:
        """Start checking the router's copy of the capability now (every check, the source
        taken from the capability itself, then the nonce consumed); `check` finishes it."""
        async def run():
            body = self.verifier.verified_body(raw)  # SIGNATURE first, as in authorize
            ask = self._ask(tenant, body.source_worker_id, body.source_epoch, transfer_id, generation, regions,
                            num_bytes, body.nonce)
            return await self._consume_once(self.verifier.check(body, ask, None, _now_ms()), transfer_id, raw)
        checked = asyncio.ensure_future(run())
        checked.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: `check` re-raises it
        return Ahead(raw, checked)

    async def check(self, credential: dict, peer: str | None, *, tenant: str, transfer_id: str, generation: int,
                    regions: tuple[int, ...], num_bytes: int, router: FromRouter = FromRouter()) -> Grant:
        """The grant of a sender's credential; CapabilityDenied (counted) if refused. A
        refusal of the router's copy (`router.ahead`) is counted here, when a sender presents."""
        try:
            return await self._check(credential, peer, tenant=tenant, transfer_id=transfer_id,
                                     generation=generation, regions=regions, num_bytes=num_bytes, router=router)
        except CapabilityDenied as e:
            self.on_denied(e.reason.value)
            raise

    async def _check(self, credential: dict, peer: str | None, *, tenant: str, transfer_id: str, generation: int,
                     regions: tuple[int, ...], num_bytes: int, router: FromRouter = FromRouter()) -> Grant:
        ahead = router.ahead
        try:
            raw = base64.b64decode(str(credential["capability"]), validate=True)
            source, source_epoch = str(credential["source_worker_id"]), int(credential["source_epoch"])
            nonce = bytes.fromhex(str(credential["nonce"]))
        except (KeyError, TypeError, ValueError) as e:
            raise CapabilityDenied(Reason.SIGNATURE, f"malformed credential ({type(e).__name__})") from None
        if peer is not None and peer != source:
            raise CapabilityDenied(Reason.SOURCE, f"sender {peer!r} (by its certificate) claims source {source!r}")
        if ahead is not None and hmac.compare_digest(raw, ahead.raw):
            cap = await ahead.checked  # CapabilityDenied if the router's copy failed a check
            if (source, source_epoch) != (cap.source_worker_id, cap.source_epoch):
                raise CapabilityDenied(Reason.SOURCE, f"source {(cap.source_worker_id, cap.source_epoch)} != "
                                                      f"{(source, source_epoch)} (transfer {transfer_id!r})")
            if ahead.claimed or not hmac.compare_digest(nonce, cap.nonce):
                raise CapabilityDenied(Reason.NONCE, f"nonce already used or not bound (transfer {transfer_id!r})")
            ahead.claimed = True
            return Grant(frozenset(cap.regions), cap.max_bytes)
        ask = self._ask(tenant, source, source_epoch, transfer_id, generation, regions, num_bytes, nonce)
        cap = await self._consume_once(self.verifier.authorize(raw, ask, None, _now_ms()), transfer_id, raw,
                                       router.recorded)
        return Grant(frozenset(cap.regions), cap.max_bytes)

    def _ask(self, tenant: str, source: str, source_epoch: int, transfer_id: str, generation: int,
             regions: tuple[int, ...], num_bytes: int, nonce: bytes) -> TransferAsk:
        """What this destination asks of a capability (verified with route epoch None:
        the directory compares it in `_consume_once`, atomically)."""
        return TransferAsk(
            tenant=tenant, source_worker_id=source, source_epoch=source_epoch, destination_worker_id=self.worker_id,
            destination_epoch=self.epoch(), transfer_id=transfer_id, generation=generation,
            cache_abi_digest=self.abi_digest, direction=PUSH, regions=regions, num_bytes=num_bytes, nonce=nonce)

    async def _consume_once(self, cap, transfer_id: str, raw: bytes, recorded: asyncio.Event | None = None):
        """Consume the verified capability's nonce once, under its route epoch. A directory
        with the keys checks the signed capability `raw` and needs no record; one without
        them reads the transfer's record. The router sends its DecodeStream only once the
        directory recorded the transfer (docs/design.md, "The protocol is one-way"): a
        sender's AUTH that came before it and finds no record waits for `recorded` (the
        stream came), within the capability's lifetime, and asks once more; without
        `recorded` (the router's own copy, sent after the record) the answer stands."""
        async def consume() -> bool:
            return await self._consume(nonce_key(cap.nonce), cap.expires_unix_ms, transfer_id, cap.route_epoch, raw)
        try:
            try:
                fresh = await consume()
            except TransferNotRecorded:
                if recorded is None or recorded.is_set():
                    raise
                try:
                    async with asyncio.timeout(max(0.0, (cap.expires_unix_ms - _now_ms()) / 1000)):
                        await recorded.wait()
                except TimeoutError:
                    raise TransferNotRecorded(f"no record of transfer {transfer_id!r} and no word from the router "
                                              "that there is one") from None
                fresh = await consume()
        except NonceRefused as e:
            raise CapabilityDenied(Reason.NONCE, f"the directory refused the nonce check: {e} "
                                                 f"(transfer {transfer_id!r})") from None
        except StaleRouteEpoch as e:
            raise CapabilityDenied(Reason.ROUTE_EPOCH, f"{e} (transfer {transfer_id!r})") from None
        except TransferNotRecorded as e:
            raise CapabilityDenied(Reason.TRANSFER, f"{e}: the router records a transfer before its "
                                                    "DecodeStream leaves (given up, or never made)") from None
        if not fresh:
            raise CapabilityDenied(Reason.NONCE, f"nonce already used (transfer {transfer_id!r})")
        return cap
