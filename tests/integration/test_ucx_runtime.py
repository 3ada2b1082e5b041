"""The process's UCX runtime (runtime/transfer/ucx/runtime.py), real ucxx in this process:
progressed on its event loop's thread, no progress or notifier thread.

* Messages to itself (an endpoint to its own worker address) complete, in posting order,
  also a burst of posts in one loop turn larger than ucxx's pool of futures.
* A post from another thread is refused with a clear error and posts nothing.
* Idle, the runtime costs no CPU: the loop sleeps in its selector on the worker's fd.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support import ucx_loop

TAG = 0x0ABC_0000_0000_0000


async def _runtime():
    from runtime.transfer.ucx.runtime import runtime
    return runtime()


@pytest.fixture(scope="module")
def rt():
    return ucx_loop.run(_runtime())


def test_a_burst_of_posts_in_one_turn_completes_in_order(rt):
    n = 300  # ucxx keeps 100 futures ready; the runtime refills the pool as it posts

    async def go():
        ep = await rt.endpoint(rt.address)
        bufs = [bytearray(8) for _ in range(n)]
        recvs = [rt.post_recv(b, TAG + 1) for b in bufs]
        sends = [rt.post_send(ep, i.to_bytes(8, "big"), TAG + 1) for i in range(n)]
        async with asyncio.timeout(20):
            await asyncio.gather(*recvs, *sends)
        return [int.from_bytes(b, "big") for b in bufs]

    assert ucx_loop.run(go()) == list(range(n))


def test_a_large_message_to_itself_arrives_whole(rt):
    payload = bytes(range(256)) * (64 << 12)  # 16 MiB: UCX's rendezvous protocol

    async def go():
        ep = await rt.endpoint(rt.address)
        buf = bytearray(len(payload))
        got = rt.post_recv(buf, TAG + 2)
        sent = rt.post_send(ep, payload, TAG + 2)
        async with asyncio.timeout(20):
            await asyncio.gather(got, sent)
        return buf == payload

    assert ucx_loop.run(go())


def test_a_post_off_the_loop_thread_is_refused(rt):
    buf = bytearray(8)
    with pytest.raises(RuntimeError, match="off the event loop"):
        rt.post_recv(buf, TAG + 3)

    async def go():  # nothing was posted: a message on that tag lands in the next receive
        ep = await rt.endpoint(rt.address)
        got = rt.post_recv(buf, TAG + 3)
        await rt.post_send(ep, b"12345678", TAG + 3)
        async with asyncio.timeout(10):
            await got
        return bytes(buf)

    assert ucx_loop.run(go()) == b"12345678"


def test_idle_the_runtime_burns_no_cpu(rt):
    """No polling: while nothing is posted the loop's thread sleeps (this process's CPU
    over half a second stays a small fraction of it, whatever the machine's load)."""
    async def cpu_over(seconds: float) -> float:
        c0 = time.thread_time()
        await asyncio.sleep(seconds)
        return time.thread_time() - c0

    assert ucx_loop.run(cpu_over(0.5)) < 0.05
