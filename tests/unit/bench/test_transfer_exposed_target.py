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
