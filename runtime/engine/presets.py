"""Seeded model presets: the embedded default when no checkpoint is given.

The same preset and seed give bitwise-identical weights in every process on every
CPU: every tensor is drawn from one numpy PCG64 generator in a fixed name order
(numpy's ziggurat is scalar C code). torch.randn is not CPU-independent: its
vectorized Box-Muller rounds differently under each ATen CPU capability, so an
AVX2 and an AVX-512 host would have built different "tiny@0" models.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

from .config import ModelConfig

PRESETS: dict[str, ModelConfig] = {
    # Tests: small enough that a 32-step decode is milliseconds.
    "tiny": ModelConfig(
        vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, head_dim=8,
        max_position_embeddings=2048, rope_theta=10000.0,
    ),
    # Benchmarks: Llama-shaped, about 42M parameters (16M of them in lm_head).
    "small": ModelConfig(
        vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
        num_attention_heads=8, num_key_value_heads=2, head_dim=64,
        max_position_embeddings=4096, rope_theta=500000.0,
    ),
}

DEFAULT_SEED = 0


def preset_config(name: str) -> ModelConfig:
    """The config of preset `name`, or a ValueError naming the known presets."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name]


def hf_weight_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Hugging Face Llama parameter names and shapes, in a fixed order."""
    d, hd = cfg.hidden_size, cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, d)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (d,)
        shapes[p + "self_attn.q_proj.weight"] = (cfg.num_attention_heads * hd, d)
        shapes[p + "self_attn.k_proj.weight"] = (cfg.num_key_value_heads * hd, d)
        shapes[p + "self_attn.v_proj.weight"] = (cfg.num_key_value_heads * hd, d)
        shapes[p + "self_attn.o_proj.weight"] = (d, cfg.num_attention_heads * hd)
        shapes[p + "post_attention_layernorm.weight"] = (d,)
        shapes[p + "mlp.gate_proj.weight"] = (cfg.intermediate_size, d)
        shapes[p + "mlp.up_proj.weight"] = (cfg.intermediate_size, d)
        shapes[p + "mlp.down_proj.weight"] = (d, cfg.intermediate_size)
    shapes["model.norm.weight"] = (d,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, d)
    return shapes


def seeded_weights(cfg: ModelConfig, seed: int = DEFAULT_SEED) -> dict[str, torch.Tensor]:
    """Float32 weights drawn deterministically from `seed`.

    Projections are N(0, 1/fan_in) so activations stay O(1) and greedy decoding
    is not a string of near-ties; norm weights are 1 + small noise so a loader
    that drops them is caught by the reference comparison. (The scalings are single
    IEEE operations: the same bits everywhere.)
    """
    import torch  # here: the router reads PRESETS (their tokenizers) without torch

    rng = np.random.Generator(np.random.PCG64(seed))
    out = {}
    for name, shape in hf_weight_shapes(cfg).items():
        x = rng.standard_normal(shape, dtype=np.float32)
        if len(shape) == 1:
            x = np.float32(1.0) + np.float32(0.1) * x
        elif "embed_tokens" not in name:
            x = x / np.float32(math.sqrt(shape[1]))
        out[name] = torch.from_numpy(x)
    return out
