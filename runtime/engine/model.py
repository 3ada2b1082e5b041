"""Llama decoder in torch: RMSNorm, RoPE, grouped-query attention, SwiGLU.

Weights arrive with Hugging Face names and are fused at load time (q|k|v into one
projection, gate|up into another) so each layer runs four matrix products.
The model holds no K/V itself: forward passes read and write a `KVCache` at the
slots the engine gives them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .attention import DecodeMeta, decode_attention, prefill_attention
from .config import ModelConfig
from .kv_cache import KVCache
from .ops import Linear, apply_rope, rms_norm, rope_inv_freq, rope_tables, silu_mul

LayerCallback = Callable[[int], None]


class LlamaModel:
    """Fused, inference-only Llama weights plus the two forward passes."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor],
                 dtype: torch.dtype = torch.float32, max_len: int = 0):
        self.cfg = cfg
        self.dtype = dtype
        w = {k: v.to(dtype) for k, v in weights.items()}
        self.embed = w["model.embed_tokens.weight"]  # [V, d]
        self.lm_head = Linear(self.embed if cfg.tie_word_embeddings else w["lm_head.weight"])
        self.final_norm = w["model.norm.weight"]
        self.layers = []
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            self.layers.append(dict(
                ln1=w[p + "input_layernorm.weight"],
                qkv=Linear(torch.cat([w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])),
                o=Linear(w[p + "self_attn.o_proj.weight"]),
                ln2=w[p + "post_attention_layernorm.weight"],
                gate_up=Linear(torch.cat([w[p + "mlp.gate_proj.weight"],
                                          w[p + "mlp.up_proj.weight"]])),
                down=Linear(w[p + "mlp.down_proj.weight"]),
            ))
        inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.cos, self.sin = rope_tables(inv, max_len or cfg.max_position_embeddings, dtype)
        h, hk, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self._split = (h * d, hk * d, hk * d)

    def _qkv(self, layer: dict, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Normed input -> rotated q [T, H, D], k [T, Hkv, D], v [T, Hkv, D]."""
        cfg = self.cfg
        t = x.shape[0]
        q, k, v = layer["qkv"](x).split(self._split, dim=-1)
        q = q.reshape(t, cfg.num_attention_heads, cfg.head_dim)
        k = k.reshape(t, cfg.num_key_value_heads, cfg.head_dim)
        v = v.reshape(t, cfg.num_key_value_heads, cfg.head_dim)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _mlp_residual(self, layer: dict, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = x + layer["o"](attn)
        h = rms_norm(x, layer["ln2"], self.cfg.rms_norm_eps)
        return x + layer["down"](silu_mul(layer["gate_up"](h)))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and lm_head: [N, d] -> float32 logits [N, V]."""
        h = rms_norm(hidden, self.final_norm, self.cfg.rms_norm_eps)
        return self.lm_head(h).float()

    @torch.inference_mode()
    def forward_prefill(self, token_ids: torch.Tensor, q_start: int, slots: torch.Tensor,
                        block_table: torch.Tensor, cache: KVCache, tile: int,
                        on_layer: LayerCallback | None = None,
                        replay: DecodeMeta | None = None) -> torch.Tensor:
        """One chunk of one sequence; writes its K/V; returns the last token's logits [1, V].

        token_ids, slots: [C] (positions q_start .. q_start+C-1);
        block_table: the sequence's blocks padded to whole attention tiles, covering the
        rows that are not replayed.
        `on_layer(l)` fires as soon as layer l's K/V for this chunk is in the cache.
        `replay`: the chunk's last `replay.batch` rows are outputs replayed (a resumed
        request, SamplingParams.first_step), each over its own context: their attention
        runs as decode ran it (`decode_attention`), so their K/V and hidden states are
        decode's bits, not the tiled prefill's.
        """
        x = self.prefill_hidden(token_ids, q_start, slots, block_table, cache, tile, on_layer, replay)
        return self.logits(x[-1:])

    @torch.inference_mode()
    def prefill_hidden(self, token_ids: torch.Tensor, q_start: int, slots: torch.Tensor,
                       block_table: torch.Tensor, cache: KVCache, tile: int,
                       on_layer: LayerCallback | None = None,
                       replay: DecodeMeta | None = None) -> torch.Tensor:
        """forward_prefill up to the last layer's output [C, d] (no final norm, no lm_head)."""
        c = token_ids.numel()
        head = c - (replay.batch if replay is not None else 0)  # rows computed as prefill computes them
        cos, sin = self.cos[q_start:q_start + c], self.sin[q_start:q_start + c]
        x = self.embed[token_ids]  # [C, d]
        for li, layer in enumerate(self.layers):
            h = rms_norm(x, layer["ln1"], self.cfg.rms_norm_eps)
            q, k, v = self._qkv(layer, h, cos, sin)
            cache.write(li, slots, k, v)
            if on_layer is not None:
                on_layer(li)
            if replay is None:
                attn = prefill_attention(q, cache.k[li], cache.v[li], block_table, q_start, tile)
            else:
                tail = decode_attention(q[head:], cache.k[li], cache.v[li], replay)
                attn = tail if head == 0 else torch.cat(
                    [prefill_attention(q[:head], cache.k[li], cache.v[li], block_table, q_start, tile), tail])
            x = self._mlp_residual(layer, x, attn)
        return x

    @torch.inference_mode()
    def forward_decode(self, token_ids: torch.Tensor, positions: torch.Tensor,
                       slots: torch.Tensor, meta: DecodeMeta, cache: KVCache) -> torch.Tensor:
        """One new token per sequence; writes its K/V; returns logits [B, V]."""
        return self.logits(self.decode_hidden(token_ids, positions, slots, meta, cache))

    @torch.inference_mode()
    def decode_hidden(self, token_ids: torch.Tensor, positions: torch.Tensor,
                      slots: torch.Tensor, meta: DecodeMeta, cache: KVCache) -> torch.Tensor:
        """forward_decode up to the last layer's output [B, d] (no final norm, no lm_head)."""
        cos, sin = self.cos[positions], self.sin[positions]
        x = self.embed[token_ids]  # [B, d]
        for li, layer in enumerate(self.layers):
            h = rms_norm(x, layer["ln1"], self.cfg.rms_norm_eps)
            q, k, v = self._qkv(layer, h, cos, sin)
            cache.write(li, slots, k, v)
            attn = decode_attention(q, cache.k[li], cache.v[li], meta)
            x = self._mlp_residual(layer, x, attn)
        return x
