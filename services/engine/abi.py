"""Cache ABI: everything two engines must agree on before exchanging K/V bytes.

The descriptor names the byte layout (layers, K/V heads, head dim, dtype, block
size, layout), what the bytes mean (RoPE parameters — keys are stored rotated),
and whose they are (model identity = digest of config and weights). Two engines
exchange K/V only when their `digest` values are equal.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

import torch
import xxhash

from .config import ModelConfig
from .errors import AbiMismatch


@dataclass(frozen=True)
class CacheAbi:
    """Layout and identity of a K/V cache."""

    num_layers: int
    """Decoder layers, each with its own K and V."""
    num_kv_heads: int
    """K/V heads per layer."""
    head_dim: int
    """Width of one head."""
    dtype: str
    """Element type name, e.g. float32."""
    block_size: int
    """Tokens per block."""
    layout: str
    """Memory layout tag (kv_cache.LAYOUT)."""
    rope_theta: float
    """RoPE base used to rotate stored keys."""
    rope_scaling: str
    """Canonical JSON of the RoPE scaling dict ('null' when none)."""
    model_identity: str
    """Digest of model config and weights."""

    @property
    def digest(self) -> str:
        """Hex digest of the whole descriptor."""
        body = json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()[:32]

    def to_dict(self) -> dict:
        """Plain dict (for protos and logs)."""
        return dataclasses.asdict(self)

    def check_compatible(self, other: "CacheAbi | str") -> None:
        """Raise AbiMismatch naming the differing fields unless `other` equals self."""
        if isinstance(other, str):
            if other != self.digest:
                raise AbiMismatch(f"cache ABI digest {other} does not match local {self.digest}")
            return
        diff = [f.name for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(other, f.name)]
        if diff:
            detail = ", ".join(f"{n}: {getattr(other, n)!r} vs local {getattr(self, n)!r}"
                               for n in diff)
            raise AbiMismatch(f"cache ABI mismatch ({detail})")


def model_identity(cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> str:
    """xxh3-128 over the canonical config and every weight's name, shape, dtype and bytes."""
    h = xxhash.xxh3_128(cfg.canonical_json().encode())
    for name in sorted(weights):
        t = weights[name].detach().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().data if t.numel() else b"")
    return h.hexdigest()


def make_abi(cfg: ModelConfig, identity: str, dtype: str, block_size: int, layout: str) -> CacheAbi:
    """The ABI of an engine running `cfg` with these cache settings."""
    return CacheAbi(
        num_layers=cfg.num_hidden_layers, num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, dtype=dtype, block_size=block_size, layout=layout,
        rope_theta=cfg.rope_theta,
        rope_scaling=json.dumps(cfg.rope_scaling, sort_keys=True, separators=(",", ":")),
        model_identity=identity,
    )
