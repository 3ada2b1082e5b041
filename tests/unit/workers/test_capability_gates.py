"""The workers' capability gates (runtime/worker/capabilities.py) over a real signing key:
the destination's check of the router's copy ahead of the sender, and the sender's AUTH
against it. The directory's ConsumeNonce is a set here (its own tests are elsewhere)."""

from __future__ import annotations

import asyncio
import base64

import pytest

from runtime.security.capability import PUSH, CapabilityDenied, Grant, Reason, Signer, Verifier
from runtime.worker.capabilities import DestinationGate, FromRouter
from tests.support import pki

REGIONS = (3, 4, 5)
ASK = dict(tenant="t", transfer_id="r/1", generation=1, regions=REGIONS, num_bytes=300)


def mint(**changes) -> bytes:
    signing, _ = pki.capability_keys()
    grant = dict(tenant="t", source_worker_id="p0", source_epoch=2, destination_worker_id="d0",
                 destination_epoch=3, transfer_id="r/1", generation=1, route_epoch=9, cache_abi_digest="abi",
                 direction=PUSH, regions=REGIONS, max_bytes=300, ttl_ms=30_000)
    return Signer.from_file(signing, "router/router").mint(Grant(**{**grant, **changes})).raw


def gate(consumed: list, sent: list | None = None) -> DestinationGate:
    _, public = pki.capability_keys()
    sent = [] if sent is None else sent

    async def consume(nonce, expires, transfer_id, route_epoch, capability):
        consumed.append(nonce)
        sent.append(capability)
        return consumed.count(nonce) == 1
    return DestinationGate(Verifier.from_file(public, ["router/router"], 300_000), "d0", lambda: 3, "abi", consume)


def credential(raw: bytes, source: str = "p0") -> dict:
    from runtime.worker.capabilities import _nonce_of
    return {"capability": base64.b64encode(raw).decode(), "source_worker_id": source, "source_epoch": 2,
            "nonce": _nonce_of(raw).hex()}


def test_the_copy_ahead_is_checked_once_and_binds_the_first_sender_only():
    async def go():
        consumed, sent = [], []
        g, raw = gate(consumed, sent), mint()
        ahead = g.ahead(raw, **ASK)
        await asyncio.sleep(0)
        grant = await g.check(credential(raw), "p0", **ASK, router=FromRouter(ahead))
        with pytest.raises(CapabilityDenied) as replay:
            await g.check(credential(raw), "p0", **ASK, router=FromRouter(ahead))
        return consumed, sent, raw, grant, replay.value.reason
    consumed, sent, raw, grant, reason = asyncio.run(go())
    assert len(consumed) == 1 and grant.blocks == frozenset(REGIONS) and grant.max_bytes == 300
    assert sent == [raw]  # the signed capability goes with its nonce: the directory checks it itself
    assert reason is Reason.NONCE


@pytest.mark.parametrize("changes,credential_source,reason", [
    ({"ttl_ms": 301_000}, "p0", Reason.EXPIRED),
    ({"tenant": "other"}, "p0", Reason.TENANT),
    ({"regions": (3, 4)}, "p0", Reason.REGION),
    ({}, "p9", Reason.SOURCE),  # the sender is not the capability's source
])
def test_a_bad_copy_ahead_or_another_sender_is_refused_with_its_reason(changes, credential_source, reason):
    async def go():
        g, raw = gate([]), mint(**changes)
        ahead = g.ahead(raw, **ASK)
        with pytest.raises(CapabilityDenied) as denied:
            await g.check(credential(raw, credential_source), None, **ASK, router=FromRouter(ahead))
        return denied.value.reason
    assert asyncio.run(go()) is reason


def test_another_capability_than_the_copy_ahead_is_checked_the_full_way():
    async def go():
        consumed = []
        g = gate(consumed)
        ahead = g.ahead(mint(), **ASK)
        other = mint()  # a second, valid capability for the same transfer: its own nonce
        grant = await g.check(credential(other), "p0", **ASK, router=FromRouter(ahead))
        await ahead.checked
        return consumed, grant
    consumed, grant = asyncio.run(go())
    assert len(consumed) == 2 and len(set(consumed)) == 2 and grant.max_bytes == 300


def test_a_transfer_the_directory_has_not_recorded_is_asked_about_once_more_only_on_the_routers_word():
    """One-way: the router sends its DecodeStream once the directory recorded the transfer.
    A sender's AUTH that finds no record before that stream came waits for it (`recorded`)
    and asks once more; without that word (or after it) "not recorded" is the answer,
    refused (TRANSFER) at once."""
    from runtime.directory.client import NonceRefused, TransferNotRecorded

    def gate_of(answers: list):
        _, public = pki.capability_keys()
        asked = []

        async def consume(nonce, expires, transfer_id, route_epoch, capability):
            asked.append(nonce)
            answer = answers.pop(0) if answers else TransferNotRecorded(transfer_id)
            if isinstance(answer, Exception):
                raise answer
            return answer
        return DestinationGate(Verifier.from_file(public, ["router/router"], 300_000), "d0", lambda: 3, "abi",
                               consume), asked

    async def go(answers, recorded: asyncio.Event | None = None, stream_after_s: float | None = None):
        g, asked = gate_of(answers)
        raw = mint()
        if stream_after_s is not None:
            asyncio.get_running_loop().call_later(stream_after_s, recorded.set)
        try:
            return await g.check(credential(raw), "p0", **ASK, router=FromRouter(recorded=recorded)), asked
        except CapabilityDenied as e:
            return e, asked
    grant, asked = asyncio.run(go([True]))
    assert grant.blocks == frozenset(REGIONS) and len(asked) == 1
    denied, asked = asyncio.run(go([TransferNotRecorded("r/1"), True]))  # no word from the router: the answer
    assert isinstance(denied, CapabilityDenied) and denied.reason is Reason.TRANSFER and len(asked) == 1
    assert "r/1" in str(denied) and "records a transfer before its DecodeStream leaves" in str(denied)

    async def came_later():
        return await go([TransferNotRecorded("r/1"), True], asyncio.Event(), stream_after_s=0.05)
    grant, asked = asyncio.run(came_later())  # the stream came after the AUTH: asked once more, admitted
    assert grant.blocks == frozenset(REGIONS) and len(asked) == 2 and len(set(asked)) == 1

    async def came_already():
        recorded = asyncio.Event()
        recorded.set()
        return await go([TransferNotRecorded("r/1"), True], recorded)
    denied, asked = asyncio.run(came_already())  # recorded, yet none: given up, not asked again
    assert isinstance(denied, CapabilityDenied) and denied.reason is Reason.TRANSFER and len(asked) == 1
    # The directory refusing the check (its own look at the capability, or the caller) is a
    # refusal of the capability, counted as one, and not asked again.
    refused, asked = asyncio.run(go([NonceRefused("capability denied: expired: expires in -3 ms")]))
    assert isinstance(refused, CapabilityDenied) and refused.reason is Reason.NONCE and len(asked) == 1
    assert "the directory refused the nonce check: capability denied: expired" in str(refused)
