"""Playing the router against a real local cluster (tests/support/cluster.py): hold one
attempt's blocks at decode-0 with its transaction recorded and its transfer key minted
(`hold`), mint its capability with the cluster's signing key (`mint`, `credential`), read
the reservation (`status`, `assert_untouched`) and give it up (`release`): what the
capability tests and the data plane's attack tests build their transfers from."""

from __future__ import annotations

import base64
import dataclasses
import uuid

from google.protobuf.message import DecodeError

from pdserve_client.rpc.pd.v1 import capability_pb2, common_pb2, decode_pb2, decode_pb2_grpc, manifest_pb2
from router.convert import reservation_from_pb
from router.requests.handoff import build_manifest, grant
from runtime.security.capability import Signer
from runtime.transfer.keys import new_key
from tests.support.cluster import channel, directory
from tooling.cluster.launcher import CAPABILITY_SIGNING_KEY

PROMPT = [5 + (11 * i) % 400 for i in range(64)]  # 4 blocks of 16
ISSUER = "router/router"


@dataclasses.dataclass
class Held:
    """One reservation at decode-0 with its transaction, ready for a capability."""

    manifest: object
    reservation: object
    prefill_epoch: int
    digest: str
    key: bytes
    """The attempt's transfer key, as the router minted it (Reserve and the grant carry it)."""


def decode_stub(cluster):
    """decode-0's Decode service, called as the router."""
    return decode_pb2_grpc.DecodeStub(channel(cluster, "decode-0", "router"))


def status(cluster, tid: str) -> decode_pb2.TransferStatusResponse:
    """decode-0's TransferStatus of `tid` (its state, chunks received, the reserved blocks' digest)."""
    return decode_stub(cluster).TransferStatus(decode_pb2.TransferStatusRequest(transfer_id=tid), timeout=10)


def hold(cluster, run) -> Held:
    """Decode.Reserve and Directory.Reserve, as the router does for one attempt."""
    rid, key = uuid.uuid4().hex, new_key()
    reply = decode_stub(cluster).Reserve(decode_pb2.DecodeReserveRequest(
        request_id=rid, tenant="default", generation=1, prompt_token_ids=PROMPT, max_tokens=2,
        sampling=common_pb2.SamplingParams(), transfer_key=key), timeout=10)
    reservation = reservation_from_pb(reply)

    async def record():
        async with directory(cluster, "router") as d:
            snap = await d.snapshot()
            workers = {w.worker_id: w for w in snap.workers}
            m = build_manifest(request_id=rid, tenant="default", generation=1, prompt=PROMPT,
                               prefill=workers["prefill-0"], decode=workers["decode-0"], reservation=reservation,
                               route_epoch=snap.route_epoch)
            assert (await d.reserve(m)).ok
            return m, workers["prefill-0"].epoch
    manifest, epoch = run(record())
    return Held(manifest, reservation, epoch, status(cluster, manifest.transfer_id).reserved_kv_digest, key)


def assert_untouched(now: decode_pb2.TransferStatusResponse, held: Held) -> None:
    """Nothing landed: no chunk, the reserved blocks' digest as at Reserve, and the
    reservation still waiting for the sender that holds the capability."""
    assert (now.state, now.chunks_received, now.reserved_kv_digest) == \
        (manifest_pb2.TXN_STATE_RESERVED, 0, held.digest)


def release(cluster, held: Held) -> None:
    """What the router does when an attempt is given up: Decode.Cancel (the reservation
    aborts its transaction and frees its blocks)."""
    decode_stub(cluster).Cancel(common_pb2.CancelRequest(request_id=held.manifest.request_id), timeout=10)


def signer(cluster) -> Signer:
    """The router's capability signer, with the key the launcher made."""
    return Signer.from_file(cluster.tls_dir / CAPABILITY_SIGNING_KEY, ISSUER)


def credential(raw: bytes, held: Held, **over) -> dict:
    """What a prefill worker presents: the capability, its own name and the nonce it binds."""
    try:
        nonce = capability_pb2.TransferCapability.FromString(capability_pb2.SignedCapability.FromString(raw).body).nonce
    except DecodeError:  # garbage: any nonce; the signature check comes first
        nonce = b"\0" * 16
    return {"capability": base64.b64encode(raw).decode(), "source_worker_id": "prefill-0",
            "source_epoch": held.prefill_epoch, "nonce": nonce.hex(), **over}


def sender(cluster):
    """A sender as prefill-0's would be (TCP: with its certificate; UCX needs none)."""
    if cluster.spec.transport == "tcp":
        from runtime.transfer.tcp import TcpSender
        return TcpSender(ssl_context=cluster.identity("prefill-0").client_ssl(), io_timeout_s=10)
    from runtime.transfer.ucx import UcxSender
    return UcxSender(io_timeout_s=10)


def grant_of(held: Held, **changes):
    """The router's grant for the held attempt (`changes`: fields to mutate)."""
    return dataclasses.replace(grant(held.manifest, held.reservation, 30_000), **changes)


def mint(cluster, held: Held, **changes) -> bytes:
    """The held attempt's capability, signed with the cluster's key."""
    return signer(cluster).mint(grant_of(held, **changes)).raw
