"""bench/_transfer_exposed.py: the exposed-transfer target is one layer at the part-1 rate of
a size near the prompt's whole K/V, never at a far one's (a 1 MiB rate is not a 16 MiB one)."""

from __future__ import annotations

from bench._transfer_exposed import one_layer_ms

MIB = 1 << 20


def test_the_rate_of_the_nearest_size_within_2x_prices_one_layer():
    bandwidth = {1: {"pdserve-ucx": 0.4}, 16: {"pdserve-ucx": 2.0}, 64: {"pdserve-ucx": 3.0}}
    ms = one_layer_ms(bandwidth, "ucx", 16 * MIB, 2 * MIB)
    assert abs(ms - 2 * MIB / 2.0e9 * 1000) < 1e-9  # 16 MiB's rate, not 1 MiB's or 64 MiB's


def test_no_target_without_a_size_within_2x_of_the_prompt():
    bandwidth = {1: {"pdserve-ucx": 0.4}, 64: {"pdserve-ucx": 3.0}}
    assert one_layer_ms(bandwidth, "ucx", 16 * MIB, 2 * MIB) is None
    assert one_layer_ms({16: {"pdserve-tcp": 1.0}}, "ucx", 16 * MIB, 2 * MIB) is None  # other transport
    assert one_layer_ms({}, "ucx", 16 * MIB, 2 * MIB) is None


def test_the_sched_summary_takes_the_worker_loops_waits_for_a_cpu_off_t_exposed():
    from bench._transfer_exposed import sched_summary
    runs = [{"t_exposed_ms": 1.5, "waited_cores_busy_ms": {"prefill-0/loop": 0.1, "router/loop": 0.4},
             "waited_core_free_ms": {"decode-0/loop": 0.6, "decode-0/threads": 0.2, "directory/loop": 0.3}},
            {"t_exposed_ms": 0.8, "waited_cores_busy_ms": {}, "waited_core_free_ms": {}},
            {"t_exposed_ms": 1.2, "waited_cores_busy_ms": {"decode-0/loop": 0.2}, "waited_core_free_ms": {
                "decode-0/loop": 0.3}}]
    out = sched_summary({"requests": runs}, target_ms=0.85)
    assert out["measured"] and out["requests"] == 3 and out["t_exposed_ms"] == 1.2
    assert out["decode_loop_waited_core_free_ms"] == 0.3  # median of 0.6, 0.0, 0.3: the decode's loop only
    assert out["loops_waited_ms"] == 0.5  # median of 0.7, 0.0, 0.5: the workers' loops, either kind of wait
    assert out["t_exposed_less_loop_waits_ms"] == 0.8 and out["less_waits_met"] is True  # median of 0.8, 0.8, 0.7
    assert sched_summary({"requests": runs}, None).get("less_waits_met") is None


def test_the_sched_summary_says_why_when_nothing_was_measured():
    from bench._transfer_exposed import sched_summary
    assert sched_summary({"why": "perf is not installed"}, 1.0) == {"measured": False, "why": "perf is not installed"}
    assert sched_summary({"requests": []}, 1.0)["measured"] is False
