"""After publication token 0 has the cores first: the decode sends the prefill its VERDICT,
and its engine thread imports the blocks, only once the attached DecodeStream has handed
token 0 on (decode_worker/admission.py `token_0_out`, bounded); with no stream attached
nothing waits. Between the real PrefillWorker and DecodeWorker (tests/support/inproc_cluster.py)."""

from __future__ import annotations

import asyncio
import random

import pytest

from decode_worker import admission
from tests.support.inproc_cluster import InprocCluster

PROMPT = [random.Random(21).randrange(3, 500) for _ in range(16)]


@pytest.fixture(autouse=True)
def long_wait(monkeypatch):
    """A bound no test reaches: what is waited for decides, not the clock."""
    monkeypatch.setattr(admission, "TOKEN_0_WAIT_S", 30.0)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_the_verdict_waits_until_the_stream_has_handed_token_0_on():
    async def go():
        async with InprocCluster() as c:
            res = await c.reserve("r", PROMPT, 3)
            items = c.decode.stream(res.transfer_id)
            first = asyncio.ensure_future(anext(items))  # the stream is attached, waiting
            await asyncio.sleep(0)
            prefill = asyncio.ensure_future(c.send("r", res, PROMPT))
            token_0 = await first  # the consumer holds it: the generator has not resumed
            await asyncio.sleep(0.2)
            held = (prefill.done(), res.token_0_out.is_set())
            rest = asyncio.ensure_future(c.collect(items))  # asks for the next: token 0 handed on
            outcome = await prefill
            tokens = [token_0.token_id, *await rest]
            reference = await c.colocated("ref", PROMPT, 3)
            await c.assert_all_returned()
            return held, tokens, reference, outcome

    held, tokens, reference, outcome = run(go())
    assert held == (False, False)  # published, token 0 with the consumer: no VERDICT yet
    assert isinstance(tokens[0], int) and tokens == reference and outcome.first_token == tokens[0]


def test_with_no_stream_attached_the_verdict_does_not_wait():
    """The router's stream came (the decode may publish) and its caller left before the
    publication: the VERDICT does not wait for a token 0 nobody reads; a stream that comes
    later reads every token."""
    async def go():
        async with InprocCluster() as c:
            res = await c.reserve("r", PROMPT, 3)
            first = c.router_stream(res)
            while not res.streamed:
                await asyncio.sleep(0.001)
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            assert not res.streamed
            outcome = await asyncio.wait_for(c.send("r", res, PROMPT), 10)  # not TOKEN_0_WAIT_S
            tokens = await c.collect(c.decode.stream(res.transfer_id))  # the stream comes later
            reference = await c.colocated("ref", PROMPT, 3)
            await c.assert_all_returned()
            return tokens, reference, outcome

    tokens, reference, outcome = run(go())
    assert tokens == reference and outcome.first_token == tokens[0]
