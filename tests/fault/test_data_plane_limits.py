"""Oversized and unsolicited messages on a decode worker's tcp data plane (docs/design.md,
Failures: limits): a COMMIT for a transfer nobody expects is discarded as it streams in, never
buffered (it was read whole, up to 64 MiB, before the lookup); a body over its kind's
cap closes the connection before a byte of it is read; the worker keeps serving."""

from __future__ import annotations

import socket
import time

import pytest

from pdserve_client.contract import server_name
from runtime.transfer.base import MAX_COMMIT_BODY_BYTES, MAX_SMALL_BODY_BYTES
from runtime.transfer.tcp.wire import ABORT, COMMIT, FRAME, VERDICT, frame, json_body, parse_address
from tests.support.cluster import assert_cluster_clean, generate_all, start_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("dp"), prefill=1, decode=1, transport="tcp")
    yield c
    c.down()


def data_address(cluster) -> tuple[str, int]:
    from tests.support.cluster import _directory
    snap, _ = _directory(cluster)
    [d] = [w for w in snap.workers if w.role == "decode"]
    return parse_address(d.data_plane_address)


def connect(cluster, addr: tuple[str, int]) -> socket.socket:
    """A raw connection to the data plane, speaking TLS with prefill-0's certificate
    (the receiver accepts only a prefill worker's)."""
    ctx = cluster.identity("prefill-0").client_ssl()
    return ctx.wrap_socket(socket.create_connection(addr, timeout=10), server_hostname=server_name("decode"))


def rss_bytes(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def read_frame(sock: socket.socket) -> tuple[int, str, dict]:
    def exactly(n):
        out = b""
        while len(out) < n:
            got = sock.recv(n - len(out))
            if not got:
                raise ConnectionError("closed")
            out += got
        return out
    _, _, kind, id_len, body_len = FRAME.unpack(exactly(FRAME.size))
    return kind, exactly(id_len).decode(), json_body(exactly(body_len))


def test_a_commit_for_no_transfer_is_discarded_as_it_arrives(cluster):
    addr, pid = data_address(cluster), cluster.procs["decode-0"].pid
    body_len = MAX_COMMIT_BODY_BYTES - 1024
    before = rss_bytes(pid)
    socks = []
    for i in range(16):  # each declares ~8 MiB and sends 64 KiB of it, then waits
        s = connect(cluster, addr)
        s.sendall(frame(COMMIT, f"nobody/{i}", b"", body_len) + b"x" * (64 << 10))
        socks.append(s)
    time.sleep(1.0)
    grown = rss_bytes(pid) - before
    assert grown < 32 << 20, f"decode worker grew {grown >> 20} MiB holding 16 partial commits"
    s = socks[0]
    s.sendall(b"x" * (body_len - (64 << 10)))  # the rest: the worker answers once it is drained
    kind, tid, body = read_frame(s)
    assert (kind, tid, body["published"]) == (VERDICT, "nobody/0", False)
    assert "not expected" in body["reason"]
    for s in socks:
        s.close()


@pytest.mark.parametrize("kind,cap", [(COMMIT, MAX_COMMIT_BODY_BYTES), (ABORT, MAX_SMALL_BODY_BYTES)])
def test_a_body_over_its_cap_closes_the_connection_unread(cluster, kind, cap):
    addr = data_address(cluster)
    with connect(cluster, addr) as s:
        s.sendall(frame(kind, "big/1", b"", cap + 1))
        s.settimeout(10)
        assert s.recv(1) == b""  # closed without reading the body
    # The worker still serves a disaggregated request over this data plane.
    [r] = generate_all(cluster, [[5, 6, 7, 8] * 10], max_tokens=3, mode="disaggregated")
    assert r.route == "disaggregated" and r.attempts == 1
    assert_cluster_clean(cluster)
