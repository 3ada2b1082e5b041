"""Prefill worker logic (no gRPC).

One request:
  0. Granted   — destination, chunk plan and capability, checked. The router may
                 send the job before its grant (it asks the decode worker for blocks
                 meanwhile): a transfer too small to stream takes its grant after the
                 compute, one that may stream before (its chunks leave per layer)
  1. Queued    — prompt validated, blocks allocated (prefix reuse: compute set only); a full
                 pool queues the job until prefills in flight free theirs (room.py)
  2. Computing — chunked prefill on the engine loop; samples token 0 (to the router at once)
  3. Sending   — transfer-set chunks pushed to the destination's reserved blocks.
                 The capability is presented (AUTH) once granted.
                 Streaming (transfers of at least stream_min_bytes): each chunk
                 leaves as soon as prefill wrote its layer (streaming.py), and once
                 the last one left (most
                 often before the compute ends) the COMMIT goes ahead of the first
                 token (TOKEN_FOLLOWS: the destination validates and publishes while
                 the compute ends; the COMMIT after it brings the token alone);
                 otherwise after the whole prefill, the COMMIT in the last message
  4. Committed — manifest (chunks, checksums, digest, first token) handed over,
                 the source's declaration sealed in it (runtime/security/seal.py:
                 no BEGIN: nothing of the prefill's calls the directory on the way,
                 so nothing of it depends on when the router's record lands); the
                 destination's Publish relays the seal, the directory opens it and
                 publishes (RESERVED to PUBLISHED in one step), or the destination refuses
Blocks are freed in every case (full prompt blocks stay as prefix cache). Any
failure once granted aborts the transfer at the destination and the transaction
(before, neither was reached: the router's teardown aborts its record).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from runtime.common.tasks import TaskSet
from runtime.directory.chunk_plan import Layout
from runtime.engine import InvalidRequest, SamplingParams
from runtime.telemetry.catalog import WorkerMetrics
from runtime.transfer import KVSender
from runtime.worker.capabilities import SourceGate
from runtime.worker.config import PrefillWorkerConfig
from runtime.worker.directory_ops import TxnOps
from runtime.worker.events import EventLog, FaultPause
from runtime.worker.loop import EngineLoop, TokenOut

from .commit import settle
from .handoff import HandOff
from .room import PoolQueue
from .tasks import PrefillOutcome, Target, Task, TaskState, end

log = logging.getLogger(__name__)


class PrefillWorker:
    """Runs prefills and pushes their K/V."""

    def __init__(self, cfg: PrefillWorkerConfig, loop: EngineLoop, sender: KVSender, txn: TxnOps,
                 gate: SourceGate | None = None, metrics: WorkerMetrics | None = None):
        if "stream_layers" not in cfg.model_fields_set and not loop.engine.streams_layers:
            cfg = cfg.replace(stream_layers=False)  # PD_STREAM_LAYERS unset: the engine's default
        self.cfg, self.metrics = cfg, metrics or WorkerMetrics()
        """Where completed hand-offs are counted (pd_kv_transfer_bytes_total, exposed time)."""
        self.gate = gate
        """Checks the router's transfer capability before any K/V is read (None: security off)."""
        self.loop, self.engine, self.sender, self.txn = loop, loop.engine, sender, txn
        self.tasks: dict[str, Task] = {}
        """Prefills in flight, until their blocks are freed (after the reply)."""
        self._releasing = TaskSet(lambda e: log.error("freeing a prefill's blocks failed: %r", e))
        self.events = EventLog(cfg.event_log, cfg.worker_id)
        self.pause = FaultPause(cfg.fault_pause_s)
        self.room = PoolQueue(on_wait=self.metrics.prefill_pool_waits.inc)  # jobs waiting for blocks

    async def prefill(self, *, request_id: str, tenant: str, generation: int, transfer_id: str,
                      prompt: list[int], sampling: SamplingParams, abi_digest: str,
                      first_token_pos: int = 0, dest: str = "", chunks: list[Layout] = (),
                      manifest=None, capability: bytes = b"", target: Awaitable[Target] | None = None,
                      on_first_token: Callable[[TokenOut], None] | None = None) -> PrefillOutcome:
        """Compute, send and commit one transfer; raises on any failure (after cleanup).
        ``chunks`` is the manifest's expected list: exactly what is sent. With a gate, the
        capability must grant exactly this transfer (CapabilityDenied before anything is read).
        ``target``: the destination, the grant's, comes later (instead of these arguments);
        one too small to stream computes meanwhile. Nothing is read or sent before it.
        ``on_first_token(item)``: token 0 (with its log-probabilities, when asked), on the loop
        as soon as it is sampled (to the router)."""
        if abi_digest:
            self.engine.abi.check_compatible(abi_digest)
        if target is None:
            target = asyncio.get_running_loop().create_future()
            target.set_result(Target(dest, first_token_pos, list(chunks), manifest, capability))
        if transfer_id in self.tasks:
            raise InvalidRequest(f"transfer {transfer_id} is already in progress")
        task = self.tasks[transfer_id] = Task(request_id, generation,
                                              runner=asyncio.current_task())
        ttl = asyncio.get_running_loop().call_later(self.cfg.prefill_ttl_s, self._expire, task)
        try:
            out = await self._compute_and_send(task, tenant, transfer_id, prompt, sampling, target, on_first_token)
            self.metrics.sent(out.sent_bytes, out.transfer_ms / 1000)
            return out
        except BaseException as e:
            end(task, TaskState.FAILED)
            if task.dest is not None:  # the hand-off began: undo it at both ends
                reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                await self.sender.abort(task.dest, transfer_id, reason)
                await self.txn.abort(request_id, transfer_id, generation, f"prefill: {reason}")
            raise
        finally:
            ttl.cancel()
            # Off the reply's way: the engine thread frees the blocks (~1 ms), then the task leaves the table.
            self._releasing.spawn(self._release(task, transfer_id))

    async def _release(self, task: Task, transfer_id: str) -> None:
        try:
            if task.seq is not None:
                seq = task.seq
                await self.loop.call(lambda e: e.free(seq))
        finally:
            self.room.freed()
            if self.tasks.get(transfer_id) is task:
                del self.tasks[transfer_id]
            windows = getattr(self.sender, "credit_windows", dict)()
            self.events("credits", request=task.request_id, transfer=transfer_id,
                        in_flight=sum(w.in_flight for w in windows.values()))

    async def _compute_and_send(self, task: Task, tenant: str, transfer_id: str, prompt: list[int],
                                sampling: SamplingParams, target: Awaitable[Target],
                                on_first_token: Callable[[TokenOut], None] | None) -> PrefillOutcome:
        try:
            return await HandOff(self, task, tenant, transfer_id, prompt, sampling, target, on_first_token).run()
        finally:
            await settle(task.granting)  # before the presentation it may have started
            await settle(task.auth)

    def _expire(self, task: Task) -> None:
        """The prefill TTL passed: cancel it wherever it waits (its finally frees the blocks)."""
        log.warning("prefill %s@%d still running after %.0f s: cancelled", task.request_id,
                    task.generation, self.cfg.prefill_ttl_s)
        self._cancel(task, f"prefill TTL of {self.cfg.prefill_ttl_s:g} s expired")

    def _cancel(self, task: Task, why: str | None = None) -> None:
        """Stop `task` wherever it waits (room in the pool, a credit, READY, the verdict)."""
        end(task, TaskState.CANCELLED)
        if task.seq is not None:
            self.loop.cancel(task.seq)
        if task.runner is not None and task.runner is not asyncio.current_task():
            task.runner.cancel(why)

    def held_blocks(self) -> int:
        """Blocks held by prefills in flight (computing, sending or awaiting the verdict)."""
        return len({b for t in list(self.tasks.values()) if t.seq is not None for b in t.seq.block_table})

    async def cancel(self, request_id: str, generation: int = 0) -> bool:
        """Cancel every prefill of request_id (at one generation, or all when 0)."""
        found = False
        for task in list(self.tasks.values()):
            if task.request_id == request_id and generation in (0, task.generation):
                found = True
                self._cancel(task)
        return found
