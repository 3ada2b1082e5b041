"""The capability mutation table (docs/design.md, Security), against a real cluster with mutual TLS on.

The test plays the router and a prefill worker: it reserves blocks at decode-0 with
the router's certificate, records the transaction, mints a capability with the
cluster's signing key, then presents it on the real data plane (TCP with TLS, and UCX)
from a sender holding prefill-0's certificate, followed by one chunk of bytes. A valid
capability lets the chunk land (the reserved blocks' K/V digest changes: the check
can see a write); each one-field mutation is refused with its reason code, the
reserved blocks' digest is what it was, the reservation still waits for the real
sender, and no block or transaction is left behind.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pdserve_client.rpc.pd.v1 import capability_pb2
from runtime.security.capability import PULL, Reason, Signer
from runtime.transfer.base import Chunk, ChunkKey, TransferError, chunk_checksum
from runtime.transfer.keys import TransferKey
from tests.support import ucx_loop
from tests.support.cluster import assert_cluster_clean, directory, start_cluster
from tests.support.router_role import (
    ISSUER,
    Held,
    assert_untouched,
    credential,
    grant_of,
    hold,
    mint,
    release,
    sender,
    signer,
    status,
)
from tooling.cluster.launcher import CAPABILITY_SIGNING_KEY


@pytest.fixture(scope="module", params=["tcp", "ucx"])
def cluster(request, tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp(f"caps-{request.param}"), prefill=1, decode=1,
                      transport=request.param, lease_ttl_s=2.0)
    yield c
    c.down()


@pytest.fixture(scope="module")
def run():
    """Runs a coroutine on the test process's UCX loop (tests/support/ucx_loop.py)."""
    return ucx_loop.run


async def attempt(cluster, held: Held, cred: dict | None, tx=None, probe: bool = True) -> str:
    """Present `cred` (None: none; over UCX an AUTH without a capability, over TCP no AUTH at
    all) with the attempt's transfer key, as the prefill does with its grant, and send the
    first expected chunk as random bytes (its checksum keyed); with `probe`, send it again
    once the replies are in: '' if nothing was refused, else the first refusal's reason (a
    refused sender's next send raises it)."""
    m, own = held.manifest, tx is None
    tx = tx or sender(cluster)
    await tx.start()
    dest = held.reservation.data_plane_address
    spec = m.expected_chunks[0]
    payload = os.urandom(spec.num_bytes)
    key = ChunkKey(spec.layer, spec.block_start, spec.block_count)
    chunk = Chunk(key, spec.num_bytes, chunk_checksum(TransferKey.of(m.transfer_id, held.key), key,
                                                      [memoryview(payload)]))
    try:
        await tx.present(dest, m.transfer_id, cred, held.key)
        await tx.send(dest, m.transfer_id, chunk, [memoryview(payload)])
        await asyncio.sleep(0.5)  # the replies come back asynchronously
        if probe:
            await tx.send(dest, m.transfer_id, chunk, [memoryview(payload)])
        return ""
    except TransferError as e:
        return str(e)
    finally:
        if own:
            await tx.close()


def flip(raw: bytes, field: str) -> bytes:
    signed = capability_pb2.SignedCapability.FromString(raw)
    blob = bytearray(getattr(signed, field))
    blob[len(blob) // 2] ^= 1
    setattr(signed, field, bytes(blob))
    return signed.SerializeToString()


def rekey(raw: bytes, key_id: str) -> bytes:
    signed = capability_pb2.SignedCapability.FromString(raw)
    signed.key_id = key_id
    return signed.SerializeToString()


def _outside(held: Held):
    regions = grant_of(held).regions
    return {"regions": regions[:-1]}  # the grant lacks one block the transfer needs


def _other_key(cluster, held: Held) -> bytes:
    return Signer(Ed25519PrivateKey.generate(), ISSUER).mint(grant_of(held)).raw


MUTATIONS = [  # (name, capability bytes from (cluster, held), credential changes, reason)
    ("tenant", lambda c, h: mint(c, h, tenant="other"), {}, Reason.TENANT),
    ("source worker", lambda c, h: mint(c, h, source_worker_id="prefill-9"), {}, Reason.SOURCE),
    ("source epoch", lambda c, h: mint(c, h, source_epoch=h.prefill_epoch + 1), {}, Reason.SOURCE),
    ("destination worker", lambda c, h: mint(c, h, destination_worker_id="decode-9"), {}, Reason.DESTINATION),
    ("destination epoch", lambda c, h: mint(c, h, destination_epoch=h.manifest.destination_epoch + 1), {},
     Reason.DESTINATION),
    ("transfer id", lambda c, h: mint(c, h, transfer_id=h.manifest.request_id + "/9"), {}, Reason.TRANSFER),
    ("generation", lambda c, h: mint(c, h, generation=2), {}, Reason.GENERATION),
    ("route epoch (old)", lambda c, h: mint(c, h, route_epoch=h.manifest.route_epoch - 1), {}, Reason.ROUTE_EPOCH),
    ("cache ABI", lambda c, h: mint(c, h, cache_abi_digest="f" * 64), {}, Reason.ABI),
    ("direction", lambda c, h: mint(c, h, direction=PULL), {}, Reason.DIRECTION),
    ("region one block outside the grant", lambda c, h: mint(c, h, **_outside(h)), {}, Reason.REGION),
    ("one byte over the bound", lambda c, h: mint(c, h, max_bytes=grant_of(h).max_bytes - 1), {}, Reason.BYTES),
    ("expired", lambda c, h: signer(c).mint(grant_of(h), now_ms=time.time_ns() // 10**6 - 31_000).raw, {},
     Reason.EXPIRED),
    ("lifetime over the limit", lambda c, h: mint(c, h, ttl_ms=301_000), {}, Reason.EXPIRED),
    ("untrusted issuer", lambda c, h: Signer.from_file(c.tls_dir / CAPABILITY_SIGNING_KEY, "router/evil")
     .mint(grant_of(h)).raw, {}, Reason.ISSUER),
    ("flipped signature byte", lambda c, h: flip(mint(c, h), "signature"), {}, Reason.SIGNATURE),
    ("flipped body byte", lambda c, h: flip(mint(c, h), "body"), {}, Reason.SIGNATURE),
    ("unknown key id", lambda c, h: rekey(mint(c, h), "0" * 16), {}, Reason.SIGNATURE),
    ("another key pair", _other_key, {}, Reason.SIGNATURE),
    ("another key pair with the real key id",
     lambda c, h: rekey(_other_key(c, h), signer(c).key_id), {}, Reason.SIGNATURE),
    ("garbage", lambda c, h: os.urandom(80), {}, Reason.SIGNATURE),
    ("empty", lambda c, h: b"", {}, Reason.SIGNATURE),
    ("nonce not the capability's", lambda c, h: mint(c, h), {"nonce": os.urandom(16).hex()}, Reason.NONCE),
]


@pytest.mark.parametrize("name,make,changes,reason", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_a_mutated_capability_is_refused_and_writes_nothing(cluster, run, name, make, changes, reason):
    held = hold(cluster, run)
    try:
        raw = make(cluster, held)
        why = run(attempt(cluster, held, credential(raw, held, **changes)))
        assert f"capability denied: {reason.value}:" in why, why
        assert "signature" not in why.split(":", 2)[-1] or reason is Reason.SIGNATURE
        assert not raw or base64.b64encode(raw).decode()[:24] not in why  # the raw capability never comes back
        assert_untouched(status(cluster, held.manifest.transfer_id), held)
    finally:
        release(cluster, held)


def test_a_valid_capability_lets_its_chunk_land(cluster, run):
    """The control: the same steps with the router's capability write the chunk (so the
    digest comparison above can see a write)."""
    held = hold(cluster, run)
    try:
        async def go():
            tx = sender(cluster)
            try:
                why = await attempt(cluster, held, credential(mint(cluster, held), held), tx=tx, probe=False)
                return why, status(cluster, held.manifest.transfer_id)  # before the sender leaves
            finally:
                await tx.close()
        why, now = run(go())
        assert why == ""
        assert now.chunks_received == 1 and now.reserved_kv_digest != held.digest
    finally:
        release(cluster, held)


def test_a_replayed_nonce_is_refused(cluster, run):
    """The capability's first presentation authorizes its sender; the same capability
    from a second connection is a replay: NONCE, and nothing of that sender lands."""
    held = hold(cluster, run)
    try:
        cred = credential(mint(cluster, held), held)

        async def go():
            first, second = sender(cluster), sender(cluster)
            try:
                await first.start()
                await first.present(held.reservation.data_plane_address, held.manifest.transfer_id, cred, held.key)
                await asyncio.sleep(0.3)
                why = await attempt(cluster, held, cred, tx=second)
                return why, status(cluster, held.manifest.transfer_id)  # while the first sender is connected
            finally:
                await first.close()
                await second.close()
        why, now = run(go())
        assert f"capability denied: {Reason.NONCE.value}:" in why, why
        assert_untouched(now, held)
    finally:
        release(cluster, held)


def test_chunks_without_a_capability_are_refused(cluster, run):
    """TCP: chunks with no AUTH before them. UCX (where every transfer opens with an AUTH):
    an AUTH under the transfer's key with no capability in it, then the chunk."""
    held = hold(cluster, run)
    try:
        why = run(attempt(cluster, held, None))
        expected = "no accepted capability" if cluster.spec.transport == "tcp" else "capability denied: signature:"
        assert expected in why, why
        assert_untouched(status(cluster, held.manifest.transfer_id), held)
    finally:
        release(cluster, held)


def test_a_sender_claiming_another_source_is_refused(cluster, run):
    """TCP: the sender's TLS certificate (prefill-0) must be the source it claims, even
    under a capability minted for that claim. UCX knows no certificates: there the
    claim must be the capability's source."""
    held = hold(cluster, run)
    try:
        minted_for = "prefill-9" if cluster.spec.transport == "tcp" else "prefill-0"
        raw = mint(cluster, held, source_worker_id=minted_for)
        why = run(attempt(cluster, held, credential(raw, held, source_worker_id="prefill-9")))
        assert f"capability denied: {Reason.SOURCE.value}:" in why, why
        assert_untouched(status(cluster, held.manifest.transfer_id), held)
    finally:
        release(cluster, held)


def test_advancing_the_route_epoch_revokes_capabilities_and_nothing_leaks(cluster, run):
    """Last in the module: REVOKE_CAPABILITIES of the rollback order, then the leak check."""
    held = hold(cluster, run)
    try:
        raw = mint(cluster, held)

        async def advance():
            async with directory(cluster, "operator") as d:
                await d.advance_route_epoch(reason="capability revocation test")
        run(advance())
        why = run(attempt(cluster, held, credential(raw, held)))
        assert f"capability denied: {Reason.ROUTE_EPOCH.value}:" in why, why
    finally:
        release(cluster, held)
    assert_cluster_clean(cluster)
