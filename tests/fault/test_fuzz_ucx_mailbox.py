"""Property-based fuzzing of a decode worker's ucx data plane (fault suite): messages on
its control tag from a process that holds no key: random bytes, heads of every kind with
random ids, senders, seqs, lengths, out-of-line tags and MACs, and messages larger than the
receive buffers. The receiver drops what it cannot use (counted) and keeps receiving:
afterwards it serves a disaggregated request over ucx with nothing held."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.transfer.ucx import wire
from tests.support import ucx_loop
from tests.support.cluster import _directory, assert_cluster_clean, generate_all, start_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("fuzz-ucx"), prefill=1, decode=1, transport="ucx")
    yield c
    c.down()


@pytest.fixture(scope="module")
def sender(cluster):
    """(event loop, send(payload)) to the decode worker's control tag from this process."""
    from runtime.transfer.ucx.runtime import runtime
    snap, _ = _directory(cluster)
    [d] = [w for w in snap.workers if w.role == "decode"]
    nonce, _, _, address = wire.parse_address(d.data_plane_address)
    rt = ucx_loop.run(_rt(runtime))  # this process's UCX loop (other modules may use UCX too)
    ep = ucx_loop.run(rt.endpoint(address))

    def send(payload: bytes) -> None:
        async def go():
            await asyncio.wait_for(rt.post_send(ep, payload, wire.tag(wire.CTRL, nonce)), 10)
        ucx_loop.run(go())

    yield send


async def _rt(factory):
    return factory()


heads = st.builds(
    lambda kind, tid, sender, seq, body_len, oob, mac, body: wire.HEAD.pack(
        wire.MAGIC, wire.VERSION, kind, len(tid), sender, seq, body_len, oob, mac) + tid + body,
    st.integers(0, 12), st.binary(max_size=30), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1),
    st.sampled_from([0, 1, 100, 70_000, 2**64 - 1]) | st.integers(0, 300),
    st.sampled_from([0, 1, wire.tag(wire.BODY, 5, 1)]) | st.integers(0, 2**64 - 1),
    st.binary(min_size=16, max_size=16), st.binary(max_size=200))


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.one_of(st.binary(min_size=1, max_size=300), heads,
                         st.sampled_from([b"x" * (wire.MESSAGE_BUFFER_BYTES + 1), b"\0" * 300_000])))
def test_unsolicited_messages_are_dropped(sender, payload):
    sender(payload)


def test_the_ucx_data_plane_serves_after_the_fuzzing(cluster, sender):
    [r] = generate_all(cluster, [list(range(3, 80))], max_tokens=4, mode="disaggregated")
    assert (r.route, r.attempts, r.failed_attempts) == ("disaggregated", 1, ""), r
    assert cluster.alive()["decode-0"]
    assert_cluster_clean(cluster)
