"""Which transfers the prefill worker announces ahead (prefill_worker/tasks.py `whole_keys`):
those sent whole once computed, never one that may stream or is sent chunk by chunk."""

from __future__ import annotations

from types import SimpleNamespace

from prefill_worker.tasks import whole_keys
from runtime.transfer import ChunkKey

ENGINE = SimpleNamespace(block_bytes_per_layer=4096)
PLAN = [ChunkKey(layer, 0, 2) for layer in range(4)]  # 4 x 8 KiB


def cfg(stream_layers: bool, stream_min_bytes: int):
    return SimpleNamespace(stream_layers=stream_layers, stream_min_bytes=stream_min_bytes)


def test_a_transfer_too_small_to_stream_is_announced_with_its_sizes():
    assert whole_keys(ENGINE, PLAN, cfg(True, 4 << 20), False) == [(k, 8192) for k in PLAN]
    assert whole_keys(ENGINE, PLAN, cfg(False, 0), False) == [(k, 8192) for k in PLAN]  # streaming off


def test_one_that_may_stream_or_goes_chunk_by_chunk_is_not():
    assert whole_keys(ENGINE, PLAN, cfg(True, 32 << 10), False) == []  # 32 KiB: at the streaming size
    assert whole_keys(ENGINE, PLAN, cfg(True, 4 << 20), True) == []
    assert whole_keys(ENGINE, [], cfg(True, 4 << 20), False) == []
