"""The start-up self-check (runtime/engine/selfcheck.py) and the numerics in the cache ABI."""

from __future__ import annotations

import pytest
import torch

from runtime.engine import AbiMismatch, Engine, EngineConfig, attention, ops, selfcheck
from runtime.engine.presets import seeded_weights
from tests.support.engine import GQA, MHA, assert_no_leak, tiny_engine


@pytest.mark.parametrize("model", ["tiny", "gqa", "mha"])
@pytest.mark.parametrize("tile", [16, 128])
def test_exact_kernels_pass(model, tile):
    cfg = EngineConfig(num_blocks=32, attn_tile_tokens=tile)
    engine = (Engine.from_preset("tiny", cfg=cfg) if model == "tiny" else
              Engine(GQA if model == "gqa" else MHA, seeded_weights(GQA if model == "gqa" else MHA), cfg))
    check = selfcheck.run(engine)
    assert check.passed and check.reason == "", check.reason
    assert_no_leak(engine)
    assert engine.blocks.num_cached == 0  # the check ran in scratch caches, not the pool


def test_row_count_dependent_lm_head_fails_with_the_reason():
    engine = tiny_engine()
    selfcheck.make_rows_depend_on_count(engine)
    check = selfcheck.run(engine)
    assert not check.passed
    assert check.reason == "lm_head: rows 0..0 computed apart differ from the same rows among 13"


def test_position_dependent_exponential_fails_at_prefill(monkeypatch):
    """An exp whose bits depend on how many rows share the call (as torch's vector body
    and scalar tail do) leaves the projections alone and breaks chunked prefill."""
    real = ops.exp_

    def exp_by_size(x, isa=None):
        out = real(x, isa)
        if x.dim() == 3 and x.shape[1] <= 8:  # a call of few rows: nudge each row's first weight
            out[..., :1].mul_(1 + 2 ** -10)
        return out

    monkeypatch.setattr(attention, "exp_", exp_by_size)
    check = selfcheck.run(tiny_engine())
    assert not check.passed and check.reason.startswith("prefill: K/V of a 7-token prompt"), check.reason


def test_colocated_only_numerics_pair_with_nobody():
    a, b = tiny_engine(), tiny_engine()
    assert a.abi.digest == b.abi.digest
    selfcheck.mark_colocated_only(a, "decode-0")
    assert a.abi.digest != b.abi.digest and a.abi.kernels.endswith("+unverified@decode-0")
    with pytest.raises(AbiMismatch, match=f"does not match this worker's {a.abi.digest}"):
        a.abi.check_compatible(b.abi.digest)
    c = tiny_engine()
    selfcheck.mark_colocated_only(c, "decode-1")
    assert c.abi.digest != a.abi.digest


def test_abi_digest_covers_the_numerics():
    base = tiny_engine(attn_tile_tokens=64)
    assert base.abi.kernels == ops.kernel_family() == "pdkernels-3"
    assert base.abi.attn_tile_tokens == 64
    # The tile changes the bits (online softmax order): another digest, named in the error.
    other = tiny_engine(attn_tile_tokens=32)
    assert other.abi.digest != base.abi.digest
    with pytest.raises(AbiMismatch, match="attention tile 32"):
        other.abi.check_compatible(base.abi.digest)
    # The chunk size does not change a bit: the same digest.
    assert tiny_engine(attn_tile_tokens=64, chunk_tokens=7).abi.digest == base.abi.digest


def test_the_tile_really_changes_kv_bits():
    """Why the tile is in the ABI: a prompt past one tile gets other K/V bits with another tile."""
    prompt = list(range(3, 203))
    digests = set()
    for tile in (32, 64):
        engine = tiny_engine(attn_tile_tokens=tile)
        seq = engine.add_request("r", prompt, 1)
        engine.prefill(seq)
        digests.add(engine.kv_digest(seq))
        engine.free(seq)
    assert len(digests) == 2


def test_torch_kernels_are_named_by_version_and_isa(monkeypatch):
    monkeypatch.setattr(ops, "KERNEL", None)
    assert ops.kernel_family() == f"torch-{torch.__version__}-{torch.backends.cpu.get_cpu_capability()}"
