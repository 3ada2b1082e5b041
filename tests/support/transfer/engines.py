"""What both sides of the transfer harness build alike: the engines (the tiny preset,
or a K/V-wide model), the sampling, and the timeouts the tests reason about."""

from __future__ import annotations

IDLE_TIMEOUT_S = 1.5  # R's receiver
IO_TIMEOUT_S = 5.0    # S's sender
MAX_TOKENS = 6
GREEDY_ARGS = dict(ignore_eos=True)

ENGINES: dict = {}  # spec -> Engine, per process


def engine_for(spec: str):
    """R and S build the same engines: tiny preset, or 'wide' (16 KiB of K/V per token)."""
    from runtime.engine import Engine, EngineConfig, ModelConfig
    from runtime.engine.presets import seeded_weights
    if spec not in ENGINES:
        if spec == "tiny":
            cfg = EngineConfig(num_blocks=96, block_size=16, chunk_tokens=256,
                               attn_tile_tokens=64, torch_threads=1)
            ENGINES[spec] = Engine.from_preset("tiny", seed=3, cfg=cfg)
        else:  # 4 layers x K,V x 8 heads x 64 dims x fp32 = 16 KiB/token; 260 blocks = 65 MiB
            mc = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                             head_dim=64, max_position_embeddings=4160)
            cfg = EngineConfig(num_blocks=260, block_size=16, chunk_tokens=256,
                               attn_tile_tokens=64, torch_threads=1)
            ENGINES[spec] = Engine(mc, seeded_weights(mc, 4), cfg, name="wide")
    return ENGINES[spec]


def sampling():
    from runtime.engine import SamplingParams
    return SamplingParams(**GREEDY_ARGS)
