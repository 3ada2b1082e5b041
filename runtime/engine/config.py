"""Model and engine configuration.

`ModelConfig` mirrors the Hugging Face Llama `config.json` fields we use, so a
preset and a real checkpoint describe a model the same way. `EngineConfig` is the
runtime knob set of one engine instance, a settings class (runtime/common/settings.py)
whose `PD_*` variables the worker's settings inherit.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import model_validator
from pydantic_settings import SettingsConfigDict

from runtime.common.settings import Settings, env

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")
"""The dtypes an engine computes in, by torch's names (torch is imported where a dtype is made:
the router reads presets' configs for their tokenizers without it)."""


@dataclass(frozen=True)
class ModelConfig:
    """Llama architecture hyper-parameters (Hugging Face field names)."""

    vocab_size: int
    """Number of token ids; valid ids are [0, vocab_size)."""
    hidden_size: int
    """Residual stream width d."""
    intermediate_size: int
    """SwiGLU inner width."""
    num_hidden_layers: int
    """Number of decoder layers L."""
    num_attention_heads: int
    """Query heads."""
    num_key_value_heads: int
    """K/V heads (grouped-query attention when < query heads)."""
    head_dim: int = 0
    """Per-head width; 0 means hidden_size // num_attention_heads."""
    rms_norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    rope_theta: float = 10000.0
    """RoPE base."""
    rope_scaling: dict | None = None
    """Llama-3 style scaling dict (rope_type 'llama3'), or None."""
    max_position_embeddings: int = 2048
    """Longest context (prompt + output) the model accepts."""
    tie_word_embeddings: bool = False
    """lm_head shares the embedding matrix."""
    bos_token_id: int | None = 1
    """Beginning-of-sequence id (informational)."""
    eos_token_id: int | list[int] | None = 2
    """End-of-sequence id(s); default stop ids."""

    def __post_init__(self):
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if kind not in ("llama3", "default"):
                raise ValueError(f"unsupported rope scaling type {kind!r}")

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """The stop ids as a tuple (config may hold one id or a list)."""
        if self.eos_token_id is None:
            return ()
        if isinstance(self.eos_token_id, int):
            return (self.eos_token_id,)
        return tuple(self.eos_token_id)

    def to_hf_dict(self) -> dict[str, Any]:
        """A `config.json` body that transformers' LlamaConfig understands."""
        d = dataclasses.asdict(self)
        d.update(architectures=["LlamaForCausalLM"], model_type="llama",
                 hidden_act="silu", attention_bias=False, mlp_bias=False)
        if d["rope_scaling"] is None:
            d.pop("rope_scaling")
        # transformers 5 reads rope settings from rope_parameters.
        rope = dict(self.rope_scaling or {"rope_type": "default"})
        rope["rope_theta"] = self.rope_theta
        d["rope_parameters"] = rope
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Parse a Hugging Face Llama config.json (transformers 4 or 5 spelling)."""
        if d.get("model_type", "llama") != "llama":
            raise ValueError(f"model_type {d.get('model_type')!r} is not llama")
        if d.get("attention_bias") or d.get("mlp_bias"):
            raise ValueError("attention/MLP biases are not supported")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {d.get('hidden_act')!r} is not silu")
        rope = d.get("rope_parameters") or {}
        scaling = d.get("rope_scaling") or None
        theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
        if scaling is None and rope.get("rope_type", "default") != "default":
            scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names and k not in ("rope_theta", "rope_scaling")}
        if kw.get("head_dim") is None:
            kw["head_dim"] = 0
        return cls(rope_theta=float(theta), rope_scaling=scaling, **kw)

    def canonical_json(self) -> str:
        """Stable serialization used in the model identity digest."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))


DType = Literal["float32", "bfloat16", "float16"]
assert set(get_args(DType)) == set(DTYPES)


class EngineConfig(Settings):
    """Runtime settings of one engine instance (the worker's settings extend these)."""

    model_config = SettingsConfigDict(env_ignore_empty=True)

    block_size: int = env("PD_BLOCK_SIZE", 16, gt=0)
    """Tokens per K/V block."""
    num_blocks: int = env("PD_NUM_BLOCKS", 512, gt=0)
    """Blocks in the pool (per layer, K and V each)."""
    chunk_tokens: int = env("PD_CHUNK_TOKENS", 256, gt=0)
    """Most prompt tokens one prefill forward computes (chunked prefill)."""
    dtype: DType = env("PD_DTYPE", "float32")
    """Compute and cache dtype: float32 (CPU default), bfloat16 or float16."""
    torch_threads: int = env("PD_TORCH_THREADS", 1, ge=0)
    """Intra-op threads for this engine; 0 leaves torch's default (every core). One by
    default: a serving host runs several engines (one per worker process) that would
    otherwise each start a thread per core and fight over them."""
    max_model_len: int = env("PD_MAX_MODEL_LEN", 0, ge=0)
    """Longest prompt + output; 0 means the model's max_position_embeddings."""
    attn_tile_tokens: int = env("PD_ATTN_TILE_TOKENS", 128, gt=0)
    """Key tile of prefill attention; a multiple of block_size (see attention.py)."""

    @model_validator(mode="after")
    def _tile_holds_whole_blocks(self):
        if self.attn_tile_tokens % self.block_size:
            raise ValueError(f"attn_tile_tokens={self.attn_tile_tokens} is not a multiple of "
                             f"block_size={self.block_size}")
        return self

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype named by `dtype`."""
        import torch

        return getattr(torch, self.dtype)

    def engine_config(self) -> EngineConfig:
        """Just the engine's settings (the worker's settings carry them among others)."""
        return EngineConfig(**{name: getattr(self, name) for name in EngineConfig.model_fields})


__all__ = ["ModelConfig", "EngineConfig", "DTYPES"]
