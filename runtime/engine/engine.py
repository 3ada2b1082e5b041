"""The engine: one model, one paged K/V cache, and the request operations on them.

Operations by caller:
  colocated worker:  add_request -> prefill_chunk* -> decode_step* -> free
  prefill worker:    add_request -> prefill (on_layer streams K/V out) -> kv_views -> free
  decode worker:     add_request (reserve) -> kv_views (received into) -> commit_import
                     -> decode_step* -> free
(runtime/worker/engine_contract.py: the contract these calls keep.)
Every failure path ends in `free` (or `abort`), which returns every block.
The engine is single-threaded: one caller drives it (the worker's batch loop).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import xxhash

from .abi import CacheAbi, make_abi, model_identity
from .attention import build_decode_meta
from .block_manager import BlockManager
from .checkpoint import load_checkpoint, load_tokenizer
from .config import EngineConfig, ModelConfig
from .errors import InvalidRequest
from .kv_cache import LAYOUT, KVCache, slot
from .model import LlamaModel
from .ops import kernel_family
from .prefix import hash_blocks
from .presets import DEFAULT_SEED, PRESETS, preset_config, seeded_weights
from .sampler import SamplingParams, TokenLogprobs, logprobs_of, sample
from .sequence import FinishReason, SeqState, Sequence, append_token, block_range, check_request

# on_layer(layer, token_start, token_end): layer's K/V for those tokens is in the cache.
LayerWritten = Callable[[int, int, int], None]

GATHER_RUNS = 8
"""`kv_digest`: above this many runs of consecutive physical blocks, hash a layer's K and
V from one gathered copy each (a view per run costs ~10-25 us of Python under load; a
fragmented 2,048-token table on `small` took 19 ms of slicing against 1 ms of hashing)."""


def physical_runs(table: list[int], first: int, count: int) -> list[tuple[int, int]]:
    """(first physical block, blocks) of each run of consecutive physical ids in
    table[first:first + count]."""
    runs: list[list[int]] = []
    for i in range(first, first + count):
        if runs and table[i] == runs[-1][0] + runs[-1][1]:
            runs[-1][1] += 1
        else:
            runs.append([table[i], 1])
    return [(start, n) for start, n in runs]


def generate(engine, prompt_ids: list[int], max_tokens: int, sampling: SamplingParams | None = None,
             request_id: str = "local") -> list[int]:
    """One request colocated to completion through the contract's calls, then freed (any
    engine: tests, benchmarks, calibration)."""
    seq = engine.add_request(request_id, prompt_ids, max_tokens, sampling)
    try:
        engine.prefill(seq)
        while not seq.is_finished:
            engine.decode_step([seq])
        return list(seq.output_ids)
    finally:
        engine.free(seq)


class Engine:
    """A Llama model with a paged K/V cache, prefix reuse and K/V export/import."""

    def __init__(self, model_cfg: ModelConfig, weights: dict[str, torch.Tensor],
                 cfg: EngineConfig | None = None, tokenizer=None, name: str = "custom"):
        self.cfg = cfg or EngineConfig.from_env()
        if self.cfg.torch_threads:
            torch.set_num_threads(self.cfg.torch_threads)
        self.model_cfg = model_cfg
        self.name = name
        self.tokenizer = tokenizer
        self.max_model_len = self.cfg.max_model_len or model_cfg.max_position_embeddings
        if self.max_model_len > model_cfg.max_position_embeddings:
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the model's "
                             f"{model_cfg.max_position_embeddings} positions")
        self.identity = model_identity(model_cfg, weights)
        self.model = LlamaModel(model_cfg, weights, self.cfg.torch_dtype, self.max_model_len)
        self.cache = KVCache(model_cfg.num_hidden_layers, self.cfg.num_blocks, self.cfg.block_size,
                             model_cfg.num_key_value_heads, model_cfg.head_dim,
                             self.cfg.torch_dtype)
        self.blocks = BlockManager(self.cfg.num_blocks)
        self.live: dict[int, Sequence] = {}
        """Every sequence holding blocks, by id(): who holds what (runtime/worker/holdings.py)
        even when the worker code that allocated one lost it."""
        self.abi: CacheAbi = make_abi(model_cfg, self.identity, self.cfg.dtype,
                                      self.cfg.block_size, LAYOUT, self.cfg.attn_tile_tokens,
                                      kernel_family())
        self.streams_layers = True
        """Its prefill's layers stream by default (PD_STREAM_LAYERS, measured there)."""
        self.last_logits: torch.Tensor | None = None
        """float32 logits of the latest forward ([1, V] prefill, [B, V] decode), for tests."""

    # ---- construction -------------------------------------------------
    @classmethod
    def from_preset(cls, name: str, seed: int = DEFAULT_SEED,
                    cfg: EngineConfig | None = None) -> Engine:
        """Engine over a seeded preset (`tiny`, `small`)."""
        mc = preset_config(name)
        return cls(mc, seeded_weights(mc, seed), cfg, name=f"{name}@{seed}")

    @classmethod
    def from_checkpoint(cls, path: str | Path, cfg: EngineConfig | None = None) -> Engine:
        """Engine over a Hugging Face Llama checkpoint directory."""
        mc, weights = load_checkpoint(path)
        return cls(mc, weights, cfg, tokenizer=load_tokenizer(path), name=str(path))

    @classmethod
    def from_spec(cls, spec: str, cfg: EngineConfig | None = None) -> Engine:
        """`spec` is a preset name (optionally `name@seed`) or a checkpoint directory."""
        name, _, seed = spec.partition("@")
        if name in PRESETS:
            return cls.from_preset(name, int(seed or DEFAULT_SEED), cfg)
        if Path(spec).is_dir():
            return cls.from_checkpoint(spec, cfg)
        raise ValueError(f"model {spec!r} is neither a preset {sorted(PRESETS)} nor a directory")

    # ---- text ----------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (needs a checkpoint with tokenizer.json)."""
        if self.tokenizer is None:
            raise InvalidRequest(f"model {self.name} has no tokenizer; send token ids")
        return self.tokenizer.encode(text).ids

    def decode(self, token_ids: list[int]) -> str:
        """Text of `token_ids`, or '' without a tokenizer."""
        return "" if self.tokenizer is None else self.tokenizer.decode(token_ids)

    # ---- admission ----------------------------------------------------
    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self.cfg.block_size

    def blocks_needed(self, prompt_len: int, max_tokens: int) -> int:
        """Blocks a request holds: K/V of the prompt and of every output but the last."""
        return -(-(prompt_len + max_tokens - 1) // self.block_size)

    def validate(self, prompt_ids: list[int], max_tokens: int, sampling: SamplingParams | None = None) -> None:
        """Raise InvalidRequest saying what is wrong with this prompt / budget."""
        check_request(prompt_ids, max_tokens, sampling, self.model_cfg.vocab_size, self.max_model_len)

    def add_request(self, request_id: str, prompt_ids: list[int], max_tokens: int,
                    sampling: SamplingParams | None = None, salt: bytes = b"",
                    reuse_prefix: bool = True, receive: bool = False) -> Sequence:
        """Validate and reserve blocks for prompt + max_tokens, reusing cached prefix blocks
        (`receive`: a decode worker's reservation, whose prompt K/V will be imported; this
        engine reserves the same blocks either way).

        Raises InvalidRequest or OutOfBlocks; on either, nothing is held.
        """
        prompt_ids = list(prompt_ids)
        self.validate(prompt_ids, max_tokens, sampling)
        seq = Sequence(request_id, prompt_ids, max_tokens, sampling or SamplingParams(), salt)
        # Keys for blocks of the prompt proper only: a replayed output's K/V is decode's
        # bits (SamplingParams.first_step), not what a prefill of the same tokens gives.
        seq.block_keys = hash_blocks(prompt_ids[:seq.replay_start], self.block_size, self.abi.digest, salt)
        # The last prompt token is always computed: its logits give the first output.
        max_reuse = (len(prompt_ids) - 1) // self.block_size if reuse_prefix else 0
        seq.block_table, reused = self.blocks.allocate(
            seq.block_keys, max_reuse, self.blocks_needed(len(prompt_ids), max_tokens))
        seq.num_cached_tokens = seq.num_computed_tokens = reused * self.block_size
        self.live[id(seq)] = seq
        return seq

    # ---- compute ------------------------------------------------------
    def _slots(self, seq: Sequence, start: int, end: int) -> torch.Tensor:
        return torch.tensor([slot(seq.block_table, p, self.block_size) for p in range(start, end)],
                            dtype=torch.long)

    def _tile_table(self, seq: Sequence, ctx: int) -> torch.Tensor:
        """Block table covering [0, ctx) padded to whole attention tiles (padding: block 0)."""
        per_tile = self.cfg.attn_tile_tokens // self.block_size
        n = -(-ctx // self.block_size)
        padded = -(-n // per_tile) * per_tile
        return torch.tensor(seq.block_table[:n] + [seq.block_table[0]] * (padded - n),
                            dtype=torch.long)

    def prefill_chunk(self, seq: Sequence, on_layer: LayerWritten | None = None,
                      max_chunk_tokens: int = 0) -> int | None:
        """Compute the next chunk of the prompt; returns the first output token after the last."""
        assert seq.state <= SeqState.PREFILLING, f"prefill of a {seq.state.name} sequence"
        start = seq.num_computed_tokens
        end = min(seq.num_prompt_tokens, start + (max_chunk_tokens or self.cfg.chunk_tokens))
        seq.state = SeqState.PREFILLING
        cb = None if on_layer is None else (lambda layer: on_layer(layer, start, end))
        head_end = max(start, min(end, seq.replay_start))  # replayed outputs from here on
        replay = None if head_end == end else build_decode_meta(
            [seq.block_table] * (end - head_end), [p + 1 for p in range(head_end, end)], self.block_size)
        logits = self.model.forward_prefill(
            torch.tensor(seq.prompt_ids[start:end], dtype=torch.long), start,
            self._slots(seq, start, end), self._tile_table(seq, head_end), self.cache,
            self.cfg.attn_tile_tokens, cb, replay)
        seq.num_computed_tokens = end
        self._register_full_blocks(seq, end)
        self.last_logits = logits
        if end < seq.num_prompt_tokens:
            return None
        token = sample(logits, [seq.sampling], [seq.next_step])[0]
        self._append(seq, token, logprobs_of(logits, [token], [seq.sampling])[0])
        return token

    def prefill(self, seq: Sequence, on_layer: LayerWritten | None = None) -> int:
        """Compute the whole remaining prompt (in chunks); returns the first output token."""
        while True:
            token = self.prefill_chunk(seq, on_layer)
            if token is not None:
                return token

    def _register_full_blocks(self, seq: Sequence, computed: int) -> None:
        for j in range(seq.num_cached_tokens // self.block_size,
                       min(computed // self.block_size, len(seq.block_keys))):
            self.blocks.register(seq.block_table[j], seq.block_keys[j])

    def decode_step(self, seqs: list[Sequence]) -> list[int]:
        """One token for each sequence (all in DECODING); returns the new tokens."""
        assert seqs and all(s.state == SeqState.DECODING for s in seqs)
        bs = self.block_size
        positions = [s.num_tokens - 1 for s in seqs]  # the newest token gets its K/V now
        slots = [slot(s.block_table, p, bs) for s, p in zip(seqs, positions)]
        meta = build_decode_meta([s.block_table for s in seqs], [p + 1 for p in positions], bs)
        logits = self.model.forward_decode(
            torch.tensor([s.output_ids[-1] for s in seqs], dtype=torch.long),
            torch.tensor(positions, dtype=torch.long), torch.tensor(slots, dtype=torch.long),
            meta, self.cache)
        self.last_logits = logits
        params = [s.sampling for s in seqs]
        tokens = sample(logits, params, [s.next_step for s in seqs])
        for s, t, lp in zip(seqs, tokens, logprobs_of(logits, tokens, params)):
            s.num_computed_tokens += 1
            self._append(s, t, lp)
        return tokens

    def _append(self, seq: Sequence, token: int, logprobs: TokenLogprobs | None = None) -> None:
        append_token(seq, token, self.model_cfg.eos_ids, self.max_model_len, logprobs)

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        seq.state = SeqState.FINISHED
        seq.finish_reason = reason

    def free(self, seq: Sequence) -> None:
        """Return the sequence's blocks (idempotent). Full prompt blocks stay as prefix cache."""
        if seq.block_table:
            self.blocks.free(seq.block_table)
            seq.block_table = []
        self.live.pop(id(seq), None)
        if not seq.is_finished:
            self._finish(seq, FinishReason.ABORTED)

    def generate(self, prompt_ids: list[int], max_tokens: int,
                 sampling: SamplingParams | None = None, request_id: str = "local") -> list[int]:
        """Convenience: prefill + decode one request to completion, then free it."""
        return generate(self, prompt_ids, max_tokens, sampling, request_id)

    # ---- K/V export / import (see kv_io.py) ----------------------------
    def block_range(self, seq: Sequence, first: int, count: int | None) -> int:
        """`count` checked (None: the prompt's blocks from `first`): sequence.block_range."""
        return block_range(seq, self.block_size, first, count)

    def kv_views(self, seq: Sequence, layer: int, first: int = 0,
                 count: int | None = None) -> list[tuple[memoryview, memoryview]]:
        """(K bytes, V bytes) per physical run of `layer`'s logical blocks [first, first + count),
        views of the cache memory (slices of one view of it, far cheaper than a tensor view
        per run); runtime/worker/engine_contract.py."""
        count = self.block_range(seq, first, count)
        return [self.cache.byte_views(layer, start, n) for start, n in physical_runs(seq.block_table, first, count)]

    def prefix_keys(self, seq: Sequence, first: int, last: int) -> list[tuple[int, bytes | None]]:
        """(block, its prefix-cache key) of `seq`'s logical blocks [first, last): what a hand-off
        registered, for `forget_prefix` if its K/V turns out wrong."""
        return [(b, self.blocks.blocks[b].key) for b in seq.block_table[first:last]]

    def forget_prefix(self, keyed: list[tuple[int, bytes | None]]) -> None:
        """Take those blocks out of the prefix cache, where they still hold those keys."""
        self.blocks.unregister([b for b, key in keyed if key is not None and self.blocks.blocks[b].key == key])

    def commit_import(self, seq: Sequence, first_token: int) -> None:
        """Mark the prompt's K/V as present (imported) and continue from `first_token`.

        Safety invariant: call only after every transferred block was validated;
        from here on the prompt blocks are readable by decode and by prefix reuse.
        """
        assert seq.state == SeqState.WAITING, f"commit of a {seq.state.name} sequence"
        if not 0 <= first_token < self.model_cfg.vocab_size:
            raise InvalidRequest(f"first token {first_token} is outside the vocabulary")
        seq.num_computed_tokens = seq.num_prompt_tokens
        self._register_full_blocks(seq, seq.num_prompt_tokens)
        self._append(seq, first_token)

    def kv_digest(self, seq: Sequence, num_tokens: int | None = None) -> str:
        """xxh3-128 of the K then V bytes of token slots [0, num_tokens), layer by layer.

        Hashes views of runs of consecutive physical blocks in place, or, past GATHER_RUNS
        runs (a fragmented block table), one gathered copy per K and V of a layer: the
        same bytes in the same order. `LayerDigest` (runtime/engine/digest.py) computes
        the same value layer by layer.
        """
        state = self.kv_digest_start(seq, num_tokens)
        for layer in range(self.model_cfg.num_hidden_layers):
            self.kv_digest_layer(state, layer)
        return state[0].hexdigest()

    def kv_digest_start(self, seq: Sequence, num_tokens: int | None = None) -> tuple:
        """(hasher, runs of physical blocks, gather index or None, tokens) for
        `kv_digest_layer`, fed every layer in order."""
        n = seq.num_prompt_tokens if num_tokens is None else num_tokens
        nb = -(-n // self.block_size)
        table = seq.block_table[:nb]
        runs = []  # (first physical block, blocks, tokens in the run)
        i = 0
        while i < nb:
            j = i + 1
            while j < nb and table[j] == table[j - 1] + 1:
                j += 1
            runs.append((table[i], j - i, min(n, j * self.block_size) - i * self.block_size))
            i = j
        index = torch.tensor(table, dtype=torch.long) if len(runs) > GATHER_RUNS else None
        return xxhash.xxh3_128(), runs, index, n

    def kv_digest_layer(self, state: tuple, layer: int) -> None:
        """Hash `layer`'s K then V rows into `state` (from `kv_digest_start`)."""
        h, runs, index, n = state
        for part in (self.cache.k[layer], self.cache.v[layer]):
            if index is not None:
                h.update(part.index_select(0, index).flatten(0, 1)[:n].view(torch.uint8).numpy().data)
                continue
            for first, count, tokens in runs:
                rows = part[first:first + count].flatten(0, 1)[:tokens]
                h.update(rows.view(torch.uint8).numpy().data)

    # ---- the contract's figures (runtime/worker/engine_contract.py) -----
    @property
    def num_layers(self) -> int:
        """Decoder layers (each with its own K and V)."""
        return self.model_cfg.num_hidden_layers

    @property
    def vocab_size(self) -> int:
        """Token ids are in [0, vocab_size)."""
        return self.model_cfg.vocab_size

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        return self.blocks.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks held only by the prefix cache (evictable)."""
        return self.blocks.num_cached

    @property
    def block_bytes_per_layer(self) -> int:
        """Bytes of one block of one layer, K and V."""
        return self.cache.block_bytes_per_layer

    @property
    def chunk_tokens(self) -> int:
        """Most prompt tokens one prefill chunk computes."""
        return self.cfg.chunk_tokens

    def held_blocks(self) -> list[int]:
        """Blocks some sequence holds (`pdctl blocks`: held by no live sequence = leaked)."""
        return [b.block_id for b in self.blocks.blocks if b.ref_count > 0]

    def pool_counts(self) -> tuple[int, int, int]:
        """(blocks, free and uncached, held by the prefix cache only)."""
        return self.blocks.num_blocks, len(self.blocks.free_ids), self.blocks.num_cached

    @property
    def num_free_blocks(self) -> int:
        """Blocks allocatable now (free + evictable prefix cache)."""
        return self.blocks.num_free
