"""The kernels' row invariance, which every exactness guarantee rests on."""

from __future__ import annotations

import pytest
import torch

from services.engine.ops import Linear, row_bmm, row_linear

ROW_COUNTS = list(range(1, 20)) + [31, 32, 33, 64, 100, 257]


@pytest.mark.parametrize("n,k", [(96, 64), (768, 512), (300, 1408)])
@pytest.mark.parametrize("threads", [1, 2])
def test_linear_rows_do_not_depend_on_row_count(n, k, threads):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(n * k)
        w, x = torch.randn(n, k, generator=gen), torch.randn(300, k, generator=gen)
        for lin in (Linear(w), lambda t: row_linear(t, w)):
            ref = lin(x)
            for m in ROW_COUNTS:
                for start in (0, 5):
                    assert torch.equal(lin(x[start:start + m]), ref[start:start + m]), (m, start)
    finally:
        torch.set_num_threads(old)


def test_linear_matches_plain_matmul_numerically():
    gen = torch.Generator().manual_seed(1)
    w, x = torch.randn(200, 64, generator=gen), torch.randn(9, 64, generator=gen)
    assert torch.allclose(Linear(w)(x), x @ w.T, atol=1e-5)


def test_row_bmm_rows_do_not_depend_on_row_count():
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randn(2, 300, 16, generator=gen), torch.randn(2, 16, 128, generator=gen)
    ref = row_bmm(a, b)
    for m in ROW_COUNTS:
        assert torch.equal(row_bmm(a[:, 3:3 + m], b), ref[:, 3:3 + m]), m
