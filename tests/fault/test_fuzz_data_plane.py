"""Property-based fuzzing of a decode worker's tcp data plane (the fault suite):
random bytes, and frames with a valid header and random kind, transfer id, lengths
and body. Whatever comes, the worker answers (ERROR / VERDICT) or closes the
connection, never crashes or buffers more than a frame's cap, and afterwards serves
a disaggregated request over the same data plane with nothing held."""

from __future__ import annotations

import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.transfer.tcp.wire import FRAME, MAGIC, VERSION, parse_address
from tests.support.cluster import assert_cluster_clean, generate_all, start_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("fuzz-dp"), prefill=1, decode=1, transport="tcp")
    yield c
    c.down()


def data_address(cluster):
    from tests.support.cluster import _directory
    snap, _ = _directory(cluster)
    [d] = [w for w in snap.workers if w.role == "decode"]
    return parse_address(d.data_plane_address)


frames = st.builds(
    lambda kind, tid, body_len, body: FRAME.pack(MAGIC, VERSION, kind, len(tid), body_len) + tid + body,
    st.integers(0, 255), st.binary(max_size=40) | st.text(max_size=20).map(str.encode),
    st.sampled_from([0, 1, 8, 40, 1 << 16, (8 << 20) + 1, 2**64 - 1]) | st.integers(0, 200),
    st.binary(max_size=300))


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.lists(frames | st.binary(min_size=1, max_size=120), min_size=1, max_size=4).map(b"".join))
def test_random_frames_are_answered_or_closed(cluster, payload):
    addr = data_address(cluster)
    with socket.create_connection(addr, timeout=10) as s:
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)  # end of input: a partial frame must not hold the connection
            while s.recv(65536):
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass  # closed on a protocol error: fine


def test_the_data_plane_serves_and_nothing_is_held_after_the_fuzzing(cluster):
    [r] = generate_all(cluster, [list(range(3, 80))], max_tokens=4, mode="disaggregated")
    assert r.route == "disaggregated" and r.attempts == 1
    assert cluster.alive()["decode-0"]
    assert_cluster_clean(cluster)
