"""The tcp backend's wire between real processes: raw-socket faults (a sender silent
mid-frame, bad magic) and, in one process, a send cancelled mid-payload. The
processes and fixtures are tests/support/transfer's; every case runs on tcp only.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest

from runtime.transfer import (
    Chunk,
    ChunkArrived,
    ChunkKey,
    Expectation,
    Failed,
    TransferCommit,
    TransferKey,
    Verdict,
    chunk_checksum,
    tcp,
)
from tests.support.transfer.engines import IDLE_TIMEOUT_S
from tests.support.transfer.fixtures import make_prompt, new_tid, procs, receiver_clean

__all__ = ["procs", "receiver_clean"]  # fixtures: the harness's, used by every test here


def _raw_connect(addr: str) -> socket.socket:
    sock = socket.create_connection(tcp.parse_address(addr), timeout=5)
    sock.settimeout(5)
    return sock


def _closed_by_peer(sock: socket.socket) -> bool:
    """The peer closed: FIN (b"") or, with our bytes still unread there, RST."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("procs", ["tcp"], indirect=True)
def test_silent_sender_mid_frame_fails_after_the_idle_timeout(procs):
    r, _, addr = procs
    tid = new_tid()
    res = r.call("r_reserve", tid=tid, spec="tiny", prompt=make_prompt(40, 7), per_chunk=1)
    n = res["block_bytes"]
    with _raw_connect(addr) as sock:
        sock.sendall(tcp.chunk_frame(tid, ChunkKey(0, 0, 1), n, "0" * 16) + bytes(n // 2))
        t0 = time.monotonic()
        out = r.call("r_outcome", tid=tid, timeout_s=IDLE_TIMEOUT_S + 5)
        assert _closed_by_peer(sock)
    assert out["state"] == "failed" and "idle" in out["reason"], out
    assert IDLE_TIMEOUT_S - 0.2 <= out["at"] - t0 <= IDLE_TIMEOUT_S + 1.0
    r.call("r_finish", tid=tid)


@pytest.mark.parametrize("procs", ["tcp"], indirect=True)
def test_bad_magic_closes_the_connection_and_fails_its_transfers(procs):
    r, _, addr = procs
    tid = new_tid()
    res = r.call("r_reserve", tid=tid, spec="tiny", prompt=make_prompt(40, 8), per_chunk=1)
    payload = bytes(res["block_bytes"])
    with _raw_connect(addr) as sock:
        summed = chunk_checksum(TransferKey.public(tid), ChunkKey(1, 0, 1), [memoryview(payload)])
        sock.sendall(tcp.chunk_frame(tid, ChunkKey(1, 0, 1), len(payload), summed) + payload)
        sock.sendall(b"HTTP/1.1 GET /\r\n\r\n")
        assert _closed_by_peer(sock)
    out = r.call("r_outcome", tid=tid)
    assert out["state"] == "failed" and "protocol error" in out["reason"] and out["arrived"] == 1
    r.call("r_finish", tid=tid)



@pytest.mark.parametrize("procs", ["tcp"], indirect=True)
def test_cancelled_send_finishes_its_frame_and_keeps_the_connection():
    """In one process: cancelling a send mid-payload fails only that transfer."""
    big = 32 << 20

    async def run():
        recv, sender = tcp.TcpReceiver(idle_timeout_s=5), tcp.TcpSender(io_timeout_s=5)
        await recv.start()
        events: list = []
        started = asyncio.Event()
        sink = {"a": bytearray(big), "b": bytearray(4096)}

        def resolver(tid):
            def resolve(key):
                started.set()
                return [memoryview(sink[tid])]
            return resolve

        async def on_commit(commit):
            return Verdict(True)

        for tid in ("a", "b"):
            recv.expect(Expectation(tid, resolver(tid), events.append, on_commit))
        payload = memoryview(os.urandom(big))
        chunk = Chunk(ChunkKey(0, 0, 1), big, chunk_checksum(TransferKey.public("a"), ChunkKey(0, 0, 1), [payload]))
        send_a = asyncio.ensure_future(sender.send(recv.address, "a", chunk, [payload]))
        await started.wait()  # R parsed a's header; a's payload is on its way
        link = sender._links[recv.address]
        send_a.cancel()
        with pytest.raises(asyncio.CancelledError):
            await send_a
        small = memoryview(os.urandom(4096))
        b_chunk = Chunk(ChunkKey(0, 0, 1), 4096, chunk_checksum(TransferKey.public("b"), ChunkKey(0, 0, 1), [small]))
        await sender.send(recv.address, "b", b_chunk, [small])
        verdict = await sender.commit(recv.address, TransferCommit(
            "b", "rb", 1, "abi", (b_chunk,), "digest", 3))
        assert verdict == Verdict(True) and sender._links[recv.address] is link
        await sender.abort(recv.address, "a", "cancelled")
        await sender.close()
        await recv.stop()
        return events, recv.pending, sink

    events, pending, sink = asyncio.run(run())
    failed = [e for e in events if isinstance(e, Failed)]
    assert len(failed) == 1 and failed[0].transfer_id == "a", events
    assert "checksum mismatch" in failed[0].reason
    assert [e.transfer_id for e in events if isinstance(e, ChunkArrived)] == ["b"]
    assert pending == {}
