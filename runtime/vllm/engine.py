"""`VllmEngine`: vLLM's engine core behind the hand-off's engine contract
(runtime/worker/engine_contract.py; docs/design.md, The engine: vLLM behind the contract).

vLLM's scheduler decides what runs in each step (continuous batching, chunked prefill,
its prefix cache); the worker's engine loop pulls results from it. A contract call steps
the core until the sequences it asks about have what it wants, and every token a step
gives is kept for the sequence it belongs to, whichever call stepped:

    add_request     validated and priced here; a decode reservation (receive=True) is
                    handed to vLLM now and stepped once, so that its scheduler allocates
                    the blocks the Reserve grants (the connector's update_state_after_alloc);
                    any other request goes to vLLM at its first prefill_chunk, with its
                    on_layer listener in place before a layer of it can be computed
    prefill_chunk   steps until this sequence computed more of its prompt, or sampled
                    (a token's log-probabilities, when asked, are vLLM's `raw_logprobs`:
                    its EngineCore outputs' new_logprobs, `vllm_logprobs`)
    decode_step     steps until each sequence has its next token
    commit_import   token 0 (the prefill's) becomes the request's first output and the
                    connector reports the K/V received: vLLM schedules it from there,
                    computing token 0's K/V and sampling token 1
    free            abort if running; the blocks vLLM kept for pdserve (the connector's
                    request_finished) go back now, not at a later step

Blocks: pdserve admits a request only when blocks_needed(prompt, max_tokens) fit beside
every live sequence's, so vLLM never preempts a sequence whose blocks a transfer reads.

Numerics: the ABI names vLLM and its version, the attention backend, the layout of its
cache and whether vLLM's batch-invariant mode is on; only then is a hand-off between two
vLLM workers bit-equal to colocated. Without it the directory still verifies the bytes
(the digests of both ends), and equality with colocated is measured, not promised.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import xxhash

from runtime.engine.abi import CacheAbi
from runtime.engine.engine import generate
from runtime.engine.errors import InvalidRequest, OutOfBlocks
from runtime.engine.sampler import SamplingParams, TokenLogprobs
from runtime.engine.sequence import FinishReason, SeqState, Sequence, append_token, block_range, check_request

from .connector import RECEIVE, PdserveConnector, PdserveMeta
from .kv_memory import KvMemory, SharedStaging, layer_index

log = logging.getLogger(__name__)

MAX_IDLE_STEPS = 64
"""Steps a call may take without the sequences it waits for moving: past this, vLLM lost
them (an internal error), and the call says so instead of spinning."""


@dataclass(frozen=True)
class VllmOptions:
    """How a worker runs vLLM (runtime/worker/config.py has their variables)."""

    block_size: int = 128
    num_blocks: int = 64
    max_model_len: int = 0
    """0: the model's positions, at most 4,096."""
    chunk_tokens: int = 512
    """vLLM's max_num_batched_tokens (its prefill chunk), at least a block."""
    max_batch: int = 32
    dtype: str = "float32"
    staging: str = "auto"
    """The K/V's way to the transport (kv_memory.py): auto, on (always staged) or off."""
    extra: dict = field(default_factory=dict)
    """More vLLM engine arguments (EngineArgs)."""


def engine_args(root: Path, o: VllmOptions, max_model_len: int, kv_bytes: int):
    """vLLM's engine arguments: pdserve's cache size, block, dtype, batch and chunk, and its
    KV connector in both roles; the options' own (`extra`) beside them. Tensor-parallel on
    CPU: each rank bound to its share of this process's CPUs (VLLM_CPU_OMP_THREADS_BIND,
    unless set)."""
    import os

    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs

    tp = int(o.extra.get("tensor_parallel_size", 1))
    cpus = sorted(os.sched_getaffinity(0))
    if tp > 1 and len(cpus) >= tp and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        share = len(cpus) // tp
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(
            ",".join(map(str, cpus[r * share:(r + 1) * share])) for r in range(tp))
    return EngineArgs(
        model=str(root), skip_tokenizer_init=True, enforce_eager=True, dtype=o.dtype, seed=0,
        block_size=o.block_size, max_model_len=max_model_len, enable_prefix_caching=True,
        kv_cache_memory_bytes=kv_bytes, max_num_batched_tokens=max(o.chunk_tokens, o.block_size),
        max_num_seqs=o.max_batch,
        kv_transfer_config=KVTransferConfig(
            kv_connector="PdserveConnector", kv_connector_module_path="runtime.vllm.connector", kv_role="kv_both"),
        **o.extra)


def vllm_logprobs(lists, n: int, k: int | None) -> list[TokenLogprobs | None]:
    """A step's n new tokens' log-probabilities from vLLM's LogprobsLists (a row per token:
    the sampled token's, then vLLM's top max_num_logprobs, by torch.topk), the request's k
    kept and ordered by value, then id (pdserve's order; which of tied tokens at the k-th
    place vLLM kept is its topk's); None each when not asked.

    vLLM computes them as pdserve's engine does (logprobs_mode `raw_logprobs`: the log-softmax
    of the raw logits, float32), with its own kernels: equal across a hand-off only where
    vLLM is batch-invariant, as its tokens are."""
    if lists is None or k is None:
        return [None] * n
    rows = []
    for ids, values in zip(lists.logprob_token_ids[:n], lists.logprobs[:n]):
        top = sorted(zip(ids[1:k + 1].tolist(), values[1:k + 1].tolist()), key=lambda t: (-t[1], t[0]))
        rows.append(TokenLogprobs(float(values[0]), tuple(top)))
    return rows


def model_identity(model_dir: Path) -> str:
    """xxh3-128 of config.json and every safetensors file, streamed (what the K/V depends
    on; a directory vLLM reads, whatever its architecture)."""
    h = xxhash.xxh3_128((model_dir / "config.json").read_bytes())
    for f in sorted(model_dir.glob("*.safetensors")):
        h.update(f.name.encode())
        with f.open("rb") as fh:
            while chunk := fh.read(16 << 20):
                h.update(chunk)
    return h.hexdigest()


class VllmEngine:
    """vLLM's engine core in this process, driven through the hand-off's contract."""

    def __init__(self, model: str, options: VllmOptions | None = None):
        from vllm import envs
        from vllm.v1.engine.core import EngineCore
        from vllm.v1.executor.multiproc_executor import MultiprocExecutor
        from vllm.v1.executor.uniproc_executor import UniProcExecutor

        o = options or VllmOptions()
        block_size, num_blocks, max_model_len, dtype = o.block_size, o.num_blocks, o.max_model_len, o.dtype
        chunk_tokens, staging, extra = o.chunk_tokens, o.staging, o.extra
        self.tp = int(extra.get("tensor_parallel_size", 1))
        """Tensor-parallel ranks: above 1 the K/V lives in vLLM's rank processes (SharedStaging)."""
        root = Path(model)
        if not (root / "config.json").is_file():
            raise ValueError(f"vLLM engine: {model!r} is not a checkpoint directory (no config.json)")
        hf = json.loads((root / "config.json").read_text())
        layers, heads = hf["num_hidden_layers"], hf.get("num_key_value_heads", hf["num_attention_heads"])
        head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
        itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        self.block_bytes_per_layer = 2 * heads * block_size * head_dim * itemsize
        max_model_len = max_model_len or min(hf.get("max_position_embeddings", 4096), 4096)
        args = engine_args(root, o, max_model_len, num_blocks * layers * self.block_bytes_per_layer // self.tp)
        started = time.perf_counter()
        self.core = EngineCore(args.create_engine_config(), MultiprocExecutor if self.tp > 1 else UniProcExecutor,
                               log_stats=False)
        self.sched = self.core.scheduler
        self.sched_conn: PdserveConnector = self.sched.connector
        self.sched_conn.bind(self)
        self._memory(layers, heads, head_dim, block_size, dtype, staging)
        self.num_layers, self.vocab_size = layers, hf["vocab_size"]
        self.eos_ids = frozenset(hf["eos_token_id"] if isinstance(hf.get("eos_token_id"), list)
                                 else [hf.get("eos_token_id", -1)])
        self.max_model_len, self.chunk_tokens, self._block_size = max_model_len, chunk_tokens, block_size
        self.num_blocks = self.sched.kv_cache_manager.block_pool.get_num_free_blocks()
        self.name = str(root)
        self.abi = self._abi(root, hf, heads, head_dim, dtype, bool(envs.VLLM_BATCH_INVARIANT))
        self.live: dict[int, Sequence] = {}
        self._seqs: dict[str, Sequence] = {}          # vLLM request id -> sequence
        self._vid: dict[int, str] = {}                # id(sequence) -> vLLM request id
        self._tokens: dict[str, collections.deque] = {}  # vLLM request id -> (token, TokenLogprobs | None)
        self._listeners: dict[str, object] = {}       # vLLM request id -> on_layer
        self._priced: dict[int, int] = {}             # id(sequence) -> blocks it may take
        self._receiving: set[int] = set()             # id(sequence) of reservations
        self._committed: set[str] = set()             # received, seeded, not yet scheduled
        self._stage_out: dict[str, tuple[int, int]] = {}  # tp: logical blocks the ranks copy out next
        self._stage_in: dict[str, tuple[int, int]] = {}   # tp: logical blocks the ranks copy in next
        self._written: dict[str, tuple[int, int]] = {}    # tp: what the step in flight computes
        self._copied: dict[str, int] = {}                 # tp: full prompt blocks the ranks copied out
        self._ids = itertools.count()
        log.info("%s engine core over %s: %d blocks of %d tokens, started in %.1f s (%s)",
                 self.abi.engine, root, self.num_blocks, block_size, time.perf_counter() - started,
                 self.abi.kernels)

    def _memory(self, layers: int, heads: int, head_dim: int, block_size: int, dtype: str, staging: str) -> None:
        """How the transport reaches the K/V (kv_memory.py): this process's cache, in place or
        staged, or (tensor-parallel) shared buffers the ranks fill and drain."""
        from vllm.distributed.kv_transfer import get_kv_transfer_group
        from vllm.platforms import current_platform

        self._cpu = current_platform.is_cpu()
        if self.tp > 1:
            self.worker_conn = None
            shard = (heads // self.tp, block_size, 2 * head_dim) if self._cpu else \
                (2, block_size, heads // self.tp, head_dim)
            self.kv = SharedStaging(layers, self.tp, shard, getattr(torch, dtype), planes=not self._cpu)
            self.streams_layers = False  # the ranks' copies are known per step, not per layer
        else:
            self.worker_conn = get_kv_transfer_group()
            self.worker_conn.bind(self)
            self.kv = KvMemory(self.worker_conn.kv_caches, layers, block_size, staging)
            # Streaming sends share a CPU cache's cores with the compute; a GPU's copies do not.
            self.streams_layers = self.kv.staged
        self.block_bytes_per_layer = self.kv.block_bytes

    def _abi(self, root: Path, hf: dict, heads: int, head_dim: int, dtype: str, batch_invariant: bool) -> CacheAbi:
        """What this vLLM's K/V bytes are: layout, model, and numerics (vLLM's version, its
        attention backend, torch's build and CPU capability, batch invariance)."""
        import vllm

        if self.worker_conn is not None:
            backend = self.core.model_executor.driver_worker.worker.model_runner.attn_groups[0][0].backend.get_name()
        else:  # the ranks' runners are in their own processes: named by their platform and count
            backend = f"{'CPU_ATTN' if self._cpu else 'GPU'}:tp{self.tp}"
        return CacheAbi(
            num_layers=self.num_layers, num_kv_heads=heads, head_dim=head_dim, dtype=dtype,
            block_size=self._block_size, layout=self.kv.layout, rope_theta=float(hf.get("rope_theta", 0.0)),
            rope_scaling=json.dumps(hf.get("rope_scaling"), sort_keys=True),
            model_identity=model_identity(root), attn_tile_tokens=0,
            kernels=f"{backend}:torch-{torch.__version__}:{torch.backends.cpu.get_cpu_capability()}",
            engine=f"vllm/{vllm.__version__}", batch_invariant=batch_invariant)

    # ---- the contract's figures ----------------------------------------------------
    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def num_free_blocks(self) -> int:
        """Blocks a new request may take: what vLLM has free, less what admitted sequences
        may still take (priced at admission, so vLLM never preempts one)."""
        taken = sum(self._priced.values())
        return max(0, min(self.sched.kv_cache_manager.block_pool.get_num_free_blocks(), self.num_blocks - taken))

    @property
    def num_cached_blocks(self) -> int:
        return self.pool_counts()[2]

    def blocks_needed(self, prompt_len: int, max_tokens: int) -> int:
        return -(-(prompt_len + max_tokens) // self._block_size)

    def held_blocks(self) -> list[int]:
        """Blocks some request holds in vLLM's pool (its null block aside)."""
        pool = self.sched.kv_cache_manager.block_pool
        return [b.block_id for b in pool.blocks if b.ref_cnt > 0 and not b.is_null]

    def pool_counts(self) -> tuple[int, int, int]:
        """(blocks, free and uncached, held by the prefix cache only)."""
        pool = self.sched.kv_cache_manager.block_pool
        free = pool.get_num_free_blocks()
        cached = sum(1 for b in pool.blocks if b.ref_cnt == 0 and b.block_hash is not None and not b.is_null)
        return self.num_blocks, free - cached, cached

    # ---- admission -------------------------------------------------------------------
    def validate(self, prompt_ids: list[int], max_tokens: int, sampling: SamplingParams | None) -> None:
        """Every engine's checks (sequence.check_request), after the refusals of vLLM's own."""
        n = len(prompt_ids)
        if sampling is not None and sampling.first_step:
            raise InvalidRequest("the vLLM engine does not replay outputs (first_step): it is not batch-invariant")
        if sampling is not None and sampling.seed and self.tp > 1:
            raise InvalidRequest("a seeded request on a tensor-parallel vLLM worker: its sampler runs in the "
                                 "rank processes, whose draw of token 0 pdserve cannot replay; send no seed")
        if sampling is not None and sampling.seed and self._cpu and n > self.chunk_tokens:
            # vLLM-CPU rewinds a seeded sampler after a chunk's discarded sample, which its CPU
            # generator cannot do (the engine step fails): refused before it reaches vLLM.
            raise InvalidRequest(f"a seeded request's prompt of {n} tokens is prefilled in chunks of "
                                 f"{self.chunk_tokens}, which vLLM-CPU cannot sample with a seed; send at most "
                                 f"{self.chunk_tokens} tokens, or no seed")
        check_request(prompt_ids, max_tokens, sampling, self.vocab_size, self.max_model_len)

    def add_request(self, request_id: str, prompt_ids: list[int], max_tokens: int,
                    sampling: SamplingParams | None = None, salt: bytes = b"",
                    reuse_prefix: bool = True, receive: bool = False) -> Sequence:
        """Validate and price the request; a reservation (`receive`) gets its blocks from
        vLLM now (OutOfBlocks when vLLM cannot place them, holding nothing then)."""
        prompt_ids = list(prompt_ids)
        self.validate(prompt_ids, max_tokens, sampling)
        need = self.blocks_needed(len(prompt_ids), max_tokens)
        if need > self.num_free_blocks:
            raise OutOfBlocks(need, self.num_free_blocks, self.num_blocks)
        seq = Sequence(request_id, prompt_ids, max_tokens, sampling or SamplingParams(), salt)
        vid = f"{request_id}#{next(self._ids)}"
        self._vid[id(seq)], self._seqs[vid], self._priced[id(seq)] = vid, seq, need
        self._tokens[vid] = collections.deque()
        self.live[id(seq)] = seq
        if receive:
            self._receiving.add(id(seq))
            self._submit(seq, reuse_prefix, {"pdserve": RECEIVE})
            self._step()
            if not seq.block_table:  # vLLM's scheduler could not place it now
                self.free(seq)
                raise OutOfBlocks(need, self.num_free_blocks, self.num_blocks)
            if self.kv.staged and self.tp == 1:  # the prefix hit's blocks, for the digest
                self.kv.stage_out(id(seq), seq.block_table, 0, seq.num_cached_tokens // self._block_size)
        return seq

    def _prompt_blocks(self, seq: Sequence) -> int:
        return -(-seq.num_prompt_tokens // self._block_size)

    def _submit(self, seq: Sequence, reuse_prefix: bool = True, transfer: dict | None = None) -> None:
        from vllm import SamplingParams as VSampling
        from vllm.v1.engine import EngineCoreRequest

        s = seq.sampling
        extra = {"kv_transfer_params": transfer} if transfer else None
        params = VSampling(max_tokens=seq.max_tokens, temperature=s.temperature, top_k=s.top_k or 0,
                           top_p=s.top_p, seed=s.seed or None, stop_token_ids=list(s.stop_token_ids),
                           ignore_eos=s.ignore_eos, logprobs=s.logprobs, extra_args=extra,
                           skip_reading_prefix_cache=not reuse_prefix or None)
        req = EngineCoreRequest(
            request_id=self._vid[id(seq)], prompt_token_ids=list(seq.prompt_ids), mm_features=None,
            sampling_params=params, pooling_params=None, arrival_time=time.time(), lora_request=None,
            cache_salt=seq.salt.hex() or None, data_parallel_rank=None)
        request, wave = self.core.preprocess_add_request(req)
        self.core.add_request(request, wave)

    # ---- connector callbacks (engine thread) -----------------------------------------
    def on_allocated(self, vid: str, cached_tokens: int) -> None:
        """A reservation's blocks: vLLM's allocation (its local prefix hit first)."""
        seq = self._seqs.get(vid)
        if seq is not None:
            seq.num_cached_tokens = seq.num_computed_tokens = cached_tokens
            seq.block_table = self._table(vid)
            self.kv.open(id(seq), self._prompt_blocks(seq))
            if self.tp > 1 and cached_tokens:  # the ranks copy the prefix hit out in this very step
                self._stage_out[vid] = (0, cached_tokens // self._block_size)

    def connector_meta(self, out) -> PdserveMeta:
        """This step's instructions to the worker side of the connector."""
        meta = PdserveMeta(writes=self.step_writes(out), advance=self.step_advances(out))
        if self.tp > 1:
            for vid, (_, end) in self._written.items():  # the prompt blocks this step writes, and
                # those before them not copied out yet (a prefix hit's, at the first step)
                first, last = self._copied.get(vid, 0), -(-end // self._block_size)
                self._copied[vid] = end // self._block_size
                lo, hi = self._stage_out.get(vid, (first, last))
                self._stage_out[vid] = (min(lo, first), max(hi, last))
            meta.stage_out, self._stage_out = self._shared(self._stage_out), {}
            meta.stage_in, self._stage_in = self._shared(self._stage_in), {}
        return meta

    def _shared(self, spans: dict[str, tuple[int, int]]) -> dict[str, tuple[str, int, int, list[int]]]:
        """(buffer, its blocks, first logical block, physical blocks) of each span to copy."""
        got = {}
        for vid, (first, last) in spans.items():
            seq = self._seqs.get(vid)
            if seq is not None and last > first:  # the table as this step's allocation left it
                seq.block_table = table = self._table(vid)
                got[vid] = (self.kv.name(id(seq)), self._prompt_blocks(seq), first, table[first:last])
        return got

    def step_writes(self, out) -> dict[str, tuple[int, int]]:
        """Which prompt tokens each listened-to request computes in this step."""
        writes, self._written = {}, {}
        for vid, n in out.num_scheduled_tokens.items():
            req, seq = self.sched.requests.get(vid), self._seqs.get(vid)
            if req is None or seq is None or id(seq) in self._receiving or \
                    (start := req.num_computed_tokens) >= req.num_prompt_tokens:
                continue
            self._written[vid] = span = (start, min(start + n, req.num_prompt_tokens))  # tp: the ranks copy these
            if vid in self._listeners:
                writes[vid] = span
                if self.tp == 1:  # the table the views read, before anyone hears of these tokens
                    seq.block_table = self._table(vid)
        return writes

    def step_advances(self, out) -> list[str]:
        """Committed seeded requests this step schedules for the first time."""
        first = [r.req_id for r in out.scheduled_new_reqs if r.req_id in self._committed]
        self._committed.difference_update(first)
        return first

    def advance_samplers(self, vids: list[str]) -> None:
        """Each request's generator draws what vLLM-CPU's sampler draws for one token (one
        seed per step: topk_topp_sampler.forward_cpu), the prefill's token 0, so token 1
        comes from the draw it does colocated. Other devices draw otherwise: not done there
        (a seeded request's tokens after a hand-off then differ from colocated)."""
        runner = self.core.model_executor.driver_worker.worker.model_runner
        if runner.device.type != "cpu":
            return
        for vid in vids:
            state = runner.requests.get(vid)
            if state is not None and state.generator is not None:
                torch.randint(0, 2**31, (1,), generator=state.generator, dtype=torch.long)

    def layer_written(self, layer_name: str, writes: dict[str, tuple[int, int]]) -> None:
        """An attention layer wrote this step's K/V: each listener hears it."""
        layer = layer_index(layer_name)
        if layer is None:
            return
        for vid, (start, end) in writes.items():
            listener = self._listeners.get(vid)
            if listener is not None:
                listener(layer, start, end)

    def _table(self, vid: str) -> list[int]:
        """The request's blocks as vLLM's allocation stands now (a new list: the transport reads
        a sequence's table from another thread, so a table is replaced, never changed)."""
        return list(self.sched.kv_cache_manager.get_block_ids(vid)[0])

    def holds(self, vid: str) -> bool:
        """Whether a finished vLLM request's blocks wait for pdserve's `free`."""
        return vid in self._seqs

    # ---- compute -----------------------------------------------------------------------
    def _step(self) -> None:
        outputs, _ = self.core.step()
        if self.tp > 1:  # the ranks copied this step's prompt blocks out: every layer is there
            for vid, (start, end) in self._written.items():
                if (listener := self._listeners.get(vid)) is not None:
                    for layer in range(self.num_layers):
                        listener(layer, start, end)
            self._written = {}
        for batch in outputs.values():
            for out in batch.outputs:
                if out.request_id in self._tokens:
                    asked = self._seqs[out.request_id].sampling.logprobs
                    self._tokens[out.request_id].extend(zip(
                        out.new_token_ids, vllm_logprobs(out.new_logprobs, len(out.new_token_ids), asked)))
        blocks_of = self.sched.kv_cache_manager.get_block_ids
        for vid, seq in self._seqs.items():
            if (req := self.sched.requests.get(vid)) is None:
                continue
            if len(blocks_of(vid)[0]) != len(seq.block_table):  # copied only when it grew (each step)
                seq.block_table = self._table(vid)
            if seq.state < SeqState.DECODING:
                seq.num_computed_tokens = max(seq.num_computed_tokens,
                                              min(req.num_computed_tokens, seq.num_prompt_tokens))

    def prefill_chunk(self, seq: Sequence, on_layer=None, max_chunk_tokens: int = 0) -> int | None:
        """vLLM's next step of this prompt (its chunking); the first output token after the last."""
        assert seq.state <= SeqState.PREFILLING, f"prefill of a {seq.state.name} sequence"
        vid = self._vid[id(seq)]
        if seq.state == SeqState.WAITING:
            if on_layer is not None:
                self._listeners[vid] = on_layer
            self.kv.open(id(seq), self._prompt_blocks(seq))
            self._submit(seq)
            seq.state = SeqState.PREFILLING
        before = seq.num_computed_tokens
        for _ in range(MAX_IDLE_STEPS):
            if self._tokens[vid]:
                seq.num_computed_tokens = seq.num_prompt_tokens
                self._listeners.pop(vid, None)
                token, logprobs = self._tokens[vid].popleft()
                self._append(seq, token, logprobs)
                return token
            if seq.num_computed_tokens > before:
                return None
            self._step()
        raise RuntimeError(f"vLLM made no progress on {seq.request_id} in {MAX_IDLE_STEPS} steps")

    def prefill(self, seq: Sequence, on_layer=None) -> int:
        """The whole prompt; the first output token."""
        while (token := self.prefill_chunk(seq, on_layer)) is None:
            pass
        return token

    def decode_step(self, seqs: list[Sequence]) -> list[int]:
        """Each sequence's next token (vLLM batches whatever it runs)."""
        assert seqs and all(s.state == SeqState.DECODING for s in seqs)
        queues = [self._tokens[self._vid[id(s)]] for s in seqs]
        for _ in range(MAX_IDLE_STEPS):
            if all(queues):
                break
            self._step()
        else:
            raise RuntimeError(f"vLLM gave no token for {[s.request_id for s, q in zip(seqs, queues) if not q]}")
        got = [q.popleft() for q in queues]
        for s, (t, logprobs) in zip(seqs, got):
            s.num_computed_tokens += 1
            self._append(s, t, logprobs)
        return [t for t, _ in got]

    def _append(self, seq: Sequence, token: int, logprobs: TokenLogprobs | None = None) -> None:
        append_token(seq, token, self.eos_ids, self.max_model_len, logprobs)

    def commit_import(self, seq: Sequence, first_token: int) -> None:
        """The prompt's K/V was received and validated: token 0 is the request's first
        output, and vLLM may schedule it (the connector's get_finished)."""
        assert seq.state == SeqState.WAITING, f"commit of a {seq.state.name} sequence"
        if not 0 <= first_token < self.vocab_size:
            raise InvalidRequest(f"first token {first_token} is outside the vocabulary")
        vid = self._vid[id(seq)]
        seq.num_computed_tokens = seq.num_prompt_tokens
        self._append(seq, first_token)
        if seq.is_finished:
            return
        # The received blocks into the cache, if they were staged here (kv_memory.py).
        self.kv.stage_in(id(seq), seq.block_table, seq.num_cached_tokens // self._block_size, self._prompt_blocks(seq))
        # vLLM's model runner learns a request's tokens from its prompt when first scheduled
        # (an output it did not sample itself would be out of its books): token 0 joins the
        # prompt it computes, and the request has one output fewer to give.
        req = self.sched.requests[vid]
        req.prompt_token_ids = [*req.prompt_token_ids, first_token]
        req.num_prompt_tokens += 1
        req._all_token_ids.append(first_token)
        req.max_tokens -= 1
        req.sampling_params.max_tokens = req.max_tokens
        req.update_block_hashes()
        if seq.sampling.seed:
            self._committed.add(vid)
        if self.tp > 1:  # the ranks copy the received blocks in, then report them received
            self._stage_in[vid] = (seq.num_cached_tokens // self._block_size, self._prompt_blocks(seq))
        else:
            self.worker_conn.received.add(vid)

    def prefix_keys(self, seq: Sequence, first: int, last: int) -> list[tuple[int, bytes | None]]:
        """(block, the prefix-cache hash vLLM gives it) of the sequence's full prompt blocks in
        [first, last): what a hand-off put in vLLM's prefix cache (vLLM caches them at the
        request's first step; the hash is the request's, known now)."""
        vid = self._vid.get(id(seq))
        req = self.sched.requests.get(vid) if vid is not None else None
        if req is None:
            return []
        full = min(last, seq.num_prompt_tokens // self._block_size, len(req.block_hashes))
        return [(seq.block_table[j], bytes(req.block_hashes[j])) for j in range(first, full)]

    def forget_prefix(self, keyed: list[tuple[int, bytes | None]]) -> None:
        """Those blocks leave vLLM's prefix cache where they still hold those hashes (a block
        since reused for other tokens stays); a running request keeps its blocks."""
        from vllm.v1.core.kv_cache_utils import get_block_hash

        pool = self.sched.kv_cache_manager.block_pool
        gone = {b for b, key in keyed if key is not None and (h := pool.blocks[b].block_hash) is not None
                and bytes(get_block_hash(h)) == key}
        self.sched.kv_cache_manager.evict_blocks(gone)

    # ---- the cache's bytes -------------------------------------------------------------
    def kv_views(self, seq: Sequence, layer: int, first: int = 0,
                 count: int | None = None) -> list[tuple[memoryview, memoryview]]:
        """One view per run of blocks (a block's K and V are one run in every vLLM layout: the
        V view is empty); a staged sender's blocks are copied out first (kv_memory.py)."""
        table = seq.block_table
        count = block_range(seq, self._block_size, first, count)
        if self.kv.staged and self.tp == 1 and id(seq) not in self._receiving:
            self.kv.stage_out(id(seq), table, first, count, range(layer, layer + 1))
        empty = memoryview(bytearray())  # writable, as a receiver expects its views
        return [(v, empty) for v in self.kv.views(id(seq), table, layer, first, count)]

    def kv_digest_start(self, seq: Sequence, num_tokens: int | None = None) -> list:
        """[hasher, sequence, tokens] for kv_digest_layer (the table is read per layer: a
        prefill's is complete only once its last layer is)."""
        return [xxhash.xxh3_128(), seq, seq.num_prompt_tokens if num_tokens is None else num_tokens]

    def kv_digest_layer(self, state: list, layer: int) -> None:
        """Hash `layer`'s token slots [0, n), block by block in table order: full blocks as they
        are (a run of consecutive blocks at once), then the last block's first slots."""
        h, seq, n = state
        bs = self._block_size
        nb = -(-n // bs)
        full = nb if n % bs == 0 else nb - 1
        table = seq.block_table[:nb]
        if self.kv.staged and self.tp == 1 and id(seq) not in self._receiving:
            self.kv.stage_out(id(seq), table, 0, nb, range(layer, layer + 1))
        for view in self.kv.views(id(seq), table, layer, 0, full):
            h.update(view)
        if full < nb:
            h.update(self.kv.tail(id(seq), table, layer, nb - 1, n - full * bs, bs))

    def kv_digest(self, seq: Sequence, num_tokens: int | None = None) -> str:
        state = self.kv_digest_start(seq, num_tokens)
        for layer in range(self.num_layers):
            self.kv_digest_layer(state, layer)
        return state[0].hexdigest()

    # ---- end -------------------------------------------------------------------------------
    def free(self, seq: Sequence) -> None:
        """Every block of `seq` back now (idempotent): vLLM aborts it if it runs, then lets
        go of the blocks its connector kept."""
        from vllm.v1.outputs import KVConnectorOutput

        vid = self._vid.pop(id(seq), None)
        self.live.pop(id(seq), None)
        self._priced.pop(id(seq), None)
        if not seq.is_finished:
            seq.state, seq.finish_reason = SeqState.FINISHED, FinishReason.ABORTED
        seq.block_table = []
        if vid is None:
            return
        self._listeners.pop(vid, None)
        self._tokens.pop(vid, None)
        self._committed.discard(vid)
        for pending in (self._stage_out, self._stage_in, self._written, self._copied):
            pending.pop(vid, None)
        self.kv.close(id(seq))
        self._receiving.discard(id(seq))
        if self.worker_conn is not None:
            self.worker_conn.received.discard(vid)
        req = self.sched.requests.get(vid)
        if req is not None and not req.is_finished():
            self.core.abort_requests([vid])
        self._seqs.pop(vid, None)
        req = self.sched.requests.get(vid)
        if req is not None:  # kept for pdserve (request_finished) or for a receive in flight
            # The scheduler's own handling of a transfer the connector reports finished:
            # it frees the finished request's blocks.
            self.sched._update_from_kv_xfer_finished(KVConnectorOutput(finished_sending={vid}))

    def generate(self, prompt_ids: list[int], max_tokens: int, sampling: SamplingParams | None = None,
                 request_id: str = "local") -> list[int]:
        """One request colocated, to completion (tests, benchmarks): engine.generate."""
        return generate(self, prompt_ids, max_tokens, sampling, request_id)
