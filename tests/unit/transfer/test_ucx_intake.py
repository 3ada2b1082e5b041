"""The UCX receiver's way in (runtime/transfer/ucx/intake.py) and the sender's replies
(ucx/exchange.py), on a stand-in runtime (no UCX): what is dropped unread and counted, what
an out-of-line body holds up (its own transfer only), and what the genuine sender of an
ended transfer hears. The real backend between processes, and an attacker of its own, are
tests/integration/test_transfer.py and tests/fault/test_ucx_attacks.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from runtime.transfer import Chunk, ChunkKey, Expectation, Failed, TransferCommit, Verdict
from runtime.transfer.keys import TO_RECEIVER, TO_SENDER, TransferKey, new_key
from runtime.transfer.tcp.wire import encode_commit
from runtime.transfer.ucx import wire
from runtime.transfer.ucx.receiver import UcxReceiver

SENDER = 11  # the genuine sender's mailbox


class StandIn:
    """Posted receives by tag (the test completes them), sends recorded as decoded replies."""

    def __init__(self):
        self.recvs: dict[int, tuple[asyncio.Future, bytearray]] = {}
        self.replies: list[tuple[str, int, dict]] = []
        self.drained: list[int] = []

    def expect_tags(self, kind, bits, count=1):
        pass

    def post_recv(self, buffer, tag):
        fut = asyncio.get_running_loop().create_future()
        self.recvs[tag] = (fut, buffer)
        return fut

    def post_send(self, ep, buffer, tag):
        msg = wire.decode(memoryview(buffer))
        self.replies.append((msg.transfer_id, msg.kind, msg.body()))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    async def endpoint(self, address):
        return object()

    async def drain(self, tag):
        self.drained.append(tag)
        fut, _ = self.recvs.pop(tag)
        fut.set_result(None)

    def deliver(self, tag: int, data: bytes) -> None:
        fut, buf = self.recvs.pop(tag)
        buf[:len(data)] = data
        fut.set_result(None)

    def kinds(self, tid: str) -> list[int]:
        return [k for t, k, _ in self.replies if t == tid]


class Peer:
    """The genuine sender of one transfer: its key, its mailbox, its seq."""

    def __init__(self, tid: str, secret: bytes):
        self.tid, self.key, self.seq = tid, TransferKey(tid, secret), time.time_ns()

    def msg(self, kind: int, body: dict, body_tag: int = 0, key: TransferKey | None = None,
            direction: bytes = TO_RECEIVER) -> tuple[wire.Received, bytes]:
        self.seq += 1
        raw, oob, _ = wire.encode(kind, self.tid, SENDER, self.seq, body, key or self.key, direction,
                                  (lambda: body_tag) if body_tag else None)
        return wire.decode(memoryview(raw)), oob


def receiver(*tids: str, body_timeout_s: float = 5.0):
    """A receiver (security off) expecting `tids`, its stand-in runtime, each tid's Peer, and
    the events and commits it saw."""
    rt, events, decided = StandIn(), [], []
    r = UcxReceiver(body_timeout_s=body_timeout_s)
    r._rt = rt
    r._in.attach(rt)

    async def on_commit(commit):
        decided.append(commit)
        return Verdict(True)
    peers = {}
    for tid in tids:
        secret = new_key()
        r.expect(Expectation(tid, lambda k: [memoryview(bytearray(64))], events.append, on_commit, key=secret))
        peers[tid] = Peer(tid, secret)
    return r, rt, peers, events, decided


def auth(r: UcxReceiver, peer: Peer, confirm: bool = False) -> None:
    msg, _ = peer.msg(wire.AUTH, {"reply": {"address": "AAAA"}, "confirm": confirm})
    assert r._on_message(msg) is None


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def big_commit(tid: str, n: int = 2500) -> dict:
    """A COMMIT body too large to go inline (n made-up chunks)."""
    chunks = tuple(Chunk(ChunkKey(i % 4, i // 4, 1), 64, f"{i:016x}") for i in range(n))
    body = encode_commit(TransferCommit(tid, "r", 1, "abi", chunks, "digest", 3))
    assert not wire.fits_inline(body)
    return body


def test_a_message_under_another_key_a_replay_or_for_no_transfer_is_dropped_and_counted():
    async def go():
        r, rt, peers, events, decided = receiver("t/1")
        p = peers["t/1"]
        forged, _ = p.msg(wire.ABORT, {"reason": "x"}, key=TransferKey("t/1", new_key()))
        reflected, _ = p.msg(wire.ABORT, {"reason": "x"}, direction=TO_SENDER)
        other, _ = Peer("t/9", new_key()).msg(wire.ABORT, {"reason": "x"})
        for m in (forged, reflected, other):
            r._on_message(m)
        auth(r, p)
        await turns()
        abort, _ = p.msg(wire.ABORT, {"reason": "x"})
        r._on_message(abort)  # taken: the transfer is aborted
        r._on_message(abort)  # the same message again (a replay): dropped before anything
        assert dict(r.rejected) == {"bad_mac": 2, "unknown_transfer": 1, "replay": 1}
        assert "t/1" not in r.pending and [e.reason for e in events if isinstance(e, Failed)] == \
            ["aborted by sender: x"]
        assert rt.replies == []  # nothing answered anybody, the genuine sender included (it aborted)
    asyncio.run(go())


def test_an_out_of_line_body_holds_up_its_transfer_only():
    """A genuine COMMIT whose body comes out of line: a receive is posted for it only once
    its head held; while it is on its way, the transfer's later messages wait in its lane and
    another transfer's AUTH is answered at once."""
    async def go():
        r, rt, peers, events, decided = receiver("t/1", "t/2")
        auth(r, peers["t/1"])
        await turns()
        body_tag = wire.tag(wire.BODY, peers["t/1"].key.tag_bits, 7)
        head, body = peers["t/1"].msg(wire.COMMIT, big_commit("t/1"), body_tag=body_tag)
        assert head.oob_tag == body_tag and body
        r._on_message(head)
        assert body_tag in rt.recvs and r._in.get("t/1").lane is not None
        late, _ = peers["t/1"].msg(wire.ABORT, {"reason": "behind the body"})
        r._on_message(late)  # waits behind the COMMIT in t/1's lane
        auth(r, peers["t/2"], confirm=True)
        await turns()
        assert rt.kinds("t/2") == [wire.ADMITTED] and decided == []
        rt.deliver(body_tag, body)
        await turns(10)
        assert [c.transfer_id for c in decided] == ["t/1"] and rt.kinds("t/1") == [wire.VERDICT]
        assert not [e for e in events if isinstance(e, Failed)]  # the ABORT behind it came after its end
    asyncio.run(go())


@pytest.mark.parametrize("how", ["never", "other bytes"])
def test_a_body_that_never_comes_or_is_not_the_one_announced_fails_its_transfer(how):
    async def go():
        r, rt, peers, events, decided = receiver("t/1", body_timeout_s=0.2)
        auth(r, peers["t/1"])
        await turns()
        body_tag = wire.tag(wire.BODY, peers["t/1"].key.tag_bits, 3)
        head, body = peers["t/1"].msg(wire.COMMIT, big_commit("t/1"), body_tag=body_tag)
        r._on_message(head)
        if how == "other bytes":
            rt.deliver(body_tag, body[:100] + bytes([body[100] ^ 1]) + body[101:])
        await asyncio.sleep(0.4)
        reason = "body timeout" if how == "never" else "body mismatch"
        assert [e.reason for e in events if isinstance(e, Failed)] == [f"COMMIT's body: {reason}"]
        assert decided == [] and "t/1" not in r.pending
        assert rt.drained == ([body_tag] if how == "never" else [])
        assert r.rejected[reason.replace(" ", "_")] == 1
    asyncio.run(go())


def test_the_genuine_sender_of_an_ended_transfer_hears_so_at_once():
    async def go():
        r, rt, peers, events, decided = receiver("t/1")
        auth(r, peers["t/1"])
        await turns()
        r.forget("t/1")
        first_tag = wire.tag(wire.DATA, peers["t/1"].key.tag_bits, 40)
        chunk, _ = peers["t/1"].msg(wire.CHUNK, {"serial": 0, "key": [0, 0, 1], "bytes": 64, "checksum": "0" * 16,
                                                 "sizes": [64], "tag": first_tag})
        commit, _ = peers["t/1"].msg(wire.COMMIT, encode_commit(TransferCommit("t/1", "r", 1, "a", (), "d", 3)))
        r._on_message(chunk)
        r._on_message(commit)
        replies = [(k, b.get("reason", "")) for t, k, b in rt.replies if t == "t/1"]
        assert replies == [(wire.ERROR, "transfer t/1 not expected (it ended: forgotten)"),
                           (wire.VERDICT, "transfer t/1 not expected (it ended: forgotten)")]
        assert first_tag in rt.recvs  # its data swallowed (a 1-byte receive), not left to the sweep
        assert r.rejected["ended"] == 2
    asyncio.run(go())


def test_a_sender_takes_only_replies_made_under_its_transfers_key():
    """A forged VERDICT (another key), a reflected one (the sender's own direction) and one for
    a transfer it does not know are dropped and counted; the genuine one is taken."""
    async def go():
        from runtime.transfer.ucx.outgoing import Outgoing
        from runtime.transfer.ucx.outgoing import Peer as OutPeer
        from runtime.transfer.ucx.sender import UcxSender
        s = UcxSender()
        keyed = s._keys.add("t/1", TransferKey("t/1", secret := new_key()))
        out = s._outs["t/1"] = Outgoing(OutPeer("ucx://1@h:1/AA", 1, "h", 1, b"", None, None, ""), "t/1", keyed)
        out.verdict = asyncio.get_running_loop().create_future()
        p = Peer("t/1", secret)
        for m, _ in (p.msg(wire.VERDICT, {"published": True}, key=TransferKey("t/1", new_key()), direction=TO_SENDER),
                     p.msg(wire.VERDICT, {"published": True}),
                     Peer("t/9", new_key()).msg(wire.VERDICT, {"published": True}, direction=TO_SENDER)):
            s._on_reply(m)
        assert not out.verdict.done() and dict(s.rejected) == {"bad_mac": 2, "unknown_transfer": 1}
        s._on_reply(p.msg(wire.VERDICT, {"published": True}, direction=TO_SENDER)[0])
        assert out.verdict.done() and out.verdict.result() == Verdict(True)
    asyncio.run(go())
