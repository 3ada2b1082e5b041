"""Pieces of the data plane that need no peer: credit window, piece placement, ucx wire."""

from __future__ import annotations

import asyncio

import pytest

from runtime.transfer import ChunkKey
from runtime.transfer.common import place
from runtime.transfer.credits import CreditTimeout, CreditWindow
from runtime.transfer.keys import TO_RECEIVER, TO_SENDER, TransferKey, new_key
from runtime.transfer.ucx import wire


def run(coro):
    return asyncio.run(coro)


def test_credit_window_never_exceeds_its_capacity_and_is_fifo():
    async def go():
        w = CreditWindow(100)
        await w.acquire(60)
        order = []

        async def take(name, n):
            await w.acquire(n)
            order.append(name)

        a = asyncio.ensure_future(take("a", 50))  # must wait: 110 > 100
        await asyncio.sleep(0)
        b = asyncio.ensure_future(take("b", 10))  # would fit, but waits behind a (FIFO)
        await asyncio.sleep(0.01)
        assert order == [] and w.in_flight == 60
        w.release(60)
        await asyncio.gather(a, b)
        assert order == ["a", "b"] and w.in_flight == 60 and w.peak <= 100
        w.release(60)
        assert w.in_flight == 0 and w.acquired == w.released == 120
    run(go())


def test_credit_window_lets_one_oversized_chunk_go_alone_and_times_out():
    async def go():
        w = CreditWindow(100)
        await w.acquire(250)  # alone: allowed, else it could never go
        assert w.in_flight == 250
        with pytest.raises(CreditTimeout, match="no 10 bytes of credit"):
            await w.acquire(10, timeout_s=0.05)
        assert w.in_flight == 250 and not w._waiters  # the timed-out waiter left no trace
        w.release(250)
        with pytest.raises(ValueError):
            w.release(1)
    run(go())


def test_credit_window_cancelled_waiter_does_not_block_the_next():
    async def go():
        w = CreditWindow(10)
        await w.acquire(10)
        t = asyncio.ensure_future(w.acquire(5))
        await asyncio.sleep(0)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        w.release(10)
        await asyncio.wait_for(w.acquire(10), 1)
        assert w.in_flight == 10
    run(go())


def test_place_maps_sender_pieces_onto_receiver_views():
    buf = bytearray(range(100))
    views = [memoryview(buf)[:30], memoryview(buf)[30:100]]
    out = place(views, [30, 50, 20])
    assert [[bytes(p) for p in parts] for parts in out] == [
        [bytes(range(30))], [bytes(range(30, 80))], [bytes(range(80, 100))]]
    crossing = place(views, [20, 20, 60])  # the second piece spans both views
    assert [len(parts) for parts in crossing] == [1, 2, 1]
    assert b"".join(bytes(p) for parts in crossing for p in parts) == bytes(buf)
    whole = place(views + [memoryview(buf)[100:]], [100])  # one piece (a packed batch); an empty view
    assert [[bytes(p) for p in parts] for parts in whole] == [[bytes(range(30)), bytes(range(30, 100))]]
    with pytest.raises(ValueError, match="pieces of 99 bytes"):
        place(views, [99])


def test_ucx_messages_round_trip_and_large_bodies_go_out_of_line():
    key = TransferKey("req/1", new_key())
    msg, body, oob = wire.encode(wire.CHUNK, "req/1", 5, 7, {"serial": 3, "key": [1, 2, 3]}, key, TO_RECEIVER)
    assert body == b"" and oob == 0
    got = wire.decode(memoryview(msg))
    assert (got.kind, got.transfer_id, got.sender, got.seq, got.oob_tag) == (wire.CHUNK, "req/1", 5, 7, 0)
    assert got.verify(key, TO_RECEIVER) and got.body()["key"] == [1, 2, 3]
    big = {"chunks": ["x" * 100] * 2000}
    with pytest.raises(ValueError, match="out-of-line tag"):
        wire.encode(wire.COMMIT, "req/1", 5, 8, big, key, TO_RECEIVER)
    body_tag = wire.tag(wire.BODY, key.tag_bits, 1)
    msg, body, oob = wire.encode(wire.COMMIT, "req/1", 5, 8, big, key, TO_RECEIVER, lambda: body_tag)
    assert len(body) > wire.INLINE_BODY_BYTES and oob == body_tag
    got = wire.decode(memoryview(msg))
    assert got.oob_tag == body_tag and got.verify(key, TO_RECEIVER) and got.body_matches(body)
    assert not got.body_matches(body[:100] + b"y" + body[101:]) and not got.body_matches(body[:-1])
    with pytest.raises(wire.ProtocolError, match="bad message head"):
        wire.decode(memoryview(b"HTTP/1.1 200 OK\r\n" + bytes(60)))


def test_a_ucx_message_holds_only_under_its_key_its_direction_and_its_bytes():
    """Another transfer's key, the reverse direction, or any changed byte of what the MAC
    covers (head, transfer id, body) and the message no longer verifies."""
    key, other = TransferKey("req/1", new_key()), TransferKey("req/1", new_key())
    msg, _, _ = wire.encode(wire.COMMIT, "req/1", 5, 9, {"published": True}, key, TO_RECEIVER)
    assert wire.decode(memoryview(msg)).verify(key, TO_RECEIVER)
    assert not wire.decode(memoryview(msg)).verify(other, TO_RECEIVER)
    assert not wire.decode(memoryview(msg)).verify(key, TO_SENDER)
    assert not wire.decode(memoryview(msg)).verify(TransferKey.public("req/1"), TO_RECEIVER)
    for i in range(len(msg)):
        if wire.SIGNED_HEAD_BYTES <= i < wire.HEAD.size:  # the MAC itself
            continue
        flipped = bytearray(msg)
        flipped[i] ^= 0x01
        try:
            assert not wire.decode(memoryview(flipped)).verify(key, TO_RECEIVER), i
        except (wire.ProtocolError, AssertionError) as e:
            assert isinstance(e, wire.ProtocolError), f"byte {i} changed and the MAC still holds"


def test_a_keyed_chunk_checksum_needs_the_key():
    """The chunk checksum is the key's: another key, another chunk key or other bytes give
    another value; the public key of a transfer is the same for everybody."""
    data = [memoryview(bytes(range(256)) * 16)]
    key = TransferKey("t/1", new_key())
    sums = {key.checksum(ChunkKey(0, 0, 1), data), TransferKey("t/1", new_key()).checksum(ChunkKey(0, 0, 1), data),
            key.checksum(ChunkKey(0, 1, 1), data), key.checksum(ChunkKey(0, 0, 1), [data[0][1:], data[0][:1]])}
    assert len(sums) == 4 and all(len(s) == 16 for s in sums)
    assert TransferKey.public("t/1").checksum(ChunkKey(0, 0, 1), data) == \
        TransferKey.public("t/1").checksum(ChunkKey(0, 0, 1), [data[0][:7], data[0][7:]])  # the pieces' cut: same
    assert "secret" not in repr(key) and key.tag_bits and 0 < key.tag_bits < 1 << wire.NONCE_BITS
    big = memoryview(bytes(range(256)) * 4096)  # 1 MiB: past JOIN_MAX_BYTES, hashed piece by piece
    whole = key.checksum(ChunkKey(1, 2, 3), [big])
    assert key.checksum(ChunkKey(1, 2, 3), [big[:3], big[3:700_000], big[700_000:]]) == whole
    assert key.checksum(ChunkKey(1, 2, 3), [big[:100], big[100:]]) == whole


def test_ucx_tags_keep_streams_and_nonces_apart():
    tags = {wire.tag(k, n, c) for k in (wire.CTRL, wire.REPLY, wire.DATA, wire.BODY)
            for n in (1, 2) for c in (0, 1, 0xFFFFFFFF)}
    assert len(tags) == 4 * 2 * 3
    assert wire.tag(wire.DATA, 5, 1 << 32) == wire.tag(wire.DATA, 5, 0)  # counter wraps in place
    assert wire.tag_parts(wire.tag(wire.BODY, 5, 9)) == (wire.BODY, 5, 9)


def test_ucx_address_round_trip_and_errors():
    a = wire.format_address(0xABC, "node-1", 4242, b"\x00\x01worker")
    assert wire.parse_address(a) == (0xABC, "node-1", 4242, b"\x00\x01worker")
    assert a.startswith("ucx://w2.abc@node-1:4242/")
    for bad in ("tcp://1.2.3.4:5", "ucx://w2.zz@h:1/AAAA", "ucx://w2.1@h:1/", "ucx://w3.1@h:1/AAAA"):
        with pytest.raises(ValueError, match="is not ucx://w2.<nonce>"):
            wire.parse_address(bad)
    with pytest.raises(ValueError, match="wire-1 receiver's"):  # an older pdserve's: refused at once, said so
        wire.parse_address("ucx://abc@node-1:4242/AAAA")


def test_metrics_text_round_trip():
    from runtime.telemetry.metrics import parse, registry_of, render
    samples = [("pd_a_total", {}, 3.0),
               ("pd_path_info", {"path": "shm(sysv+cma)", "peer": 'x"y'}, 1.0)]
    text = render(registry_of([lambda: samples]))
    assert 'pd_path_info{path="shm(sysv+cma)",peer="x\\"y"} 1.0' in text
    assert parse(text)[0] == ("pd_a_total", {}, 3.0)
    assert parse(text)[1][0] == "pd_path_info" and parse(text)[1][2] == 1.0
