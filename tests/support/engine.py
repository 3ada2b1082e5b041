"""Helpers shared by engine tests: small configs, checkpoints, leak checks."""

from __future__ import annotations

import dataclasses
import random

from runtime.engine import Engine, EngineConfig, ModelConfig
from runtime.engine.checkpoint import save_checkpoint
from runtime.engine.presets import PRESETS, seeded_weights

# Grouped-query attention (8 query heads over 2 K/V heads) with Llama-3 RoPE scaling.
GQA = dataclasses.replace(
    PRESETS["tiny"],
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
)
# Multi-head attention (as many K/V heads as query heads), tied embeddings.
MHA = ModelConfig(vocab_size=384, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                  tie_word_embeddings=True, max_position_embeddings=1024, rope_theta=10000.0)


def write_checkpoint(cfg: ModelConfig, path, seed: int = 0, max_shard_bytes: int = 0):
    """A Hugging Face directory with seeded weights for `cfg`."""
    return save_checkpoint(cfg, seeded_weights(cfg, seed), path, max_shard_bytes)


def tiny_engine(**overrides) -> Engine:
    """The tiny preset with a test-sized pool."""
    kw = dict(num_blocks=128, block_size=16, chunk_tokens=512, attn_tile_tokens=64)
    kw.update(overrides)
    return Engine.from_preset("tiny", cfg=EngineConfig(**kw))


def random_prompt(rng: random.Random, n: int, vocab: int = 512) -> list[int]:
    """n random token ids."""
    return [rng.randrange(vocab) for _ in range(n)]


def assert_no_leak(engine: Engine) -> None:
    """Every block is back: free or evictable prefix cache."""
    assert engine.num_free_blocks == engine.blocks.num_blocks, (
        f"{engine.blocks.num_blocks - engine.num_free_blocks} blocks leaked")
    assert all(b.ref_count == 0 for b in engine.blocks.blocks)
    assert not engine.live, f"sequences still live: {[s.request_id for s in engine.live.values()]}"


def running_loop(num_blocks: int = 64):
    """A started EngineLoop over a tiny engine (a generator for pytest fixtures: stopped after)."""
    from runtime.worker.loop import EngineLoop
    engine_loop = EngineLoop(tiny_engine(num_blocks=num_blocks))
    engine_loop.start()
    try:
        yield engine_loop
    finally:
        engine_loop.stop()
