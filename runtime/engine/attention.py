"""Attention over the paged K/V cache: torch for data movement, the exact kernels for
every product, sum and exponential (ops.py).

Cache tensors per layer: k, v: [num_blocks, block_size, n_kv_heads, head_dim].

Prefill (`prefill_attention`) — one sequence's chunk of C query tokens at
absolute positions [q_start, q_start + C) attends to every cached key at
positions <= its own. Keys are processed in tiles of `tile` tokens aligned to
absolute position 0, with an online softmax. Safety invariant: a tile that is
fully masked for a query row leaves that row's state bit-identical (its scale
is exp(0) = 1 and its contribution exactly 0), and every product, sum and
exponential is row-invariant (ops.row_bmm, ops.exp_; the softmax denominator is
a column of ones beside V, summed by the same product). So a token's output does not depend on how
the prompt was chunked or how much of it came from the prefix cache.

Decode (`decode_attention`) — one query token per sequence over ragged
contexts. All sequences' blocks are gathered into one flat list (no padding to
the longest sequence; only the last block of each sequence is partly masked),
scored with one batched matmul (ops.row_bmm: each block's product is its own batch
entry), and reduced per sequence with ordered segment sums (index_add_ in block
order), so a sequence's result is the same in any batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .ops import exp_, row_bmm

NEG_INF = float("-inf")


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_table: torch.Tensor, q_start: int, tile: int,
                      query_group: int = 0) -> torch.Tensor:
    """Causal attention of one chunk over its sequence's cache -> [C, H*D] in q's dtype.

    q: [C, H, D] (already rotated); block_table: [n] physical blocks covering
    positions [0, q_start + C) padded to a whole number of tiles (padding
    entries may name any block: their keys are masked). Computed in float32.
    """
    c, h, d = q.shape
    n_blk, bs, h_kv, _ = k_cache.shape
    g = h // h_kv
    ctx = q_start + c
    n_tiles = -(-ctx // tile)
    assert block_table.numel() * bs == n_tiles * tile, "block table not padded to tiles"
    k = k_cache.index_select(0, block_table)  # [n, bs, Hkv, D]
    v = v_cache.index_select(0, block_table)
    # Each tile its own contiguous tensor, so its memory layout never depends on ctx.
    k_tiles = k.view(n_tiles, tile, h_kv, d).permute(0, 2, 3, 1).contiguous().float()  # [T, Hkv, D, tile]
    v_tiles = with_ones_column(v.view(n_tiles, tile, h_kv, d).permute(0, 2, 1, 3))  # [T, Hkv, tile, D+1]
    # Rows ordered (token, group) so a token range is a contiguous row range.
    qh = q.float().view(c, h_kv, g, d).permute(1, 0, 2, 3).reshape(h_kv, c * g, d)
    scale = d ** -0.5
    out = torch.empty(h_kv, c * g, d)
    key_pos = torch.arange(tile)
    query_group = query_group or tile
    for a in range(0, c, query_group):
        b = min(c, a + query_group)
        rows = qh[:, a * g:b * g]
        row_pos = (q_start + torch.arange(a, b)).repeat_interleave(g)  # [R]
        m = torch.full((h_kv, rows.shape[1], 1), NEG_INF)
        # [..., :D] the weighted values, [..., D] the softmax denominator.
        acc = torch.zeros(h_kv, rows.shape[1], d + 1)
        last_tile = (q_start + b - 1) // tile
        for t in range(last_tile + 1):
            s = row_bmm(rows, k_tiles[t]).mul_(scale)  # [Hkv, R, tile]
            if (t + 1) * tile - 1 > q_start + a:  # tile reaches past the first row's position
                mask = (t * tile + key_pos)[None, :] > row_pos[:, None]  # [R, tile]
                s.masked_fill_(mask, NEG_INF)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            alpha = exp_(m - m_new)
            p = exp_(s.sub_(m_new))  # in place: s is not needed again
            acc = acc.mul_(alpha).add_(row_bmm(p, v_tiles[t]))
            m = m_new
        out[:, a * g:b * g] = acc[..., :d] / acc[..., d:]
    # [Hkv, C*g, D] -> [C, H*D]
    return out.view(h_kv, c, g, d).permute(1, 0, 2, 3).reshape(c, h * d).to(q.dtype)


def with_ones_column(v: torch.Tensor) -> torch.Tensor:
    """[..., N, D] values -> contiguous float32 [..., N, D + 1] whose last column is 1, so
    p @ v gives the weighted values and, in the last column, p's row sum (the softmax
    denominator) from the same row-invariant product."""
    out = torch.empty(*v.shape[:-1], v.shape[-1] + 1)
    out[..., :-1] = v
    out[..., -1] = 1.0
    return out


@dataclass(slots=True)
class DecodeMeta:
    """Flattened block lists of a decode batch (built once per step, shared by layers)."""

    block_ids: torch.Tensor
    """[NB] physical blocks of every sequence, sequence after sequence."""
    block_seq: torch.Tensor
    """[NB] index in the batch of the sequence each block belongs to."""
    slot_valid: torch.Tensor
    """[NB, block_size] bool: slot holds a token of the context."""
    batch: int
    """Number of sequences B."""


def build_decode_meta(block_tables: list[list[int]], context_lens: list[int],
                      block_size: int) -> DecodeMeta:
    """Block lists for sequences whose contexts (including the new token) have these lengths."""
    ids, owner, valid = [], [], []
    for i, (table, n) in enumerate(zip(block_tables, context_lens)):
        nb = -(-n // block_size)
        ids.extend(table[:nb])
        owner.extend([i] * nb)
        valid.append(n - (nb - 1) * block_size)
    block_ids = torch.tensor(ids, dtype=torch.long)
    block_seq = torch.tensor(owner, dtype=torch.long)
    slot_valid = torch.ones(len(ids), block_size, dtype=torch.bool)
    ends = torch.cumsum(torch.tensor([-(-n // block_size) for n in context_lens]), 0) - 1
    last_valid = torch.tensor(valid)
    slot_valid[ends] = torch.arange(block_size)[None, :] < last_valid[:, None]
    return DecodeMeta(block_ids, block_seq, slot_valid, len(block_tables))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     meta: DecodeMeta) -> torch.Tensor:
    """One query per sequence over its paged context -> [B, H*D] in q's dtype.  q: [B, H, D]."""
    bsz, h, d = q.shape
    _, bs, h_kv, _ = k_cache.shape
    g = h // h_kv
    nb = meta.block_ids.numel()
    k = k_cache.index_select(0, meta.block_ids).permute(0, 2, 3, 1).reshape(nb * h_kv, d, bs)
    v = with_ones_column(v_cache.index_select(0, meta.block_ids).permute(0, 2, 1, 3))  # [NB, Hkv, bs, D+1]
    qb = q.float().view(bsz, h_kv, g, d).index_select(0, meta.block_seq).reshape(nb * h_kv, g, d)
    s = row_bmm(qb, k).view(nb, h_kv, g, bs).mul_(d ** -0.5)
    s.masked_fill_(~meta.slot_valid[:, None, None, :], NEG_INF)
    idx = meta.block_seq.view(nb, 1, 1).expand(nb, h_kv, g)
    m = torch.full((bsz, h_kv, g), NEG_INF)
    m = m.scatter_reduce(0, idx, s.amax(-1), reduce="amax")  # segment max
    p = exp_(s.sub_(m.index_select(0, meta.block_seq)[..., None]))
    pv = row_bmm(p.view(nb * h_kv, g, bs), v.view(nb * h_kv, bs, d + 1)).view(nb, h_kv, g, d + 1)
    # Segment sums in block order; the last column is the softmax denominator.
    acc = torch.zeros(bsz, h_kv, g, d + 1).index_add_(0, meta.block_seq, pv)
    return (acc[..., :d] / acc[..., d:]).reshape(bsz, h * d).to(q.dtype)
