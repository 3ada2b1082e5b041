"""Layer streaming's COMMIT ahead of the first token (runtime/transfer/base.py
TOKEN_FOLLOWS), between the real PrefillWorker and DecodeWorker (tests/support/inproc_cluster.py):
the destination validates and publishes while the prefill's compute ends, admits the
request when the token's COMMIT comes, and whatever happens between the two — the
prefill cancelled, the decode cancelled, the TTL — everything comes back and the
publication is released."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import pytest

from decode_worker.admission import Admission
from decode_worker.reservations import ResState
from prefill_worker.handoff import TransferRefused
from runtime.directory.states import TxnState
from runtime.worker.loop import SeqDone, TokenOut
from tests.support.inproc_cluster import InprocCluster

PROMPT = [random.Random(5).randrange(3, 500) for _ in range(600)]  # 3 prefill chunks of 256: streamed
STREAMED = dict(stream_min_bytes=0, chunk_tokens=256, max_chunk_blocks=4)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def published_ahead(c: InprocCluster, res) -> None:
    """Until the destination published `res` ahead of its token (the prefill paused at "@sampled")."""
    while not res.awaiting_token:
        assert res.state < ResState.FINISHED, res.abort_reason
        await asyncio.sleep(0.01)


def test_the_commit_goes_ahead_and_the_token_admits_the_request():
    async def go():
        async with InprocCluster(fault_pause_s=2.0, **STREAMED) as c:  # the compute's tail: 2 s (a loaded machine)
            rid = "a@sampled@token_late"
            res = await c.reserve(rid, PROMPT, 4)
            stream = c.router_stream(res)
            prefill = asyncio.ensure_future(c.send(rid, res, PROMPT))
            await published_ahead(c, res)
            during = (await c.directory.lookup(rid, res.transfer_id)).state, res.published.is_set()
            tokens, outcome = await stream, await prefill
            reference = await c.colocated("ref", PROMPT, 4)
            await c.assert_all_returned()  # the release may follow the stream's end
            record = await c.directory.lookup(rid, res.transfer_id)
            return during, tokens, reference, outcome, record

    during, tokens, reference, outcome, record = run(go())
    assert during == (TxnState.PUBLISHED, False)  # published, not admitted: the stream waits for the token
    assert tokens == reference and outcome.first_token == tokens[0]
    assert record.state is TxnState.RELEASED and record.kv_digest == outcome.kv_digest


def test_token_0_streams_before_the_decode_engine_imports_the_blocks():
    """Neither the client's first token nor the prefill's verdict waits for the decode's
    engine thread (busy with a long step here): token 0 is streamed and the verdict sent at
    the token's COMMIT, the import follows."""
    async def go():
        async with InprocCluster(fault_pause_s=2.0, **STREAMED) as c:
            rid = "e@sampled@token_late"
            res = await c.reserve(rid, PROMPT, 4)
            stream = c.decode.stream(res.transfer_id)
            first = asyncio.ensure_future(anext(stream))
            prefill = asyncio.ensure_future(c.send(rid, res, PROMPT))
            await published_ahead(c, res)
            gate = threading.Event()
            busy = c.d.loop.call(lambda e: gate.wait(30))  # until token 0 and the verdict are out
            try:
                token0 = await asyncio.wait_for(first, 20)
                outcome = await asyncio.wait_for(asyncio.shield(prefill), 20)  # the verdict came back
                imported_then = res.trace.admitted_ns != 0
            finally:
                gate.set()
            await busy
            rest = await c.collect(stream)
            reference = await c.colocated("ref", PROMPT, 4)
            await c.assert_all_returned()
            return token0, imported_then, rest, outcome, reference

    token0, imported_then, rest, outcome, reference = run(go())
    assert (token0.token_id, token0.index) == (reference[0], 0) and not imported_then
    assert [token0.token_id, *rest] == reference and outcome.first_token == reference[0]


def test_the_token_commit_leaves_from_token_0s_callback_when_the_compute_tail_is_long(tmp_path):
    """No pause: the compute's tail (the last chunk's head and sampling) is long, so the
    destination publishes ahead of token 0 and the token's COMMIT is posted from token 0's
    own loop callback (prefill_worker/commit.py TokenCommit), before the prefill's
    coroutine hears of the token."""
    log = tmp_path / "events.jsonl"

    async def go():
        async with InprocCluster(event_log=str(log), **STREAMED) as c:
            engine = c.p.loop.engine
            real = engine.prefill_chunk

            def slow_tail(seq, on_layer=None):
                token = real(seq, on_layer)
                if token is not None:  # every layer written and sent: the destination publishes now
                    time.sleep(1.0)
                return token
            engine.prefill_chunk = slow_tail
            res = await c.reserve("f", PROMPT, 4)
            stream = c.router_stream(res)
            outcome = await c.send("f", res, PROMPT)
            tokens = await stream
            engine.prefill_chunk = real
            reference = await c.colocated("ref", PROMPT, 4)
            await c.assert_all_returned()
            return tokens, reference, outcome, await c.directory.lookup("f", res.transfer_id)

    tokens, reference, outcome, record = run(go())
    assert tokens == reference and outcome.first_token == tokens[0]
    assert record.state is TxnState.RELEASED and record.kv_digest == outcome.kv_digest
    events = [e["event"] for e in map(json.loads, log.read_text().splitlines()) if e.get("request") == "f"]
    assert "commit_ahead" in events and "token_commit" in events, events
    assert events.index("commit_ahead") < events.index("token_commit") < events.index("computed"), events
    assert "token_received" in events  # the destination took it and admitted the request


def test_a_prefill_cancelled_between_commit_and_token_releases_the_publication():
    async def go():
        async with InprocCluster(fault_pause_s=30.0, **STREAMED) as c:
            rid = "b@sampled@token_late"
            res = await c.reserve(rid, PROMPT, 4)
            stream = c.router_stream(res)
            prefill = asyncio.ensure_future(c.send(rid, res, PROMPT))
            await published_ahead(c, res)
            assert await c.prefill.cancel(rid, 1)
            with pytest.raises(asyncio.CancelledError):
                await prefill
            with pytest.raises(RuntimeError, match="aborted by sender"):
                await stream  # the sender's ABORT reached the destination: nothing to decode
            await c.assert_all_returned()
            return await c.directory.lookup(rid, res.transfer_id), res

    record, res = run(go())
    assert res.state is ResState.ABORTED and not res.awaiting_token
    assert record.state is TxnState.RELEASED  # published, then given back (not aborted: it was published)


def test_a_decode_cancelled_between_commit_and_token_refuses_the_token():
    async def go():
        async with InprocCluster(fault_pause_s=2.0, **STREAMED) as c:
            rid = "c@sampled@token_late"
            res = await c.reserve(rid, PROMPT, 4)
            stream = c.router_stream(res)
            prefill = asyncio.ensure_future(c.send(rid, res, PROMPT))
            await published_ahead(c, res)
            assert await c.decode.cancel(rid, 1, "router teardown")
            with pytest.raises(TransferRefused, match="not expected"):
                await prefill  # its token's COMMIT finds the transfer gone
            await asyncio.gather(stream, return_exceptions=True)
            await c.assert_all_returned()
            return await c.directory.lookup(rid, res.transfer_id), res

    record, res = run(go())
    assert res.state is ResState.ABORTED and res.abort_reason == "router teardown"
    assert record.state is TxnState.RELEASED


def test_no_token_within_the_reservation_ttl_gives_everything_back():
    async def go():
        async with InprocCluster(fault_pause_s=30.0, **STREAMED) as c:
            rid = "d@sampled@token_late"
            res = await c.reserve(rid, PROMPT, 4)  # its own TTL is the default's: the prefill may be slow
            stream = c.router_stream(res)
            c.decode.cfg = c.decode.cfg.replace(reservation_ttl_s=0.3)  # what the publication arms
            prefill = asyncio.ensure_future(c.send(rid, res, PROMPT))
            await published_ahead(c, res)
            while res.state is not ResState.ABORTED:
                await asyncio.sleep(0.01)
            await c.prefill.cancel(rid, 1)  # the router's teardown, once its attempt failed
            await asyncio.gather(prefill, stream, return_exceptions=True)
            await c.assert_all_returned()
            return await c.directory.lookup(rid, res.transfer_id), res

    record, res = run(go())
    assert "no first token within the reservation TTL" in res.abort_reason
    assert record.state is TxnState.RELEASED


def test_an_import_failing_after_token_0_ends_the_stream_and_gives_everything_back(monkeypatch):
    def broken(self, res, first_token):
        raise RuntimeError("import broke")

    monkeypatch.setattr(Admission, "_admit", broken)

    async def go():
        async with InprocCluster(**STREAMED) as c:
            rid = "f"
            res = await c.reserve(rid, PROMPT, 4)
            stream = asyncio.ensure_future(_items(c.decode.stream(res.transfer_id)))
            outcome = await c.send(rid, res, PROMPT)
            items = await stream
            await c.assert_all_returned()
            return items, outcome, await c.directory.lookup(rid, res.transfer_id)

    items, outcome, record = run(go())
    assert items[0] == TokenOut(outcome.first_token, 0) and len(items) == 2
    assert isinstance(items[1], SeqDone) and "import broke" in repr(items[1].error)
    assert record.state is TxnState.RELEASED


async def _items(stream) -> list:
    return [item async for item in stream]
