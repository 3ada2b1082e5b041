"""Start-up self-check: do this process's kernels give a row the same bits whatever
surrounds it, on this model's real shapes?

Exactness across the hand-off rests on row invariance (ops.py). The exact kernels
have it by construction, but a worker may run torch's kernels (no compiler, or
PD_ENGINE_KERNEL=torch), a CPU may surprise, a build may be broken. So each
worker checks before it registers (0.12-0.17 s on `small` here: seven forward passes
and four lm_head passes, each bound by reading the weights from memory):

1. rows: every projection of layer 0 and lm_head, RMSNorm and SwiGLU, on a batch
   of 13 rows, against the same rows computed alone and in sub-batches;
2. prefill: a 7-token prompt computed in one piece and in chunks of 1, 2 and 4
   tokens (into two scratch caches, not the engine's pool) gives the same K/V bytes
   and the same last-token output;
3. decode: one step of two sequences batched gives the first one's output bit for
   bit as a step of it alone.
(Steps 2 and 3 stop before the final norm and lm_head: step 1 checked both, and lm_head
is the largest weight.)

A worker whose check fails logs why and registers colocated-only
(`mark_colocated_only`): its cache ABI names its own numerics, so no other worker
shares its digest — the router never pairs it, a decode worker refuses its K/V at
reserve — and `pdctl status` shows the reason. It still serves colocated requests.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from .attention import build_decode_meta
from .engine import Engine
from .kv_cache import KVCache, slot
from .ops import Linear, rms_norm, silu_mul

ROWS = 13
"""Rows of the batch a row is compared against (not a multiple of any kernel's block)."""
ROW_SLICES = ((0, 1), (3, 8), (12, 13))
PROMPT_TOKENS = 7
CHUNKS = ((0, 1), (1, 3), (3, 7))
OTHER_PROMPT_TOKENS = 3


@dataclass(frozen=True, slots=True)
class SelfCheck:
    """The verdict of `run`."""

    passed: bool
    reason: str
    """What differed ('' when passed)."""
    elapsed_ms: float


def _rows_differ(name: str, fn, x: torch.Tensor) -> str:
    """'' when fn gives each row of x the same bits alone or in sub-batches as in x."""
    whole = fn(x)
    for a, b in ROW_SLICES:
        if not torch.equal(fn(x[a:b]), whole[a:b]):
            return f"{name}: rows {a}..{b - 1} computed apart differ from the same rows among {len(x)}"
    return ""


def _check_rows(engine: Engine, gen: torch.Generator) -> str:
    model, cfg = engine.model, engine.model_cfg
    layer = model.layers[0]
    dtype = model.dtype

    def rows(width: int) -> torch.Tensor:
        return torch.randn(ROWS, width, generator=gen).to(dtype)

    checks = [(f"layer 0 {name} projection", layer[name], rows(layer[name].in_features))
              for name in ("qkv", "o", "gate_up", "down")]
    checks += [("lm_head", model.lm_head, rows(model.lm_head.in_features)),
               ("RMSNorm", lambda x: rms_norm(x, layer["ln1"], cfg.rms_norm_eps), rows(cfg.hidden_size)),
               ("SwiGLU", silu_mul, rows(2 * cfg.intermediate_size))]
    for name, fn, x in checks:
        if why := _rows_differ(name, fn, x):
            return why
    return ""


def _scratch(engine: Engine, blocks: int) -> KVCache:
    cfg, mc = engine.cfg, engine.model_cfg
    return KVCache(mc.num_hidden_layers, blocks, cfg.block_size, mc.num_key_value_heads, mc.head_dim,
                   cfg.torch_dtype)


def _check_prefill_and_decode(engine: Engine, gen: torch.Generator) -> str:
    model, bs, tile = engine.model, engine.block_size, engine.cfg.attn_tile_tokens
    per_seq = -(-max(PROMPT_TOKENS, OTHER_PROMPT_TOKENS) // tile) * tile // bs  # blocks, whole tiles
    tables = [list(range(per_seq)), list(range(per_seq, 2 * per_seq))]
    vocab = engine.model_cfg.vocab_size
    prompt = torch.randint(vocab, (PROMPT_TOKENS,), generator=gen)
    other = torch.randint(vocab, (OTHER_PROMPT_TOKENS,), generator=gen)
    one, chunked = _scratch(engine, 2 * per_seq), _scratch(engine, 2 * per_seq)

    def prefill(cache: KVCache, table: list[int], tokens: torch.Tensor, start: int, end: int):
        slots = torch.tensor([slot(table, p, bs) for p in range(start, end)])
        tiled = torch.tensor(table[:-(-end // tile) * tile // bs])  # [0, end) in whole tiles
        return model.prefill_hidden(tokens[start:end], start, slots, tiled, cache, tile)[-1:]

    whole = prefill(one, tables[0], prompt, 0, PROMPT_TOKENS)
    for a, b in CHUNKS:
        last = prefill(chunked, tables[0], prompt, a, b)
    if not torch.equal(one.kv, chunked.kv):
        return f"prefill: K/V of a {PROMPT_TOKENS}-token prompt in chunks {CHUNKS} differ from one piece"
    if not torch.equal(last, whole):
        return "prefill: the last token's output differs between chunked and one-piece prefill"

    prefill(one, tables[1], other, 0, OTHER_PROMPT_TOKENS)

    def step(cache: KVCache, seqs: list[tuple[list[int], int]]) -> torch.Tensor:
        positions = [n for _, n in seqs]
        meta = build_decode_meta([t for t, _ in seqs], [n + 1 for n in positions], bs)
        slots = torch.tensor([slot(t, n, bs) for t, n in seqs])
        tokens = torch.tensor([7] * len(seqs))
        return model.decode_hidden(tokens, torch.tensor(positions), slots, meta, cache)

    batched = step(one, [(tables[0], PROMPT_TOKENS), (tables[1], OTHER_PROMPT_TOKENS)])
    alone = step(chunked, [(tables[0], PROMPT_TOKENS)])
    if not torch.equal(batched[:1], alone):
        return "decode: a sequence's output batched with another differs from the same step alone"
    return ""


def run(engine: Engine, seed: int = 0) -> SelfCheck:
    """Check the engine's kernels on its model's shapes; never touches its block pool."""
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        reason = _check_rows(engine, gen) or _check_prefill_and_decode(engine, gen)
    return SelfCheck(not reason, reason, (time.perf_counter() - t0) * 1000)


def mark_colocated_only(engine: Engine, worker_id: str) -> None:
    """Give the engine's cache ABI numerics of its own (a failed self-check): its digest
    then equals no other worker's, so it never exchanges K/V."""
    kernels = f"{engine.abi.kernels}+unverified@{worker_id}"
    engine.abi = dataclasses.replace(engine.abi, kernels=kernels)


class _RowCountDependent:
    """A Linear whose rows change bits in calls of fewer than 4 rows (fault injection)."""

    def __init__(self, inner: Linear):
        self.inner = inner
        self.in_features = inner.in_features

    def __call__(self, x: torch.Tensor, isa: int | None = None) -> torch.Tensor:
        y = self.inner(x, isa)
        return torch.nextafter(y, torch.full_like(y, float("inf"))) if x.shape[0] < 4 else y


def make_rows_depend_on_count(engine: Engine) -> None:
    """Fault injection (tests): lm_head gives a row different bits when it is computed
    in a call of fewer than 4 rows, as a BLAS that picks kernels by row count may."""
    engine.model.lm_head = _RowCountDependent(engine.model.lm_head)
