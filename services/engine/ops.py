"""Tensor kernels shared by prefill and decode.

Safety invariant (exactness): every op here computes a row's result with the same
instructions whatever other rows share the call. Then chunked prefill, prefix
reuse and batched decode produce bit-identical K/V and logits for a token as a
one-shot, one-request run. Element-wise ops and last-dim reductions are row
independent by construction; matrix products are not — the BLAS picks a
different micro-kernel for a handful of rows (measured on MKL/AVX2: fewer than 4
rows per thread). `row_linear` and `row_bmm` therefore pad the row count up to a
multiple of ROW_QUANTUM, which keeps every row on the same kernel.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# Must match the padding assumed by tests/unit/test_ops.py.
ROW_QUANTUM = 8


def padded_rows(n: int) -> int:
    """Smallest multiple of ROW_QUANTUM that is >= n (and >= ROW_QUANTUM)."""
    return max(ROW_QUANTUM, -(-n // ROW_QUANTUM) * ROW_QUANTUM)


def row_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T with row-count-invariant results.  x: [T, K], weight: [N, K] -> [T, N]."""
    t = x.shape[0]
    tp = padded_rows(t)
    if tp != t:
        x = torch.cat([x, x.new_zeros(tp - t, x.shape[1])])
    return F.linear(x, weight)[:t]


def _onednn_ok(dtype: torch.dtype) -> bool:
    return (dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class Linear:
    """y = x @ W.T with row-invariant results, weight pre-packed once.  W: [N, K]."""

    __slots__ = ("weight", "_packed")

    def __init__(self, weight: torch.Tensor, rows_hint: int = 16):
        self.weight = weight.contiguous()
        self._packed = None
        if _onednn_ok(weight.dtype):
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, rows_hint)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, K] -> [T, N]."""
        if self._packed is None:
            return row_linear(x, self.weight)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self._packed, None,
                                                  "none", [], "")


def row_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Batched a @ b whose rows are invariant to the row count.  a: [B, M, K], b: [B, K, N]."""
    m = a.shape[1]
    mp = padded_rows(m)
    if mp != m:
        a = torch.cat([a, a.new_zeros(a.shape[0], mp - m, a.shape[2])], dim=1)
    return torch.bmm(a, b)[:, :m]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32 and cast back (as Llama does).  x: [T, d]."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies [head_dim/2], with Llama-3 frequency-dependent scaling."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind != "llama3":
        return inv
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_len = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    # Long wavelengths are stretched by `factor`, short ones kept, the band between blended.
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, blended, scaled)


def rope_tables(inv_freq: torch.Tensor, max_len: int, dtype: torch.dtype):
    """cos/sin tables [max_len, head_dim] in the 'rotate half' layout."""
    pos = torch.arange(max_len, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x: [T, heads, D] by per-token cos/sin: [T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU activation of a fused [T, 2I] gate|up projection -> [T, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
