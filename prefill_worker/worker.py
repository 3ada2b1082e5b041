"""Prefill worker logic (no gRPC).

One request:
  1. Queued    — prompt validated, blocks allocated (prefix reuse: compute set only)
  2. Computing — chunked prefill on the engine loop; samples the first token
  3. Sending   — transaction TRANSFERRING; transfer-set chunks pushed to the
                 destination's reserved blocks
  4. Committed — manifest (chunks, checksums, digest, first token) handed over;
                 the destination validates and publishes, or refuses
Blocks are freed in every case (full prompt blocks stay as prefix cache). Any
failure aborts the transfer at the destination and the transaction.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from services.engine import AbiMismatch, InvalidRequest, SamplingParams, Sequence
from services.transfer import KVSender, TransferCommit, TransferError
from services.transfer.chunks import chunk_views, describe_chunk, plan_chunks
from services.worker.config import WorkerConfig
from services.worker.directory_ops import TxnOps
from services.worker.loop import AsyncSink, EngineLoop, Job

log = logging.getLogger(__name__)


class TransferRefused(RuntimeError):
    """The destination or the directory refused the transfer (reason in the message)."""


@dataclass
class PrefillOutcome:
    """What one prefill did."""

    transfer_id: str
    computed_tokens: int
    reused_tokens: int
    first_token: int
    kv_digest: str
    sent_bytes: int
    sent_chunks: int
    queue_ms: float
    compute_ms: float
    transfer_ms: float
    total_ms: float


@dataclass
class Task:
    """A prefill in flight (for cancel)."""

    request_id: str
    generation: int
    seq: Sequence | None = None
    cancelled: bool = False
    started_s: float = field(default_factory=time.perf_counter)


class PrefillWorker:
    """Runs prefills and pushes their K/V."""

    def __init__(self, cfg: WorkerConfig, loop: EngineLoop, sender: KVSender, txn: TxnOps):
        self.cfg = cfg
        self.loop = loop
        self.engine = loop.engine
        self.sender = sender
        self.txn = txn
        self.tasks: dict[str, Task] = {}

    async def prefill(self, *, request_id: str, tenant: str, generation: int, transfer_id: str,
                      first_token_pos: int, prompt: list[int], sampling: SamplingParams,
                      dest: str, abi_digest: str, dest_worker: str = "") -> PrefillOutcome:
        """Compute, send and commit one transfer; raises on any failure (after cleanup)."""
        if abi_digest and abi_digest != self.engine.abi.digest:
            raise AbiMismatch(f"cache ABI {abi_digest} does not match this worker's "
                              f"{self.engine.abi.digest}")
        bs = self.engine.block_size
        n_blocks = -(-len(prompt) // bs)
        if first_token_pos % bs or not 0 <= first_token_pos // bs <= n_blocks:
            raise InvalidRequest(f"token_interval.start {first_token_pos} is not a block boundary "
                                 f"within the prompt's {n_blocks} blocks of {bs}")
        if transfer_id in self.tasks:
            raise InvalidRequest(f"transfer {transfer_id} is already in progress")
        task = self.tasks[transfer_id] = Task(request_id, generation)
        try:
            return await self._run(task, tenant, transfer_id, first_token_pos // bs, n_blocks,
                                   prompt, sampling, dest)
        except BaseException as e:
            reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            await self.sender.abort(dest, transfer_id, reason)
            await self.txn.abort(request_id, transfer_id, generation, f"prefill: {reason}")
            raise
        finally:
            self.tasks.pop(transfer_id, None)
            if task.seq is not None:
                seq = task.seq
                await self.loop.call(lambda e: e.free(seq))

    async def _run(self, task: Task, tenant: str, transfer_id: str, first_block: int,
                   n_blocks: int, prompt: list[int], sampling: SamplingParams,
                   dest: str) -> PrefillOutcome:
        t0 = time.perf_counter()
        task.seq = seq = await self.loop.call(lambda e: e.add_request(
            transfer_id, prompt, 1, sampling, salt=tenant.encode()))
        reused = seq.num_cached_tokens
        sink = AsyncSink(asyncio.get_running_loop())
        self.loop.submit_prefill(Job(seq, sink.on_token, sink.on_done, prefill_only=True))
        first_token = None
        while True:
            kind, a, _ = await sink.queue.get()
            if kind == "token":
                first_token = a
                t_first = time.perf_counter()
            else:
                if a is not None:
                    raise a
                break
        t_computed = time.perf_counter()
        if self.cfg.fault_delay_before_send_s:
            await asyncio.sleep(self.cfg.fault_delay_before_send_s)
        self._check(task)
        r = await self.txn.begin(task.request_id, transfer_id, task.generation)
        if not r.ok:
            raise TransferRefused(f"directory refused BEGIN: {r.outcome.name}, state "
                                  f"{r.state.name if r.state else 'none'}")
        chunks = []
        for key in plan_chunks(self.engine.model_cfg.num_hidden_layers, first_block, n_blocks,
                               self.cfg.max_chunk_blocks):
            self._check(task)
            chunk = describe_chunk(self.engine, seq, key)
            await self.sender.send(dest, transfer_id, chunk, chunk_views(self.engine, seq, key))
            chunks.append(chunk)
        kv_digest = await self.loop.call(lambda e: e.kv_digest(seq))
        self._check(task)
        verdict = await self.sender.commit(dest, TransferCommit(
            transfer_id, task.request_id, task.generation, self.engine.abi.digest, tuple(chunks),
            kv_digest, first_token, self.txn.worker_id, self.txn.epoch_fn()))
        if not verdict.published:
            raise TransferRefused(f"destination refused the transfer: {verdict.reason}")
        t_end = time.perf_counter()
        return PrefillOutcome(
            transfer_id, len(prompt) - reused, reused, first_token, kv_digest,
            sum(c.num_bytes for c in chunks), len(chunks), 0.0,
            (t_first - t0) * 1000, (t_end - t_computed) * 1000, (t_end - t0) * 1000)

    def _check(self, task: Task) -> None:
        if task.cancelled:
            raise asyncio.CancelledError("cancelled by caller")

    async def cancel(self, request_id: str, generation: int = 0) -> bool:
        """Cancel every prefill of request_id (at one generation, or all when 0)."""
        found = False
        for task in list(self.tasks.values()):
            if task.request_id == request_id and generation in (0, task.generation):
                found = True
                task.cancelled = True
                if task.seq is not None:
                    self.loop.cancel(task.seq)
        return found
