"""Profiles for the simulator's unit tests: small, round numbers, so a test can work
out by hand what the engine model must give."""

from __future__ import annotations

import pytest

from runtime.directory.cost_profile import CostProfile
from sim.profile import EngineProfile, Overheads, SimProfile, TransferProfile


def make_profile(total_blocks: int = 4096, chunk: int = 512, max_batch: int = 64, **cost) -> SimProfile:
    """A GPU-like worker: prefill 2 + 0.05/token ms, decode 10 + 0.2/seq + 0.001/context-token ms."""
    c = {"prefill_base_ms": 2.0, "prefill_ms_per_token": 0.05, "prefill_ms_per_pair": 0.0, "decode_base_ms": 10.0,
         "decode_ms_per_seq": 0.2, "decode_ms_per_context_token": 0.001, "kv_bytes_per_block": 1 << 20, **cost}
    return SimProfile("unit", EngineProfile(CostProfile(**c, source="calibrated"), 16, total_blocks, max_batch,
                                            chunk, layers=8, max_model_len=65536),
                      TransferProfile("unit", 0.1, 10.0), Overheads(1.0, 2.0, 2.0))


@pytest.fixture
def profile() -> SimProfile:
    return make_profile()
