"""A prefill in flight (`Task`), the states it moves through (the numbered steps of
prefill_worker/worker.py's docstring), where it sends (`Target`) and what
(`send_plan`), and what it did (`PrefillOutcome`)."""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass, field

from runtime.common.lifecycle import Moves
from runtime.directory.chunk_plan import Layout, tiling_error
from runtime.engine import Engine, InvalidRequest, Sequence
from runtime.transfer import ChunkKey, TransferKey
from runtime.transfer.chunks import chunk_bytes


class TaskState(enum.Enum):
    """Where a prefill is (the numbered steps of worker.py's docstring). Moves only
    through `advance`; CANCELLED (a caller's Cancel, or the prefill TTL), FAILED and
    PUBLISHED are terminal. With streaming, chunks leave during COMPUTING."""

    QUEUED = "queued"
    COMPUTING = "computing"
    COMMITTING = "committing"
    """Every chunk sent; the commit is with the destination, the verdict awaited."""
    PUBLISHED = "published"
    CANCELLED = "cancelled"
    FAILED = "failed"


_ENDS = {TaskState.CANCELLED, TaskState.FAILED}
_MOVES = Moves({
    TaskState.QUEUED: {TaskState.COMPUTING, *_ENDS},
    TaskState.COMPUTING: {TaskState.COMMITTING, *_ENDS},
    TaskState.COMMITTING: {TaskState.PUBLISHED, *_ENDS},
    TaskState.PUBLISHED: (),
    TaskState.CANCELLED: (),
    TaskState.FAILED: (),
})


def advance(task: Task, to: TaskState) -> None:
    """Move `task` to `to`; an illegal move is a bug and raises (nothing is changed)."""
    task.state = _MOVES.check(task.state, to, f"prefill {task.request_id}@{task.generation}")


def end(task: Task, to: TaskState) -> None:
    """Move `task` to CANCELLED or FAILED unless it already ended (a cancel racing its end)."""
    if _MOVES.allows(task.state, to):
        task.state = to


def check_live(task: Task) -> None:
    """Raise CancelledError once `task` was cancelled (a cancel may find it between two awaits)."""
    if task.state is TaskState.CANCELLED:
        raise asyncio.CancelledError("cancelled by caller")


@dataclass
class Task:
    """A prefill in flight (for cancel)."""

    request_id: str
    generation: int
    seq: Sequence | None = None
    state: TaskState = TaskState.QUEUED
    runner: asyncio.Task | None = None
    """The coroutine running this prefill (cancelled by `cancel` wherever it waits)."""
    dest: str | None = None
    """The destination's data-plane address, once the grant was checked (the hand-off began)."""
    auth: asyncio.Future | None = None
    """The capability's presentation to the destination, on its way or done."""
    granting: asyncio.Future | None = None
    """A grant that comes after the job: checked (and its capability presented) as soon as
    it lands, while the prefill computes; its plan once done."""
    key: TransferKey | None = None
    """The transfer's key, the grant's (runtime/transfer/keys.py): its chunks' checksums."""
    started_s: float = field(default_factory=time.perf_counter)


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


@dataclass(frozen=True)
class Target:
    """Where a prefill's K/V goes and the right to send it: the router's grant, which may
    come after the job (once the decode worker reserved)."""

    dest: str
    """The destination's data-plane address."""
    first_token_pos: int
    """manifest.token_interval.start: the destination holds the blocks before it."""
    chunks: list[Layout]
    """The manifest's expected chunks: exactly what is sent."""
    manifest: object = None
    """The HandoffManifest the capability is checked against."""
    capability: bytes = b""
    key: bytes = b""
    """The attempt's transfer secret (PrefillRequest.transfer_key; b"": the public key)."""


def send_plan(engine: Engine, first_token_pos: int, prompt_len: int, chunks: list[Layout]) -> list[ChunkKey]:
    """The chunks to send, checked: they tile the transfer set with `engine`'s sizes."""
    bs, layers = engine.block_size, engine.num_layers
    n_blocks = -(-prompt_len // bs)
    if first_token_pos % bs or not 0 <= first_token_pos // bs <= n_blocks:
        raise InvalidRequest(f"token_interval.start {first_token_pos} is not a block boundary "
                             f"within the prompt's {n_blocks} blocks of {bs}")
    why = tiling_error(chunks, first_token_pos // bs, n_blocks, layers)
    plan = [ChunkKey(layer, start, count) for layer, start, count, _ in chunks]
    if not why and any(nbytes != chunk_bytes(engine, key) for key, (*_, nbytes) in zip(plan, chunks)):
        why = f"chunk sizes are not this engine's {engine.block_bytes_per_layer} B per block"
    if why:
        raise InvalidRequest(f"manifest.expected_chunks: {why}")
    return plan


def streams(cfg, nbytes: int) -> bool:
    """Does a transfer of `nbytes` stream under `cfg` (a PrefillWorkerConfig): its chunks
    leaving per layer as the prefill writes it?"""
    return cfg.stream_layers and nbytes >= cfg.stream_min_bytes


def whole_keys(engine: Engine, plan: list[ChunkKey], cfg, one_by_one: bool) -> list[tuple[ChunkKey, int]]:
    """(key, bytes) of `plan` when it is sure to be sent whole once computed (too small to
    stream under `cfg`, a PrefillWorkerConfig; not sent `one_by_one`): what the sender may
    announce ahead and `send_many` then takes; [] otherwise."""
    keys = [(key, chunk_bytes(engine, key)) for key in plan]
    return [] if one_by_one or streams(cfg, sum(n for _, n in keys)) else keys
