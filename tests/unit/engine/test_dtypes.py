"""bf16/fp16 engines (for GPUs) run, keep their K/V in that dtype, and say so in the ABI."""

from __future__ import annotations

import pytest
import torch

from runtime.engine import Engine, EngineConfig, SamplingParams
from tests.support.engine import assert_no_leak


@pytest.mark.parametrize("dtype,torch_dtype", [("bfloat16", torch.bfloat16),
                                               ("float16", torch.float16)])
def test_half_precision_engine(dtype, torch_dtype):
    half = Engine.from_preset("tiny", cfg=EngineConfig(dtype=dtype, num_blocks=32))
    full = Engine.from_preset("tiny", cfg=EngineConfig(num_blocks=32))
    assert half.cache.kv.dtype == torch_dtype
    assert half.abi.dtype == dtype and half.abi.digest != full.abi.digest
    prompt = list(range(1, 50))
    seq = half.add_request("r", prompt, 4, SamplingParams(ignore_eos=True))
    half.prefill(seq)
    # Same weights, lower precision: the logits stay close to float32's.
    full_seq = full.add_request("r", prompt, 4, SamplingParams(ignore_eos=True))
    full.prefill(full_seq)
    assert torch.allclose(half.last_logits, full.last_logits, atol=0.25, rtol=0.05)
    while not seq.is_finished:
        half.decode_step([seq])
    assert len(seq.output_ids) == 4
    for e, s in ((half, seq), (full, full_seq)):
        e.free(s)
        assert_no_leak(e)
