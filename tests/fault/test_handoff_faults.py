"""Faults in the middle of a streamed K/V hand-off over ucx, on the real local cluster.

Workers stream every transfer (PD_STREAM_MIN_BYTES=0) and prefill waits
PD_FAULT_CHUNK_DELAY_S before each chunk after the first, so a hand-off stays
mid-stream for about a second. Workers append hand-off events to one JSON-lines
file (PD_EVENT_LOG); a test acts once the decode worker reports the request's
first chunk visible:

  sender SIGKILLed / receiver SIGKILLed mid-stream, a client cancel mid-stream (one
  cluster: a killed worker is started again before the next test), and bad chunks
  (a second cluster whose prefill-0 corrupts a chunk of every transfer and prefill-1
  replays one)

and expects: generation 1's transaction ABORTED in the directory, the request
completed by a retry or the colocated fallback with tokens equal to a colocated
run (or, for cancel, ended), every surviving prefill's credit windows empty after
each transfer, and no leaked block or open transaction on the survivors.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path

import pytest

from pdserve_client.rpc.pd.v1 import common_pb2, router_pb2, router_pb2_grpc
from pdserve_client.types import PdError
from runtime.directory.states import TxnState
from tests.support.cluster import assert_cluster_clean, channel, client, directory, start_cluster
from tooling.cluster.faults import EventFile

MAX_TOKENS = 8
PROMPT = [random.Random(11).randrange(3, 500) for _ in range(150)]  # 4 chunks (tiny: 4 layers)


def _start(tmp_path: Path, worker_env: dict[str, dict[str, str]] | None = None):
    events = tmp_path / "events.jsonl"
    env = {"PD_EVENT_LOG": str(events), "PD_STREAM_MIN_BYTES": "0",
           "PD_FAULT_CHUNK_DELAY_S": "0.4", "PD_TRANSFER_TIMEOUT_S": "3"}
    c = start_cluster(tmp_path, prefill=2, decode=2, lease_ttl_s=2.0, transport="ucx", env=env,
                      worker_env=worker_env or {})
    c.events = events
    return c


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = _start(tmp_path_factory.mktemp("handoff"))
    yield c
    c.down()


@pytest.fixture
def whole(cluster):
    """The module's cluster with every worker up: one a test killed is started again after it."""
    yield cluster
    cluster.revive()


def read_events(cluster, request_id: str, event: str = "") -> list[dict]:
    return EventFile(cluster.events).of(request_id, event)


def when_first_chunk_visible(cluster, request_id: str, action) -> threading.Thread:
    def watch():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if read_events(cluster, request_id, "chunk_visible"):
                action()
                return
            time.sleep(0.02)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def generate(cluster, request_id: str, on_started=None):
    """One disaggregated request through the raw stream: (tokens, complete, started events)."""
    request = router_pb2.GenerateRequest(
        request_id=request_id, prompt_token_ids=common_pb2.TokenIds(ids=PROMPT),
        max_tokens=MAX_TOKENS, mode=router_pb2.MODE_DISAGGREGATED,
        sampling=common_pb2.SamplingParams(ignore_eos=True), deadline_ms=60_000)
    tokens, complete, started = [], None, []
    with channel(cluster, "router", "client") as ch:
        for event in router_pb2_grpc.RouterStub(ch).Generate(request, timeout=90):
            kind = event.WhichOneof("event")
            if kind == "started":
                started.append(event.started)
                if on_started is not None and len(started) == 1:
                    on_started(event.started)
            elif kind == "token":
                tokens.append(event.token.token_id)
            elif kind == "complete":
                complete = event.complete
    return tokens, complete, started


def txn_state(cluster, request_id: str, generation: int):
    async def go():
        async with directory(cluster) as d:
            return await d.lookup(request_id, f"{request_id}/{generation}")
    rec = asyncio.run(go())
    return rec.state if rec is not None else None


def colocated_reference(cluster) -> list[int]:
    with client(cluster) as sdk:
        return sdk.generate_full(prompt_ids=PROMPT, max_tokens=MAX_TOKENS, mode="colocated",
                                    ignore_eos=True).token_ids


def assert_credits_returned(cluster, request_id: str, dead: str = "", timeout_s: float = 10.0) -> None:
    # A prefill reports its windows when its cleanup ends, which can be after the client
    # has already seen the request fail (cancel): wait for the report, bounded.
    deadline = time.monotonic() + timeout_s
    while not (ends := read_events(cluster, request_id, "credits")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ends, "no prefill reported its credit windows"
    assert all(e["in_flight"] == 0 for e in ends), ends


def assert_aborted_and_clean(cluster, request_id: str) -> None:
    assert txn_state(cluster, request_id, 1) == TxnState.ABORTED
    assert_cluster_clean(cluster, timeout_s=20)


@pytest.mark.parametrize("victim_role", ["prefill", "decode"])
def test_worker_killed_mid_stream(whole, victim_role):
    cluster = whole
    rid = f"kill-{victim_role}-mid-stream"
    victim = []

    def on_started(st):
        name = st.prefill_worker_id if victim_role == "prefill" else st.decode_worker_id
        victim.append(name)
        when_first_chunk_visible(cluster, rid, lambda: cluster.signal(name))

    tokens, complete, started = generate(cluster, rid, on_started)
    assert victim and not cluster.alive()[victim[0]]
    sent = read_events(cluster, rid, "chunk_sent")
    visible = read_events(cluster, rid, "chunk_visible")
    first_visible = min(e["t"] for e in visible)
    assert any(e["t"] > first_visible for e in sent) or victim_role == "prefill", \
        "the kill did not land mid-stream"
    assert complete is not None and complete.attempts >= 2 and len(tokens) == MAX_TOKENS
    assert victim[0] not in (started[-1].prefill_worker_id, started[-1].decode_worker_id)
    assert tokens == colocated_reference(cluster)
    assert_aborted_and_clean(cluster, rid)
    if victim_role == "decode":  # the sender survived: its credits came back
        assert_credits_returned(cluster, rid)


def test_bad_chunks_abort_and_the_request_completes(tmp_path):
    faults = {"prefill-0": ("PD_FAULT_CORRUPT_CHUNK", "checksum mismatch"),
              "prefill-1": ("PD_FAULT_REPLAY_CHUNK", "duplicate chunk")}
    cluster = _start(tmp_path, {w: {knob: "1"} for w, (knob, _) in faults.items()})
    try:
        rid = "bad-chunks"
        tokens, complete, started = generate(cluster, rid)
        assert complete is not None and len(tokens) == MAX_TOKENS
        assert complete.route == router_pb2.ROUTE_COLOCATED  # every split attempt was refused
        assert tokens == colocated_reference(cluster)
        aborts = read_events(cluster, rid, "aborted")
        tried = {s.prefill_worker_id for s in started if s.prefill_worker_id}
        assert tried == set(faults) and aborts, (started, aborts)  # both bad senders were tried
        for a in aborts:  # each refused for what its sender did wrong
            generation_of = {s.generation: s.prefill_worker_id for s in started}
            assert faults[generation_of[a["generation"]]][1] in a["reason"], (a, generation_of)
        assert_credits_returned(cluster, rid)
        for g in sorted({a["generation"] for a in aborts}):
            assert txn_state(cluster, rid, g) == TxnState.ABORTED
        assert_cluster_clean(cluster, timeout_s=20)
    finally:
        cluster.down()


def test_cancel_mid_stream_aborts_everywhere(whole):
    cluster, rid = whole, "cancel-mid-stream"
    with client(cluster) as sdk:
        cancelled = []
        watcher = when_first_chunk_visible(
            cluster, rid, lambda: cancelled.append(sdk.cancel(rid)))
        try:
            res = sdk.generate_full(prompt_ids=PROMPT, max_tokens=MAX_TOKENS, ignore_eos=True,
                                    mode="disaggregated", request_id=rid)
        except PdError as exc:  # the cancel came before the prefill's token 0
            assert "cancel" in str(exc).lower(), exc
        else:  # token 0 (the prefill's) went out first: the request ends there, cancelled
            assert res.finish_reason == "cancelled" and len(res.token_ids) == 1, res
        watcher.join(10)  # the stream may end before the watcher's cancel call returns
        assert cancelled == [True]
    assert not read_events(cluster, rid, "published")
    assert_credits_returned(cluster, rid)
    assert_aborted_and_clean(cluster, rid)
