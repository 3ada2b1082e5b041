"""Cache ABI: everything two engines must agree on before exchanging K/V bytes.

The descriptor names the byte layout (layers, K/V heads, head dim, dtype, block
size, layout), what the bytes mean (RoPE parameters — keys are stored rotated),
whose they are (model identity = digest of config and weights), and the numerics
that produced them (the engine and its numerics version, whether it is batch-invariant,
attention tile, kernel family): two engines whose kernels would
compute different bits for the same prompt must not exchange K/V, or a
disaggregated request would decode from K/V its decode worker could not have
computed itself. Two engines exchange K/V only when their `digest` values are equal.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass

import torch
import xxhash

from .config import ModelConfig
from .errors import AbiMismatch

PDSERVE_ENGINE = "pdserve/1"
"""This engine's name in the ABI, with its numerics version: bumped when a change of its
kernels or attention would give other bits for the same prompt (`kernels` and
`attn_tile_tokens` name the settings; this names the code)."""


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
    attn_tile_tokens: int
    """Key tile of prefill attention (PD_ATTN_TILE_TOKENS): it orders the online softmax,
    so every layer's K/V after the first depends on it."""
    kernels: str
    """Numerics of the compute kernels (ops.kernel_family()): the exact kernels give the
    same bits on every CPU; torch's are named with torch's version and ATen's CPU
    capability. A worker whose start-up self-check failed has a name of its own here
    (selfcheck.py), so it pairs with nobody."""
    engine: str = PDSERVE_ENGINE
    """The engine that writes the K/V, with the version of its numerics ("pdserve/1" for
    this one; another engine names itself and its build). Two engines never pair: the
    same model on another engine computes other bits."""
    batch_invariant: bool = True
    """Whether a sequence's K/V does not depend on what it was batched with (this engine:
    always, tested). A worker that promises a hand-off bit-equal to colocated pairs only
    with one that promises the same."""

    @functools.cached_property
    def digest(self) -> str:
        """Hex digest of the whole descriptor (computed once: a frozen descriptor never changes,
        and every prompt and commit asks for it; ~4% of a prefill worker's CPU when recomputed)."""
        body = json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()[:32]

    def summary(self) -> str:
        """The fields that most often differ between two workers, for error messages."""
        return (f"engine {self.engine}{'' if self.batch_invariant else ' (not batch-invariant)'}, "
                f"{self.dtype}, block {self.block_size}, attention tile {self.attn_tile_tokens}, "
                f"kernels {self.kernels}, model {self.model_identity[:12]}")

    def to_dict(self) -> dict:
        """Plain dict (for protos and logs)."""
        return dataclasses.asdict(self)

    def check_compatible(self, other: CacheAbi | str) -> None:
        """Raise AbiMismatch naming the differing fields unless `other` equals self."""
        if isinstance(other, str):
            if other != self.digest:
                raise AbiMismatch(f"cache ABI digest {other} does not match this worker's {self.digest} "
                                  f"({self.summary()})")
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


def make_abi(cfg: ModelConfig, identity: str, dtype: str, block_size: int, layout: str,
             attn_tile_tokens: int, kernels: str) -> CacheAbi:
    """The ABI of an engine running `cfg` with these cache settings and numerics."""
    return CacheAbi(
        num_layers=cfg.num_hidden_layers, num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, dtype=dtype, block_size=block_size, layout=layout,
        rope_theta=cfg.rope_theta,
        rope_scaling=json.dumps(cfg.rope_scaling, sort_keys=True, separators=(",", ":")),
        model_identity=identity, attn_tile_tokens=attn_tile_tokens, kernels=kernels,
    )
