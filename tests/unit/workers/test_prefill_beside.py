"""The COMMIT's verdict with the source's Begin travelling beside it (prefill_worker/commit.py
`beside`): a refused Begin is the answer as soon as it comes, even with the verdict still
out; a verdict is returned only once Begin was accepted too; nothing is left unretrieved.
(With no Begin, the streamed path, the Prefill awaits its COMMIT itself: the e2e tests.)"""

from __future__ import annotations

import asyncio
import gc

import pytest

from prefill_worker.commit import beside
from prefill_worker.worker import TransferRefused
from services.transfer import TransferError, Verdict


async def later(value=None, delay: float = 0.0, error: BaseException | None = None):
    await asyncio.sleep(delay)
    if error is not None:
        raise error
    return value


def run(coro):
    return asyncio.run(coro)


def test_verdict_first_waits_for_begin_then_returns_it():
    async def go():
        begun = asyncio.ensure_future(later(None, 0.05))
        verdict = await beside(begun, asyncio.ensure_future(later(Verdict(True))))
        return verdict, begun.done() and not begun.cancelled()
    assert run(go()) == (Verdict(True), True)


def test_begin_refused_after_the_verdict_is_still_the_answer():
    async def go():
        begun = asyncio.ensure_future(later(None, 0.02, TransferRefused("directory refused BEGIN")))
        await beside(begun, asyncio.ensure_future(later(Verdict(True))))
    with pytest.raises(TransferRefused, match="refused BEGIN"):
        run(go())


def test_begin_refused_first_answers_without_waiting_for_the_verdict():
    async def go():
        committed = asyncio.ensure_future(later(Verdict(True), 30.0))
        begun = asyncio.ensure_future(later(None, 0.0, TransferRefused("directory refused BEGIN")))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TransferRefused):
            await beside(begun, committed)
        waited = loop.time() - t0
        left_running = not committed.done()
        committed.cancel()  # what the abort that follows does to it
        await asyncio.gather(committed, return_exceptions=True)
        return waited, left_running
    waited, left_running = run(go())
    assert waited < 5.0 and left_running


def test_commit_failure_is_raised_and_begin_is_settled():
    async def go():
        begun = asyncio.ensure_future(later(None, 30.0))
        with pytest.raises(TransferError, match="peer gone"):
            await beside(begun, asyncio.ensure_future(later(None, 0.0, TransferError("peer gone"))))
        return begun.cancelled()
    assert run(go()) is True


def test_a_verdict_failing_after_the_answer_leaves_no_unretrieved_exception():
    unretrieved = []

    async def go():
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: unretrieved.append(ctx["message"]))
        committed = asyncio.ensure_future(later(None, 0.02, TransferError("aborted")))
        begun = asyncio.ensure_future(later(None, 0.0, TransferRefused("refused")))
        with pytest.raises(TransferRefused):
            await beside(begun, committed)
        await asyncio.sleep(0.1)  # it fails now, nobody awaiting it
        assert committed.done()
        del committed, begun  # (begun's error's traceback holds _beside's frame, and so committed)
        gc.collect()  # an exception nobody retrieved is reported when its task is collected
    run(go())
    assert unretrieved == []
