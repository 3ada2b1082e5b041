"""The router's edge (router/edge): the wire reading agrees with the parser, refusals
quote a bounded prefix, and the intake budget charges and gives back.

Through gRPC in one process (the rig of test_server.py): a 1 MB tenant or request id is
INVALID_ARGUMENT with a short message, a prompt longer than any worker takes is refused
before it is parsed, and requests over the intake budget are RESOURCE_EXHAUSTED."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from pdserve_client import contract
from pdserve_client.rpc.pd.v1 import common_pb2, router_pb2
from router.edge import wire
from router.edge.budget import IntakeBudget
from router.edge.heap import LARGE_BLOCK_BYTES, TRIM_AGAIN_S, Heap
from router.edge.intake import Intake, sizes_of
from router.edge.refusal import MAX_MESSAGE_CHARS, QUOTE_CHARS, Refusal, bounded, quote
from router.requests.admission import max_model_len
from router.types import RouterError, StatusCode
from runtime.directory.records import ClusterSnapshot, WorkerCapacity, WorkerRecord, WorkerRole
from tests.unit.router.test_server import CAP, FakeDirectory, request, rig, run

MB = 1 << 20

# ---- the wire reading ----------------------------------------------------------------

messages = st.builds(
    router_pb2.GenerateRequest,
    request_id=st.text(max_size=40), tenant=st.text(max_size=40),
    prompt_token_ids=st.one_of(st.none(), st.builds(common_pb2.TokenIds, ids=st.lists(
        st.integers(0, 2**32 - 1), max_size=300))),
    max_tokens=st.integers(0, 2**32 - 1), deadline_ms=st.integers(0, 2**32 - 1),
    sampling=st.builds(common_pb2.SamplingParams, temperature=st.floats(0, 2), seed=st.integers(0, 2**63)))


@given(messages, st.lists(messages, max_size=3))
@settings(max_examples=200, deadline=None)
def test_the_wire_reading_agrees_with_the_parser(first, more):
    """Any message (and concatenations: later scalars win, messages merge, the oneof switches)."""
    data = first.SerializeToString() + b"".join(m.SerializeToString() for m in more)
    assert wire.sizes(data) == sizes_of(router_pb2.GenerateRequest.FromString(data))


@given(st.binary(max_size=64))
@settings(max_examples=500, deadline=None)
def test_any_bytes_are_read_or_left_to_the_parser_and_never_misread(data):
    read = wire.sizes(data)
    try:
        parsed = router_pb2.GenerateRequest.FromString(data)
    except DecodeError:
        return  # the intake refuses it once parsed, whatever the reading said
    assert read in (None, sizes_of(parsed))


def test_a_text_prompt_after_token_ids_replaces_them():
    data = (request(prompt_token_ids=common_pb2.TokenIds(ids=[5, 6])).SerializeToString()
            + router_pb2.GenerateRequest(prompt_text="hi").SerializeToString())
    assert wire.sizes(data).prompt_tokens is None


@pytest.mark.parametrize("data", [
    b"\xff" * 20,  # a varint longer than 10 bytes
    b"\x0a\x05ab",  # a field longer than the message
    b"\x22\x02\x0a\x05",  # token ids cut inside
    b"\x22\x03\x0a\x01\x80",  # a packed field ending inside a varint
    b"\x0b",  # a group
    b"".join(b"\x22\x02\x08\x07" for _ in range(wire.MAX_FIELDS + 1)),  # more fields than a request has
    b"\x22" + bytes([2 * (wire.MAX_FIELDS + 1)]) + b"\x08\x07" * (wire.MAX_FIELDS + 1),  # unpacked ids
], ids=["long-varint", "overrun", "cut-ids", "cut-packed", "group", "many-fields", "unpacked"])
def test_bytes_not_in_the_plain_encoding_go_to_the_parser(data):
    assert wire.sizes(data) is None


def test_counting_a_large_prompt_needs_no_copy_of_it():
    ids = [300] * (3 * wire.COUNT_CHUNK_BYTES)  # 6 MiB on the wire, counted a chunk at a time
    data = request(prompt_token_ids=common_pb2.TokenIds(ids=ids)).SerializeToString()
    assert wire.sizes(data).prompt_tokens == len(ids)


# ---- quoting ---------------------------------------------------------------------------

def test_quote_shows_a_bounded_prefix_and_the_length():
    assert quote("acme") == "'acme'"
    long = quote("x" * MB)
    assert long == f"{'x' * QUOTE_CHARS!r}... ({MB} characters)"
    assert quote(b"\x00" * 100).endswith("(100 bytes)")
    assert bounded("y" * MB).endswith(f"(message cut from {MB} characters)")
    assert len(bounded("y" * MB)) < MAX_MESSAGE_CHARS + 50


# ---- the intake and its budget, without gRPC ---------------------------------------------

class View:
    """The ClusterView the intake reads its prompt limit from: one decode worker."""

    last = None

    async def get(self):
        return ClusterSnapshot(workers=(), route_epoch=1)


def test_the_budget_refuses_past_its_limit_and_gives_back_what_it_charged():
    async def go():
        intake = Intake(View(), IntakeBudget(3 * 1000))
        data = request(prompt_token_ids=common_pb2.TokenIds(ids=[7] * 900)).SerializeToString()
        async with contextlib.AsyncExitStack() as held:
            taken = [await held.enter_async_context(intake.read(data, None, None)) for _ in range(3)]
            assert intake.budget.held_bytes == 3 * len(data)
            async with intake.read(data, None, None) as refused:
                pass
        assert intake.budget.held_bytes == 0
        async with contextlib.AsyncExitStack() as held:
            again = [await held.enter_async_context(intake.read(data, None, None)) for _ in range(3)]
        return taken, refused, again, intake.budget.held_bytes

    taken, refused, again, held = run(go())
    assert all(not isinstance(t, Refusal) for t in taken + again)
    assert refused.code is StatusCode.RESOURCE_EXHAUSTED and "PD_ROUTER_INTAKE_BYTES" in refused.message
    assert held == 0


def test_a_request_alone_always_fits_the_budget():
    budget = IntakeBudget(10)
    assert budget.take(contract.MAX_MESSAGE_BYTES) is None
    assert budget.take(1) is not None
    budget.give_back(contract.MAX_MESSAGE_BYTES)
    assert budget.held_bytes == 0


def test_no_snapshot_and_no_directory_is_the_orchestrators_refusal():
    class Down(View):
        async def get(self):
            raise RouterError(StatusCode.UNAVAILABLE, "directory unreachable")

    async def go():
        async with Intake(Down(), IntakeBudget(MB)).read(request().SerializeToString(), None, None) as read:
            return read

    assert run(go()) == Refusal(StatusCode.UNAVAILABLE, "directory unreachable")


# ---- through gRPC --------------------------------------------------------------------------

async def _status(router, req: router_pb2.GenerateRequest):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        [ev async for ev in router.Generate(req)]
    return err.value.code(), err.value.details()


def test_a_huge_tenant_or_request_id_is_invalid_argument_with_a_short_message():
    async def go():
        async with rig() as (router, *_):
            return [await _status(router, router_pb2.GenerateRequest(tenant="t" * MB, max_tokens=4)),
                    await _status(router, request(request_id="r" * MB)),
                    await _status(router, request(prompt_token_ids=common_pb2.TokenIds(ids=[5] * 300)))]

    tenant, request_id, prompt = run(go())
    assert tenant == (grpc.StatusCode.INVALID_ARGUMENT, f"tenant is {MB} bytes in UTF-8; at most 128")
    assert request_id == (grpc.StatusCode.INVALID_ARGUMENT, f"request_id is {MB} bytes in UTF-8; at most 256")
    assert prompt[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert prompt[1].startswith(f"prompt is 300 tokens; no worker takes more than {CAP.max_model_len}")


def test_requests_past_the_intake_budget_are_resource_exhausted(monkeypatch):
    """Three requests waiting for a slow snapshot in admission, two fit: the third is refused
    at once; once they are admitted the budget is whole again."""
    async def slow_snapshot(self, request_, context):
        await asyncio.sleep(0.3)
        return await original(self, request_, context)

    original = FakeDirectory.ClusterSnapshot
    monkeypatch.setattr(FakeDirectory, "ClusterSnapshot", slow_snapshot)
    size = request("r0").ByteSize()

    async def wave(router, names):
        calls = [asyncio.create_task(_outcome(router, request(name))) for name in names]
        return await asyncio.gather(*calls)

    async def go():
        async with rig(intake_bytes=2 * size + 1) as (router, *_):
            first = await wave(router, ["r0", "r1", "r2"])
            second = await wave(router, ["r3", "r4"])
            return first, second

    first, second = run(go(), timeout_s=60)
    assert sorted(code.name for code, _ in first) == ["OK", "OK", "RESOURCE_EXHAUSTED"]
    assert "intake is full" in next(details for code, details in first if code != grpc.StatusCode.OK)
    assert [code for code, _ in second] == [grpc.StatusCode.OK] * 2


async def _outcome(router, req):
    try:
        [ev async for ev in router.Generate(req)]
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


def test_cancel_bounds_what_it_quotes():
    async def go():
        async with rig() as (router, *_):
            out = []
            for request_id in ("r" * MB, "n" * 200):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await router.Cancel(common_pb2.CancelRequest(request_id=request_id))
                out.append((err.value.code(), err.value.details()))
            return out

    huge, unknown = run(go())
    assert huge == (grpc.StatusCode.INVALID_ARGUMENT, f"request_id is {MB} bytes in UTF-8; at most 256")
    assert unknown == (grpc.StatusCode.NOT_FOUND, f"no in-flight request {quote('n' * 200)}")


def test_the_prompt_limit_is_the_largest_decode_workers_max_model_len():
    def worker(name, role, max_model_len):
        return WorkerRecord(name, role, "", capacity=WorkerCapacity(max_model_len=max_model_len))

    prefill, d1, d2 = (worker("p", WorkerRole.PREFILL, 9000), worker("d1", WorkerRole.DECODE, 512),
                       worker("d2", WorkerRole.MIXED, 2048))
    assert max_model_len(ClusterSnapshot((prefill, d1, d2))) == 2048
    assert max_model_len(ClusterSnapshot((d1, worker("d3", WorkerRole.DECODE, 0)))) is None  # one declares no limit
    assert max_model_len(ClusterSnapshot((prefill,))) is None


@pytest.mark.skipif(Heap()._libc is None, reason="glibc's malloc controls")
def test_the_heap_is_trimmed_once_a_large_call_is_over(monkeypatch):
    """After a call whose message was large (at once and TRIM_AGAIN_S later), never after a
    small one; large calls ending together share the trims."""
    trims, original = [], Heap._trim
    monkeypatch.setattr(Heap, "_trim", lambda self, delay_s: (trims.append(delay_s), original(self, delay_s)))
    large = request(prompt_token_ids=common_pb2.TokenIds(ids=[300] * (LARGE_BLOCK_BYTES // 2 + 1)))

    async def go():
        async with rig() as (router, *_):
            assert (await _outcome(router, request("small")))[0] == grpc.StatusCode.OK
            await asyncio.sleep(TRIM_AGAIN_S + 0.3)
            small = list(trims)
            refused = await asyncio.gather(_status(router, large), _status(router, large))
            await asyncio.sleep(TRIM_AGAIN_S + 0.3)
            return small, refused, sorted(trims)

    small, refused, trims_after = run(go())
    assert small == []
    assert [code for code, _ in refused] == [grpc.StatusCode.INVALID_ARGUMENT] * 2
    assert trims_after in ([0.0, TRIM_AGAIN_S], [0.0, 0.0, TRIM_AGAIN_S])  # both ended before the first ran, or not
