"""Tensor kernels shared by prefill and decode.

Safety invariant (exactness): every op on the exactness path computes a row's
result with the same instructions whatever other rows share the call. Then
chunked prefill, prefix reuse and batched decode produce bit-identical K/V and
logits for a token as a one-shot, one-request run, and a prefill worker's K/V
equal what the decode worker would have computed itself.

Why each op is row-invariant (runtime/kernels/exact.cpp holds the kernels):
- Matrix products — `Linear` (the q|k|v, o, gate|up and down projections and
  lm_head) and `row_bmm` (prefill attention's scores and values, decode
  attention's scores and values): each output element is one sequential chain of
  fused multiply-adds over k, in order, from +0, reading only its row of A and its
  column of B. Row count, row position, blocking, threads and instruction set
  cannot reach it: the AVX2 path and the portable std::fma path (aarch64, x86
  without FMA) give the same bits, and AVX-512 or AMX hosts run the AVX2 path. A
  BLAS promises nothing of the kind: MKL picks a micro-kernel by row count and ISA
  (on AVX-512 hosts, and with MKL limited to AVX2, a row's bits changed with the
  rows around it).
- Sums: RMSNorm's sum of squares (`row_sum`) and softmax's denominators (a column
  of ones beside V, attention.py) are such chains too, not torch reductions.
- Transcendentals: `exp_` and `silu_mul` run the kernels' own exp, one fixed
  sequence of correctly rounded operations per element. torch's exp and silu are
  not position-invariant: their vector body and scalar tail round differently,
  and which elements land in the tail moves with the tensor's size and with where
  threads split it (a 203-token prompt's one-shot prefill split a SwiGLU row
  across two threads and changed its bits against chunked prefill).
- Square roots: `sqrt_` is numpy's (the hardware's, correctly rounded). torch's is
  not on every host: with MKL on some AVX-512 CPUs it runs MKL's vector sqrt, an ulp
  off in ~0.7% of elements, while with MKL limited to AVX2 it is exact.
- Everything else on the path is correctly rounded element-wise (+, -, *, /,
  max, casts) or moves data (index_select, index_copy_, masked_fill_), whose
  results IEEE 754 fixes bit for bit; segment sums (index_add_) add in index order.

Without a build of the kernels (no compiler) the engine runs torch's (`KERNEL` is
None), names that in the cache ABI, and leaves the verdict to the worker's
start-up self-check (selfcheck.py).
"""

from __future__ import annotations

import math
from array import array

import numpy as np
import torch
import torch.nn.functional as F

from runtime import kernels as kernel

KERNEL = kernel.load()
"""The compiled kernel module, or None (torch's BLAS)."""
ISA = kernel.isa()
"""The compiled kernel's code path (PD_KERNEL_ISA)."""
NR = 16
"""Columns per packed panel. Must match NR in runtime/kernels/exact.cpp (checked below)."""
assert KERNEL is None or KERNEL.NR == NR


def kernel_family() -> str:
    """The kernels' numerics, for the cache ABI: the exact kernels' family, or torch's
    version and ATen CPU capability (its results follow both)."""
    if KERNEL is not None:
        return kernel.FAMILY
    return f"torch-{torch.__version__}-{torch.backends.cpu.get_cpu_capability()}"


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """W [N, K] -> W.T in panels [ceil(N/NR), K, NR] float32, zero columns past N."""
    n, k = weight.shape
    panels = -(-n // NR)
    wt = torch.zeros(k, panels * NR, dtype=torch.float32)
    wt[:, :n] = weight.T
    return wt.view(k, panels, NR).permute(1, 0, 2).contiguous()


def _float_rows(x: torch.Tensor) -> torch.Tensor:
    """x as float32 with unit stride along its last dimension (what the kernel reads)."""
    if x.dtype != torch.float32:
        x = x.float()
    return x if x.stride(-1) == 1 else x.contiguous()


def gemm(a: torch.Tensor, b: torch.Tensor, b_panel_stride: int, b_row_stride: int,
         b_batch_stride: int, n: int, isa: int | None = None) -> torch.Tensor:
    """C = A @ B by the compiled kernel.  a: [Bt, M, K] float32, unit last stride;
    B read as in exact.cpp (panels); returns a new [Bt, M, n] float32."""
    bt, m, k = a.shape
    out = torch.empty(bt, m, n, dtype=torch.float32)
    KERNEL.gemm(a.data_ptr(), a.stride(0), a.stride(1),
                b.data_ptr(), b_batch_stride, b_row_stride, b_panel_stride,
                out.data_ptr(), m * n, n, bt, m, n, k, torch.get_num_threads(),
                ISA if isa is None else isa)
    return out


class Linear:
    """y = x @ W.T with row-invariant results; W packed once.  W: [N, K]."""

    __slots__ = ("weight", "packed", "out_features", "in_features")

    def __init__(self, weight: torch.Tensor):
        self.out_features, self.in_features = weight.shape
        self.weight = self.packed = None
        if KERNEL is not None:
            self.packed = pack_panels(weight)  # [P, K, NR]
        else:
            self.weight = weight.contiguous()

    def __call__(self, x: torch.Tensor, isa: int | None = None) -> torch.Tensor:
        """x: [T, K] -> [T, N] in x's dtype."""
        if self.packed is None:
            return F.linear(x, self.weight)
        y = gemm(_float_rows(x)[None], self.packed, self.in_features * NR, NR, 0, self.out_features,
                 isa)[0]
        return y if x.dtype == torch.float32 else y.to(x.dtype)


def row_bmm(a: torch.Tensor, b: torch.Tensor, isa: int | None = None) -> torch.Tensor:
    """Batched a @ b with row-invariant results.  a: [B, M, K], b: [B, K, N] -> [B, M, N]."""
    if KERNEL is None:
        return torch.bmm(a, b)
    b32 = _float_rows(b)
    y = gemm(_float_rows(a), b32, NR, b32.stride(1), b32.stride(0), b.shape[2], isa)
    return y if a.dtype == torch.float32 else y.to(a.dtype)


_ONES = torch.ones(0)


def _ones(n: int) -> torch.Tensor:
    """A float32 column of n ones [n, 1] (grown, never shrunk; read-only)."""
    global _ONES
    if _ONES.numel() < n:
        _ONES = torch.ones(max(n, 2 * _ONES.numel()), 1)
    return _ONES[:n]


def row_sum(x: torch.Tensor) -> torch.Tensor:
    """Each row's sum, added in order.  x: [T, d] float32 -> [T, 1]."""
    if KERNEL is None:
        return x.sum(-1, keepdim=True)
    ones = _ones(x.shape[1])
    return gemm(_float_rows(x)[None], ones, NR, 1, 0, 1)[0]


def exp_(x: torch.Tensor, isa: int | None = None) -> torch.Tensor:
    """x = exp(x) in place, the same bits for an element wherever it sits.  x: float32,
    contiguous. exp(-inf) is exactly 0; below -87 the result is 0, above 88 it is inf."""
    if KERNEL is None:
        return x.exp_()
    assert x.dtype == torch.float32 and x.is_contiguous(), "exp_ needs contiguous float32"
    KERNEL.exp(x.data_ptr(), x.data_ptr(), x.numel(), torch.get_num_threads(),
               ISA if isa is None else isa)
    return x


def sqrt_(x: torch.Tensor) -> torch.Tensor:
    """x = sqrt(x) in place, correctly rounded (IEEE 754) on every CPU.  x: float32,
    contiguous. Not torch's sqrt: on some AVX-512 hosts it runs MKL's vector sqrt, which
    is off by an ulp in ~0.7% of elements, and not with MKL limited to AVX2
    (tests/integration/test_isa_matrix.py); numpy's is the hardware's, exact everywhere."""
    assert x.dtype == torch.float32 and x.is_contiguous(), "sqrt_ needs contiguous float32"
    a = x.numpy()
    np.sqrt(a, out=a)
    return x


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32 and cast back (as Llama does).  x: [T, d]."""
    xf = x.float()
    mean_square = row_sum(xf * xf) / xf.shape[1]  # [T, 1]
    xf = xf * (1.0 / sqrt_((mean_square + eps).contiguous()))
    return weight * xf.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> list[float]:
    """Inverse frequencies (head_dim/2 Python floats), with Llama-3 frequency-dependent
    scaling. Computed in double precision, one element at a time (see rope_tables)."""
    inv = [1.0 / theta ** (i / head_dim) for i in range(0, head_dim, 2)]
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind != "llama3":
        return inv
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_len = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        # Long wavelengths are stretched by `factor`, short ones kept, the band between blended.
        scaled = f / factor if wavelen > low_wavelen else f
        if high_wavelen <= wavelen <= low_wavelen:
            smooth = (old_len / wavelen - low) / (high - low)
            scaled = (1 - smooth) * scaled / factor + smooth * scaled
        out.append(scaled)
    return out


def rope_tables(inv_freq: list[float], max_len: int, dtype: torch.dtype):
    """cos/sin tables [max_len, head_dim] in the 'rotate half' layout.

    Every entry is math.cos / math.sin of a double-precision angle, rounded once to
    `dtype`: the same bits for a position whatever max_len, the thread count or the
    CPU (torch's cos/sin round differently in their vector body and scalar tail, and
    the tail moves with the table's size). Keys are stored rotated, so two workers
    must agree on these bits to agree on K/V.
    """
    angles = torch.arange(max_len, dtype=torch.float64)[:, None] * torch.tensor(inv_freq, dtype=torch.float64)
    flat = angles.flatten().tolist()  # a double product is correctly rounded: exact bits

    def table(fn) -> torch.Tensor:
        return torch.frombuffer(array("d", map(fn, flat)), dtype=torch.float64).view(angles.shape).to(dtype)

    cos, sin = table(math.cos), table(math.sin)
    return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x: [T, heads, D] by per-token cos/sin: [T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def silu_mul(gate_up: torch.Tensor, isa: int | None = None) -> torch.Tensor:
    """SwiGLU activation of a fused [T, 2I] gate|up projection -> [T, I]:
    gate / (1 + exp(-gate)) * up, with the kernels' exp."""
    if KERNEL is None:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up
    gu = _float_rows(gate_up)
    t, inner = gu.shape[0], gu.shape[1] // 2
    out = torch.empty(t, inner, dtype=torch.float32)
    KERNEL.silu_mul(gu.data_ptr(), out.data_ptr(), t, inner, gu.stride(0), inner,
                    torch.get_num_threads(), ISA if isa is None else isa)
    return out if gate_up.dtype == torch.float32 else out.to(gate_up.dtype)
