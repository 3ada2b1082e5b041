"""The kernels' row invariance, which every exactness guarantee rests on.

Every matrix product on the exactness path runs kernels/gemm.cpp (ops.py says
why it is invariant). These tests hold it to that: a row's bits do not depend on
the rows around it, the thread count, or the code path (AVX2 or portable, the one
aarch64 runs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runtime import kernels as kernel
from runtime.engine import ops
from runtime.engine.ops import Linear, row_bmm

ROW_COUNTS = list(range(1, 20)) + [31, 32, 33, 64, 100, 257]
PORTABLE = kernel.ISAS["portable"]
AVX2 = kernel.ISAS["avx2"]


def _isas() -> list[int]:
    """The kernel's code paths this CPU can run."""
    return [PORTABLE] + ([AVX2] if ops.KERNEL.isa() == "avx2" else [])


@pytest.fixture(autouse=True)
def _kernel_built():
    assert ops.KERNEL is not None, (
        f"the engine runs torch's kernels ({kernel.ENV_KERNEL}={kernel.choice()}); "
        f"`make native` builds kernels/gemm.cpp")


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    old = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(old)


@pytest.mark.parametrize("n,k", [(96, 64), (768, 512), (300, 1408), (13, 5), (8, 8)])
def test_linear_rows_do_not_depend_on_row_count(n, k, threads):
    gen = torch.Generator().manual_seed(n * k)
    w, x = torch.randn(n, k, generator=gen), torch.randn(300, k, generator=gen)
    lin = Linear(w)
    ref = lin(x)
    for m in ROW_COUNTS:
        for start in (0, 5):
            assert torch.equal(lin(x[start:start + m]), ref[start:start + m]), (m, start)


@pytest.mark.parametrize("shape", [(2, 300, 16, 128), (2, 512, 64, 128), (2, 512, 128, 64),
                                   (96, 4, 64, 16), (5, 37, 24, 8)],
                         ids=lambda s: "x".join(map(str, s)))
def test_row_bmm_rows_do_not_depend_on_row_count(shape, threads):
    batch, m_all, k, n = shape
    gen = torch.Generator().manual_seed(sum(shape))
    a, b = torch.randn(batch, m_all, k, generator=gen), torch.randn(batch, k, n, generator=gen)
    ref = row_bmm(a, b)
    for m in [c for c in ROW_COUNTS if c <= m_all - 3]:
        assert torch.equal(row_bmm(a[:, 3:3 + m], b), ref[:, 3:3 + m]), m
    # A batch entry's result does not depend on the other entries either.
    assert torch.equal(row_bmm(a[1:2], b[1:2]), ref[1:2])


@pytest.mark.parametrize("n,k,m", [(768, 512, 37), (17, 3, 7), (16, 1, 6), (1, 9, 1), (40, 0, 3)])
def test_code_paths_give_the_same_bits(n, k, m):
    """The AVX2 path and the portable std::fma path (aarch64's) agree bit for bit."""
    gen = torch.Generator().manual_seed(7 + n + k + m)
    w, x = torch.randn(n, k, generator=gen), torch.randn(m, k, generator=gen)
    lin = Linear(w)
    outs = [lin(x, isa=isa) for isa in _isas()]
    a, b = torch.randn(3, m, k, generator=gen), torch.randn(3, k, n, generator=gen)
    prods = [row_bmm(a, b, isa=isa) for isa in _isas()]
    for out, prod in zip(outs[1:], prods[1:]):
        assert torch.equal(out, outs[0]) and torch.equal(prod, prods[0])


def test_products_match_float64_numerically():
    gen = torch.Generator().manual_seed(1)
    w, x = torch.randn(200, 64, generator=gen), torch.randn(9, 64, generator=gen)
    want = (x.double() @ w.double().T).float()
    assert torch.allclose(Linear(w)(x), want, atol=1e-5, rtol=1e-5)
    a, b = torch.randn(2, 9, 40, generator=gen), torch.randn(2, 40, 21, generator=gen)
    assert torch.allclose(row_bmm(a, b), torch.bmm(a.double(), b.double()).float(), atol=1e-5)
    # An empty sum is +0.
    assert torch.equal(Linear(w[:, :0])(x[:, :0]), torch.zeros(9, 200))


def test_strided_operands_read_correctly():
    """Views (a row range of a wider tensor, a transposed B) compute what copies do."""
    gen = torch.Generator().manual_seed(3)
    a_wide, b_t = torch.randn(2, 30, 50, generator=gen), torch.randn(2, 33, 20, generator=gen)
    a, b = a_wide[:, 4:25, 10:30], b_t.transpose(1, 2)  # [2, 21, 20] and [2, 20, 33]
    assert torch.equal(row_bmm(a, b), row_bmm(a.contiguous(), b.contiguous()))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_rows_are_invariant(dtype):
    gen = torch.Generator().manual_seed(5)
    w, x = torch.randn(96, 64, generator=gen).to(dtype), torch.randn(40, 64, generator=gen).to(dtype)
    lin = Linear(w)
    ref = lin(x)
    assert ref.dtype == dtype
    for m in (1, 3, 8, 17):
        assert torch.equal(lin(x[2:2 + m]), ref[2:2 + m])


def _ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|got - want| in units of float32's last place at want."""
    spacing = torch.nextafter(want.abs(), torch.tensor(float("inf"))) - want.abs()
    return (got.double() - want.double()).abs() / spacing.double()


def test_exp_is_accurate_and_exact_at_the_edges():
    x = torch.linspace(-86.9, 87.9, 200_001)
    got = ops.exp_(x.clone())
    want = torch.exp(x.double()).float()
    assert _ulps(got, want).max() <= 2
    edges = torch.tensor([float("-inf"), -1e30, -87.5, 0.0, -0.0, 88.5, 1e30, float("inf")])
    assert ops.exp_(edges.clone()).tolist() == [0.0, 0.0, 0.0, 1.0, 1.0] + [float("inf")] * 3
    assert torch.isnan(ops.exp_(torch.tensor([float("nan")]))).all()


def test_exp_bits_do_not_depend_on_position_threads_or_path(threads):
    """torch.exp's vector body and scalar tail differ; here an element is an element."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(70_001, generator=gen) * 20  # past the kernel's one-thread size
    ref = ops.exp_(x.clone())
    for start, length in [(0, 1), (3, 5), (1, 8), (7, 9), (5, 40_000), (1, 70_000)]:
        assert torch.equal(ops.exp_(x[start:start + length].clone()), ref[start:start + length])
    for isa in _isas():
        assert torch.equal(ops.exp_(x.clone(), isa=isa), ref)


def test_silu_mul_rows_and_paths_agree(threads):
    gen = torch.Generator().manual_seed(12)
    gu = torch.randn(300, 2 * 176, generator=gen) * 4
    ref = ops.silu_mul(gu)
    gate, up = gu.chunk(2, dim=-1)
    assert torch.allclose(ref, torch.nn.functional.silu(gate.double()).float() * up, atol=1e-5, rtol=1e-5)
    for m in ROW_COUNTS:
        assert torch.equal(ops.silu_mul(gu[5:5 + m]), ref[5:5 + m]), m
    for isa in _isas():
        assert torch.equal(ops.silu_mul(gu, isa=isa), ref)


def test_rms_norm_rows_do_not_depend_on_row_count(threads):
    gen = torch.Generator().manual_seed(13)
    x, w = torch.randn(300, 512, generator=gen), 1 + 0.1 * torch.randn(512, generator=gen)
    ref = ops.rms_norm(x, w, 1e-5)
    want = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    assert torch.allclose(ref.double(), want, atol=1e-5)
    for m in ROW_COUNTS:
        assert torch.equal(ops.rms_norm(x[2:2 + m], w, 1e-5), ref[2:2 + m]), m


def test_sqrt_is_correctly_rounded():
    """ops.sqrt_ (RMSNorm's) is the float32 nearest the exact root, for every element: the
    float64 root rounded once more is (double rounding is innocuous for sqrt). torch's own
    sqrt is not on some AVX-512 hosts (MKL's vector sqrt)."""
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.rand(200_000, generator=g) * 1e4, torch.rand(1000, generator=g) * 1e-30,
                   torch.tensor([0.0, 1.0, 2.0, 3.4e38, 1e-45])])
    want = np.sqrt(x.numpy().astype(np.float64)).astype(np.float32)
    got = ops.sqrt_(x.clone())
    assert np.array_equal(got.numpy(), want)


# Every ATen op the engine runs, reviewed: data movement and creation, casts, comparisons,
# exact selections (max, sort), the element-wise ops IEEE 754 rounds correctly in any
# SIMD width (add, sub, mul, div, reciprocal, neg), and the reductions that add in a fixed
# order (cumsum's scan, index_add_ and scatter_reduce in index order). MKL's vector math
# (torch's sqrt, exp, log, sin, ... on MKL builds) is not in it: it is not correctly
# rounded on every CPU (runtime/engine/ops.py).
REVIEWED_OPS = frozenset(f"aten.{op}" for op in (
    "_local_scalar_dense add add_ alias amax arange argmax bitwise_not cat contiguous copy_ cumsum detach "
    "div empty expand fill_ full full_like ge gt index index_add_ index_copy_ index_put_ index_select "
    "lift_fresh lt masked_fill masked_fill_ max maximum mul mul_ neg ones permute reciprocal "
    "repeat_interleave reshape resolve_conj resolve_neg scatter scatter_ scatter_reduce select slice sort "
    "split_with_sizes sub sub_ to unsqueeze view zeros zeros_like").split())


def test_the_engine_runs_only_reviewed_torch_ops():
    """Prefill, batched decode and sampling (greedy, top-p, top-k) of the tiny preset call
    no torch op outside REVIEWED_OPS: a new one (torch.sqrt, torch.exp, ...) must be shown
    correctly rounded on every CPU, or run by the kernels, before it joins the list."""
    import random

    from torch.utils._python_dispatch import TorchDispatchMode

    from runtime.engine import Engine, EngineConfig, SamplingParams

    seen: set[str] = set()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    engine = Engine.from_preset("tiny", cfg=EngineConfig(num_blocks=256, attn_tile_tokens=64, chunk_tokens=37))
    rng = random.Random(7)
    with Record():
        seqs = [engine.add_request(f"r{i}", [rng.randrange(512) for _ in range(n)], 4, SamplingParams(
            temperature=0.9 if i else 0.0, top_p=0.9, top_k=20 if i == 2 else 0, seed=i, ignore_eos=True))
            for i, n in enumerate((5, 130, 300))]
        for s in seqs:
            engine.prefill(s)
        while not all(s.is_finished for s in seqs):
            engine.decode_step([s for s in seqs if not s.is_finished])
    assert "aten.mul" in seen and "aten.index_select" in seen  # it did record the path
    assert seen <= REVIEWED_OPS, f"not reviewed for exactness on every CPU: {sorted(seen - REVIEWED_OPS)}"


@pytest.mark.parametrize("n", [512, 32000, 131072])
def test_top_p_cumsum_is_a_sequential_float64_scan(n):
    """The sampler's top-p mass (torch.cumsum of float32 probabilities) is the in-order
    running sum kept in float64 and rounded once per element: one fixed sequence of
    correctly rounded steps, so the same bits on every CPU."""
    x = torch.rand(n, generator=torch.Generator().manual_seed(n)) / n
    want = np.cumsum(x.numpy().astype(np.float64)).astype(np.float32)
    assert np.array_equal(torch.cumsum(x, 0).numpy(), want)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "reciprocal"])
def test_reviewed_arithmetic_is_correctly_rounded(op):
    """The element-wise arithmetic REVIEWED_OPS trusts gives the float32 nearest the exact
    result on this CPU's vector path (torch's AVX-512, AVX2 or scalar kernels alike): the
    float64 result rounded once more is that (double rounding is innocuous here, float64
    having more than twice float32's precision plus two bits). A kernel built on an
    approximation (rcp14 and a Newton step, say) fails here before it breaks exactness."""
    g = torch.Generator().manual_seed(17)
    n = 100_003  # odd: the vector loop and its tail both run
    a = (torch.rand(n, generator=g) - 0.5) * torch.exp2(torch.randint(-40, 40, (n,), generator=g).float())
    b = (torch.rand(n, generator=g) + 0.01) * torch.exp2(torch.randint(-40, 40, (n,), generator=g).float())
    a64, b64 = a.numpy().astype(np.float64), b.numpy().astype(np.float64)
    got, want = {
        "add": (a + b, a64 + b64), "sub": (a - b, a64 - b64), "mul": (a * b, a64 * b64),
        "div": (a / b, a64 / b64), "reciprocal": (torch.reciprocal(b), 1.0 / b64),
    }[op]
    assert np.array_equal(got.numpy(), want.astype(np.float32))
