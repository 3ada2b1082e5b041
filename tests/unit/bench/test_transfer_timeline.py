"""bench/transfer.py's instruments: the per-step timeline of pdserve-ucx hand-offs
(bench/_transfer_timeline.py) and the CPU each transfer costs its two peers."""

from __future__ import annotations

import pytest

US = 1000  # ns


def _transfer(zero: int, post_wall_us: int, post_cpu_us: int, extra: bool = False) -> tuple[list, list]:
    sender = [("S.send_many", zero, zero + 300 * US, 290 * US),
              ("S.checksum", zero + 10 * US, zero + 12 * US, 2 * US),
              ("S.checksum", zero + 20 * US, zero + 23 * US, 3 * US),
              ("post_send", zero + 400 * US, zero + (400 + post_wall_us) * US, post_cpu_us * US)]
    receiver = [("R.on_chunk", zero + 450 * US, zero + 650 * US, 200 * US)]
    if extra:
        receiver.append(("R.decide", zero + 700 * US, zero + 710 * US, 10 * US))
    return sender, receiver


def test_timeline_rows_time_steps_from_the_senders_start_and_count_posts_off_their_cpu():
    from _transfer_timeline import timeline_rows

    rows = timeline_rows([_transfer(10**9, 100, 20, extra=True), _transfer(5 * 10**9, 300, 30),
                          _transfer(9 * 10**9, 200, 200)])
    steps = {(r["who"], r["step"]): r for r in rows if r["metric"] == "timeline"}
    assert steps[("R", "R.on_chunk#1")]["start_us"] == 450  # from each transfer's send_many
    assert steps[("R", "R.on_chunk#1")]["wall_us"] == 200
    post = steps[("S", "post_send#1")]
    assert (post["wall_us"], post["cpu_us"], post["n"]) == (200, 30, 3)
    assert ("R", "R.decide#1") not in steps  # in one transfer of three: not a step of the path
    summed = steps[("S", "S.checksum (all)")]
    assert (summed["calls"], summed["wall_us"]) == (2, 5)
    [summary] = [r for r in rows if r["metric"] == "timeline_summary"]
    assert summary["transfers"] == 3
    assert summary["posts_off_cpu_us"] == 80  # medians of 80, 270 and 0
    assert [r["start_us"] for r in rows if "start_us" in r] == sorted(r["start_us"] for r in rows if "start_us" in r)


def test_timeline_rows_skip_a_transfer_without_the_senders_start():
    from _transfer_timeline import timeline_rows

    assert timeline_rows([([], [("R.land", 0, 5, 5)])]) == []


def test_stamps_wrap_the_steps_while_on_and_restore_them_after():
    from _transfer_timeline import Stamps

    from runtime.transfer.ucx import receiver as ucx_receiver

    original, stamps = ucx_receiver.scatter, Stamps()
    stamps.on()
    try:
        assert ucx_receiver.scatter is not original
        dst = bytearray(4)
        ucx_receiver.scatter(b"abcd", [memoryview(dst)[:2], memoryview(dst)[2:]])
        assert dst == b"abcd"  # the wrapped step still does its work
        [(label, t0, t1, cpu)] = [r for r in stamps.take() if r[0] == "R.scatter"]
        assert t1 >= t0 and cpu >= 0
        assert stamps.take() == []
    finally:
        stamps.off()
    assert ucx_receiver.scatter is original


def test_stamps_fail_loudly_when_a_step_is_gone(monkeypatch):
    import _transfer_timeline
    from _transfer_timeline import Stamps

    monkeypatch.setattr(_transfer_timeline, "STEPS", (("runtime.transfer.ucx.receiver", "UcxReceiver",
                                                      "_no_such_step", "R.gone"),))
    with pytest.raises(AttributeError):
        Stamps().on()


class _Peer:
    """Answers cpu_ns with a clock that `step` advances (a stand-in for a spawned peer)."""

    def __init__(self):
        self.ns = 0

    def call(self, cmd: str, **kwargs):
        assert cmd == "cpu_ns"
        return self.ns


def test_with_cpu_charges_each_timed_transfer_its_peers_cpu_and_drops_the_warm_up():
    from _transfer_cpu import with_cpu

    r, s, got = _Peer(), _Peer(), []

    def one(i: int) -> float:
        s.ns += (i + 1) * 1_000_000
        r.ns += (i + 1) * 2_000_000
        return 0.5

    measured = with_cpu(one, r, s, got)
    assert [measured(i) for i in range(3)] == [0.5, 0.5, 0.5]
    assert got == [(0.002, 0.004), (0.003, 0.006)]


def test_over_exact_floor_compares_time_and_each_sides_cpu_in_the_same_run():
    from _transfer_cpu import MIB, over_exact_floor

    gbps = {"pdserve-ucx": MIB / 2e6, "ucxx-python-exact": MIB / 1.5e6}  # 2 ms and 1.5 ms
    cpu = {"pdserve-ucx": (0.0012, 0.0016), "ucxx-python-exact": (0.0008, 0.0013)}
    assert over_exact_floor(gbps, cpu) == dict(extra_ms_over_exact_floor=0.5,
                                               extra_cpu_ms_over_exact_floor=dict(sender=0.4, receiver=0.3))
    assert over_exact_floor(gbps, {"pdserve-ucx": (0.0012, 0.0016)}) == {}
