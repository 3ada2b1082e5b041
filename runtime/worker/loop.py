"""The engine loop: one thread owns the engine; asyncio code talks to it by message.

Each iteration:
  1. run every queued command (allocate, import, free, ... — `call`)
  2. one prefill chunk of the oldest prefill job (chunked prefill)
  3. one decode step over every admitted sequence (continuous batching)
  4. sleep until there is work
so a long prompt never stalls decoding for more than one chunk.

Safety invariant: only the holder of the engine lock touches the engine and its
block tables: this thread for each iteration, or a `call(..., inline=True)` made
while the engine is idle (no iteration running, no command queued), which runs on
the caller's thread at once instead of waking this one and waiting for it (a
loop -> engine -> loop round trip, ~0.3-1.6 ms of thread hand-offs on a busy host).
Other threads may read and write the cache memory of blocks they were handed
(a transfer's reserved, unpublished blocks; a finished prefill's blocks until
it is freed), never anything else.

Results go back through callbacks run on this thread; `AsyncSink` turns them
into asyncio queue items on the server's event loop.

Safety invariant (ownership): a `call` that takes blocks names how to give them
back (`undo`). If its caller stops waiting — a deadline or a cancel lands while
the call is queued behind a long prefill — the call does not run; if it already
ran, what it took is given back. Blocks are never held by a result nobody reads.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.engine import Engine, SamplingParams, Sequence
from runtime.engine.sampler import TokenLogprobs

log = logging.getLogger(__name__)

# on_token(seq, token, index) and on_done(seq, error_or_None), run on the loop thread.
TokenCallback = Callable[[Sequence, int, int], None]
DoneCallback = Callable[[Sequence, "BaseException | None"], None]
LayerCallback = Callable[[int, int, int], None]


PHASES = ("commands", "prefill", "decode", "idle")
"""The engine loop's phases, as `metrics` labels them."""


@dataclass(slots=True)
class Job:
    """A sequence the loop is working on, and whom to tell."""

    seq: Sequence
    on_token: TokenCallback
    on_done: DoneCallback
    on_layer: LayerCallback | None = None
    prefill_only: bool = False
    """Stop after the first token (prefill worker); the caller frees the sequence."""
    cancelled: bool = False
    started_s: float = field(default_factory=time.perf_counter)
    compute_s: float = 0.0
    """Time spent in this job's own prefill chunks: not the wait behind other
    prompts, nor the decode steps the loop runs between its chunks (the
    router's prefill price is this; the rest it prices as queue and steps)."""
    submitted_ns: int = field(default_factory=time.time_ns)
    chunks_ns: list[tuple[int, int]] = field(default_factory=list)
    """(start, end) wall-clock ns of each of its prefill chunks (the trace's compute spans)."""


class EngineLoop:
    """Owns an Engine on a dedicated thread; schedules prefill chunks and decode steps."""

    def __init__(self, engine: Engine, max_batch: int = 64, name: str = "engine"):
        self.engine = engine
        self.max_batch = max_batch
        self._commands: collections.deque[_Command] = collections.deque()
        self._prefill: collections.deque[Job] = collections.deque()
        self._decode: list[Job] = []
        self._wake = threading.Event()
        self._engine_lock = threading.Lock()
        """Held by this thread for each iteration, by an inline call while it runs."""
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.steps = 0
        self.decoded = 0
        """Sequences summed over the decode steps."""
        self._clock: dict[str, list[float]] = {phase: [0.0, 0.0, 0] for phase in PHASES}
        """Per phase: [wall s, this thread's CPU s, runs] (`metrics`)."""

    # ---- lifecycle ----------------------------------------------------
    def start(self) -> None:
        """Start the loop thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current iteration; pending jobs and calls are failed and freed,
        and a later `call` fails at once (call and stop are the event loop's)."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)

    # ---- API for asyncio code -------------------------------------------
    def call(self, fn: Callable[[Engine], Any],
             undo: Callable[[Engine, Any], None] | None = None, *, inline: bool = False) -> Awaitable[Any]:
        """Run fn(engine) on the loop thread between steps; await the result.

        `undo(engine, result)` says fn takes something (blocks) and how to give it back:
        a call whose awaiting task was cancelled before it ran is skipped, and one
        cancelled after gets undone on this thread (see the module's safety invariant).

        `inline`: fn is short (no compute, no bulk copy) and may run here, on the event
        loop, when the engine is idle — nothing queued before it, no iteration under way;
        otherwise it queues as any call does. Order is kept either way.
        """
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if self._stop:  # nothing would run it: a caller's cleanup after stop() must not hang
            fut.set_exception(RuntimeError("engine loop stopped"))
            return fut
        if inline and not self._commands and self._engine_lock.acquire(blocking=False):
            try:
                fut.set_result(fn(self.engine))
            except Exception as e:  # noqa: BLE001 - handed to the awaiting coroutine, as queued
                fut.set_exception(e)
            finally:
                self._engine_lock.release()
        else:
            self._commands.append(_Command(fn, fut, loop, undo))
            self._wake.set()
        return fut if undo is None else self._owned(fut, undo)

    async def _owned(self, fut: asyncio.Future, undo: Callable[[Engine, Any], None]) -> Any:
        """Await a call that takes something. The cancel that lands after the result was
        delivered but before the awaiting task resumed (asyncio throws it in at the await,
        the result in hand) must give the result back too."""
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                result = fut.result()
                self.call(lambda e: undo(e, result))
            raise

    def add_request(self, request_id: str, prompt: list[int], max_tokens: int, sampling: SamplingParams,
                    tenant: str, receive: bool = False) -> Awaitable[Sequence]:
        """Allocate a sequence for `prompt` (its prefix cache salted by `tenant`: no tenant
        reuses another's blocks; `receive`: a reservation whose K/V is imported): inline when
        the engine is idle, given back if the caller stops waiting (the ownership invariant)."""
        return self.call(lambda e: e.add_request(request_id, prompt, max_tokens, sampling, salt=tenant.encode(),
                                                 receive=receive),
                         undo=lambda e, seq: e.free(seq), inline=True)

    def submit_prefill(self, job: Job) -> None:
        """Queue a sequence for (chunked) prefill; afterwards it decodes unless prefill_only.

        Thread-safe; may be called from the loop thread too (inside `call`).
        """
        self._prefill.append(job)
        self._wake.set()

    def admit_decode(self, job: Job) -> None:
        """Add a sequence that already has its prompt K/V (imported) to the decode batch."""
        self._decode.append(job)
        self._wake.set()

    def cancel(self, seq: Sequence) -> None:
        """Mark the job of `seq` cancelled; the loop frees it and reports CancelledError."""
        for job in list(self._prefill) + list(self._decode):
            if job.seq is seq:
                job.cancelled = True
        self._wake.set()

    # ---- load report ----------------------------------------------------
    @property
    def pending_prefill_tokens(self) -> int:
        """Prompt tokens queued but not yet computed."""
        return sum(j.seq.num_prompt_tokens - j.seq.num_computed_tokens for j in list(self._prefill))

    @property
    def active_decode(self) -> int:
        """Sequences in the decode batch."""
        return len(self._decode)

    @property
    def active_context_tokens(self) -> int:
        """Tokens of context over the decode batch (what a decode step attends to)."""
        return sum(job.seq.num_tokens for job in list(self._decode))

    # ---- the loop -------------------------------------------------------
    def _run(self) -> None:
        timed = self._timed
        while not self._stop:
            self._wake.clear()
            with self._engine_lock:
                did = timed("commands", self._run_commands)
                did |= timed("prefill", self._prefill_one_chunk)
                did |= timed("decode", self._decode_one_step)
            if not did:
                timed("idle", lambda: self._wake.wait(timeout=0.5))
        with self._engine_lock:
            self._shutdown()

    def _timed(self, phase: str, fn: Callable[[], bool]) -> bool:
        """Run one phase of an iteration; when it did something, add its wall and CPU time."""
        w0, c0 = time.perf_counter(), time.thread_time()
        did = fn()
        if did or phase == "idle":
            c = self._clock[phase]
            c[0] += time.perf_counter() - w0
            c[1] += time.thread_time() - c0
            c[2] += 1
        return did

    def metrics(self) -> list[tuple[str, dict[str, str], float]]:
        """Samples for the worker's metrics (runtime/telemetry/metrics.py SampleCollector):
        the loop thread's wall and CPU time per phase, the phases run, the sequences decoded."""
        out: list[tuple[str, dict[str, str], float]] = []
        for phase, (wall, cpu, runs) in self._clock.items():
            out += [("pd_engine_loop_seconds_total", {"phase": phase, "clock": "wall"}, wall),
                    ("pd_engine_loop_seconds_total", {"phase": phase, "clock": "cpu"}, cpu),
                    ("pd_engine_loop_runs_total", {"phase": phase}, runs)]
        out.append(("pd_engine_loop_decoded_sequences_total", {}, self.decoded))
        return out

    def _run_commands(self) -> bool:
        did = False
        while self._commands:
            cmd = self._commands.popleft()
            did = True
            if cmd.undo is not None and cmd.fut.cancelled():
                continue  # nobody waits for what it would take
            try:
                result = cmd.fn(self.engine)
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
                cmd.loop.call_soon_threadsafe(_set_exception, cmd.fut, e)
            else:
                cmd.loop.call_soon_threadsafe(self._deliver, cmd, result)
        return did

    def _deliver(self, cmd: _Command, result: Any) -> None:
        """Event loop: hand `result` to the caller, or give it back if the caller is gone."""
        if not cmd.fut.done():
            cmd.fut.set_result(result)
        elif cmd.undo is not None:
            undo = cmd.undo
            self.call(lambda e: undo(e, result))

    def _finish(self, job: Job, error: BaseException | None, free: bool = True) -> None:
        if free:
            self.engine.free(job.seq)
        try:
            job.on_done(job.seq, error)
        except Exception:  # a sink must not kill the loop
            log.exception("on_done callback failed for %s", job.seq.request_id)

    def _prefill_one_chunk(self) -> bool:
        while self._prefill and self._prefill[0].cancelled:
            self._finish(self._prefill.popleft(), asyncio.CancelledError())
        if not self._prefill:
            return False
        job = self._prefill[0]
        t0, t0_ns = time.perf_counter(), time.time_ns()
        try:
            token = self.engine.prefill_chunk(job.seq, job.on_layer)
        except Exception as e:  # reported to the request, loop goes on
            log.exception("prefill of %s failed", job.seq.request_id)
            self._prefill.popleft()
            self._finish(job, e)
            return True
        job.compute_s += time.perf_counter() - t0
        job.chunks_ns.append((t0_ns, time.time_ns()))
        if token is None:
            return True
        self._prefill.popleft()
        job.on_token(job.seq, token, 0)
        if job.prefill_only:
            self._finish(job, None, free=False)
        elif job.seq.is_finished:
            self._finish(job, None)
        else:
            self._decode.append(job)
        return True

    def _decode_one_step(self) -> bool:
        for job in [j for j in self._decode if j.cancelled]:
            self._decode.remove(job)
            self._finish(job, asyncio.CancelledError())
        if not self._decode:
            return False
        batch = self._decode[:self.max_batch]
        try:
            tokens = self.engine.decode_step([j.seq for j in batch])
        except Exception as e:
            log.exception("decode step failed")
            for job in batch:
                self._decode.remove(job)
                self._finish(job, e)
            return True
        self.steps += 1
        self.decoded += len(batch)
        # Rotate so that a batch larger than max_batch shares steps fairly.
        self._decode = self._decode[len(batch):] + batch
        for job, token in zip(batch, tokens):
            job.on_token(job.seq, token, len(job.seq.output_ids) - 1)
            if job.seq.is_finished:
                self._decode.remove(job)
                self._finish(job, None)
        return True

    def _shutdown(self) -> None:
        err = RuntimeError("engine loop stopped")
        for job in list(self._prefill) + self._decode:
            self._finish(job, err)
        self._prefill.clear()
        self._decode.clear()
        while self._commands:
            cmd = self._commands.popleft()
            cmd.loop.call_soon_threadsafe(_set_exception, cmd.fut, err)


@dataclass(slots=True)
class _Command:
    """A queued `call`."""

    fn: Callable[[Engine], Any]
    fut: asyncio.Future
    loop: asyncio.AbstractEventLoop
    undo: Callable[[Engine, Any], None] | None


def _set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


@dataclass(frozen=True, slots=True)
class TokenOut:
    """One generated token of a sequence, as a sink delivers it."""

    token_id: int
    index: int
    """Position in the output, from 0."""
    logprobs: TokenLogprobs | None = None
    """Its log-probabilities, when the request asked and this engine sampled it."""


@dataclass(frozen=True, slots=True)
class SeqDone:
    """A sequence ended: `error` None and its `finish_reason` ("stop", "length"...), or
    the error that ended it."""

    error: BaseException | None
    finish_reason: str | None


class AsyncSink:
    """Token/done callbacks that feed an asyncio queue of `TokenOut` ... `SeqDone` on
    `loop` (thread-safe)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_first: Callable[[TokenOut], None] | None = None):
        """on_first(item): run on `loop` with token 0's TokenOut, before it is queued
        (whoever waits on the queue hears of it a turn later, at least)."""
        self.loop, self.on_first = loop, on_first
        self.queue: asyncio.Queue = asyncio.Queue()

    def on_token(self, seq: Sequence, token: int, index: int) -> None:
        """Loop thread: a new token (its log-probabilities read now, beside it)."""
        self.loop.call_soon_threadsafe(self._put, TokenOut(token, index, seq.logprobs_of(index)))

    def _put(self, item: TokenOut) -> None:
        if item.index == 0 and self.on_first is not None:
            try:
                self.on_first(item)
            except Exception:  # its owner's bug: the token still goes to the queue
                log.exception("on_first callback failed")
        self.queue.put_nowait(item)

    def on_done(self, seq: Sequence, error: BaseException | None) -> None:
        """Loop thread: finished (error None) or failed."""
        reason = seq.finish_reason.value if seq.finish_reason else None
        self.loop.call_soon_threadsafe(self.queue.put_nowait, SeqDone(error, reason))
