"""One attempt (one generation) of a request on one route: what it holds, the
stages it goes through (`Stage`, moved only by `advance`), and how it fails
(`AttemptFailed`, with the workers to blame). router/requests/attempts.py runs attempts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from collections.abc import AsyncIterator

from router.types import PrefillDone, Route, RouterError, StatusCode, StreamItem, TxnAnswer, WorkerCallError
from runtime.common.lifecycle import Moves
from runtime.directory.records import WorkerRecord
from runtime.directory.states import Outcome
from runtime.transfer.keys import new_key


class Stage(enum.Enum):
    """Where an attempt is; the value names it in error messages. Moves only forward,
    through `advance` (the numbered steps of router/requests/attempts.py)::

        PLACED -> DECODE_RESERVE -> DIRECTORY_RESERVE -> PREFILL -> DECODE   (split)
                                    DIRECTORY_RESERVE -> REFUSED              (no record)
                                              PREFILL -> DIVERGED             (digests differ)
        PLACED -> COLOCATED                                                    (colocated)

    A failure leaves the attempt at the stage it failed in; teardown reads from the
    stage what the attempt engaged: whether the transaction may be open unpublished
    (`Attempt.txn_open`), whether the decode must drop what it published
    (`Attempt.discard_kv`).
    """

    PLACED = "placed"
    DECODE_RESERVE = "decode reserve"
    """D was asked for blocks (a reserve that timed out may still have been granted)."""
    DIRECTORY_RESERVE = "directory reserve"
    """The transaction is being recorded in the directory (one that timed out may be); the
    grant left beside it."""
    REFUSED = "directory refused"
    """The directory did not record it (another run of the request id holds the generation,
    a rollback stopped the routes, an end's lease is gone): nothing of it to abort."""
    PREFILL = "prefill"
    """Recorded: the DecodeStream left; P prefills and sends, D publishes once its stream
    came. The transaction may be open unpublished."""
    DECODE = "decode"
    """Token 0 arrived: D decodes from PUBLISHED K/V and owns the transaction's release."""
    DIVERGED = "digests differ"
    """D published K/V whose digest is not the one P computed: D drops it on Cancel."""
    COLOCATED = "colocated generate"
    """W computes the prompt and decodes; no transaction."""


_MOVES = Moves({
    Stage.PLACED: {Stage.DECODE_RESERVE, Stage.COLOCATED},
    Stage.DECODE_RESERVE: {Stage.DIRECTORY_RESERVE},
    Stage.DIRECTORY_RESERVE: {Stage.PREFILL, Stage.REFUSED},
    Stage.REFUSED: (),
    Stage.PREFILL: {Stage.DECODE, Stage.DIVERGED},
    Stage.DECODE: (),
    Stage.DIVERGED: (),
    Stage.COLOCATED: (),
})


def advance(att: Attempt, to: Stage) -> None:
    """Move `att` to stage `to`; an illegal move is a router bug and raises."""
    att.stage = _MOVES.check(att.stage, to, att.describe())


DIRECTORY_RESERVE = Stage.DIRECTORY_RESERVE.value
"""The stage label of an attempt that opens its transaction in the directory."""

RAN_BEFORE = frozenset({Outcome.STALE_GENERATION, Outcome.DUPLICATE, Outcome.CHECKSUM_CONFLICT})
"""Reserve outcomes that, with the request's generation at or above the attempt's,
mean an earlier run of the same request id holds the transfer id or the generation."""


class AttemptFailed(Exception):
    """An attempt failed in a way another route may not: retry under a new generation."""

    def __init__(self, stage: str, code: StatusCode, message: str, suspects: frozenset[str] = frozenset(),
                 culprit: WorkerRecord | None = None):
        super().__init__(f"{stage}: {code.name}: {message}")
        self.stage = stage
        self.code = code
        self.message = message
        self.suspects = suspects | ({culprit.worker_id} if culprit else set())
        """Workers that may have caused it; later attempts avoid them when they can."""
        self.culprit = culprit
        """The worker whose own call failed, when the failure is certainly its
        (its RPC or its stream broke, not a hand-off between two workers)."""


class GenerationBehind(AttemptFailed):
    """The directory refused the reserve because this request id already ran at
    `current` or later (a client re-using a finished id within the directory's
    retention). Nobody failed: the next attempt goes above `current`, uncounted."""

    def __init__(self, current: int, message: str):
        super().__init__(DIRECTORY_RESERVE, StatusCode.ABORTED, message)
        self.current = current


@dataclasses.dataclass(slots=True)
class Attempt:
    """One generation of a request on one route, and what it holds right now."""

    generation: int
    route: Route
    decode: WorkerRecord
    prefill: WorkerRecord | None = None
    route_epoch: int = 0
    stage: Stage = Stage.PLACED
    prefill_reply: PrefillDone | None = None
    """Prefill.Prefill's result, once it returned successfully."""
    sealed_kv_digest: str = ""
    """The prefill's digest by its own seal, relayed with token 0 and opened here with its
    registered key (router/requests/seals.py): compared without its reply."""
    held: list = dataclasses.field(default_factory=list)
    """The decode's stream items from its token 0 on, held until prefill's reply lets the
    router compare the two ends' K/V digests (none goes out before), unless the decode's
    token 0 brought the prefill's seal over its digest (the prefill's token 0 went out)."""
    prefill_handle: int | None = None
    """Overlay entry of the prompt tokens queued at P (dropped when prefill returns)."""
    tokens_seen: int = 0
    """Tokens this attempt streamed; also the next expected index."""
    first_index: int = 0
    """The request's output index of this attempt's token 0: a resumed attempt's prompt
    ends with the outputs before it (Admitted.replaying)."""
    overlay_handles: list[int] = dataclasses.field(default_factory=list)
    stream_task: asyncio.Task | None = None
    prefill_task: asyncio.Task | None = None
    reserve_task: asyncio.Task | None = None
    """The directory's Reserve of a disaggregated attempt (awaited in its start; a teardown
    waits for it, so that its Abort never overtakes it)."""
    started: bool = False
    """The client was told of this attempt (its Started event): an output fact, not a stage.
    A disaggregated attempt's goes out once the directory recorded it, or with the
    prefill's token 0 if that came first."""
    number: int = 0
    """1 for the request's first attempt, ...; the generation unless the request id
    ran before (then generations continue above the earlier run's). 0: = generation."""
    transfer_key: bytes = dataclasses.field(default_factory=new_key, repr=False)
    """A disaggregated attempt's transfer secret (runtime/transfer/keys.py): to its two ends
    only, with Decode.Reserve and the Prefill's grant; never logged."""

    def __post_init__(self) -> None:
        self.number = self.number or self.generation

    @property
    def txn_open(self) -> bool:
        """The directory transaction may exist unpublished (Abort on teardown): from its
        Reserve on, until it was refused or D's token 0 said it is published."""
        return self.stage in (Stage.DIRECTORY_RESERVE, Stage.PREFILL)

    @property
    def discard_kv(self) -> bool:
        """The two ends' digests differed: D drops the published blocks from its cache."""
        return self.stage is Stage.DIVERGED

    @property
    def prefill_done(self) -> bool:
        """Prefill.Prefill returned successfully."""
        return self.prefill_reply is not None

    @property
    def prefill_kv_digest(self) -> str:
        """The prefill's K/V digest by its reply ("" before it)."""
        return self.prefill_reply.kv_digest if self.prefill_reply is not None else ""

    @property
    def decode_engaged(self) -> bool:
        """D (or W) may hold state for this generation (Cancel on teardown)."""
        return self.stage is not Stage.PLACED

    @property
    def prefill_engaged(self) -> bool:
        """P was asked to prefill (Cancel on teardown); its job leaves beside the decode's Reserve."""
        return self.stage in (Stage.PREFILL, Stage.DECODE, Stage.DIVERGED) or self.prefill_task is not None

    def describe(self) -> str:
        """e.g. "attempt 2 (disaggregated prefill-1 -> decode-0)"."""
        gen = f", generation {self.generation}" if self.generation != self.number else ""
        if self.route is Route.DISAGGREGATED:
            return (f"attempt {self.number} (disaggregated {self.prefill.worker_id} -> "
                    f"{self.decode.worker_id}{gen})")
        return f"attempt {self.number} (colocated on {self.decode.worker_id}{gen})"


def judge_reserve(att: Attempt, answer: TxnAnswer | WorkerCallError, request_id: str, view=None) -> None:
    """The directory's answer to `att`'s Reserve: returns when APPLIED, else raises
    AttemptFailed (GenerationBehind when the request id ran before at or above the
    attempt's generation). `view` (a ClusterView) hears of a rollback's stop."""
    if isinstance(answer, WorkerCallError):
        raise AttemptFailed(DIRECTORY_RESERVE, answer.code, answer.message) from answer
    if answer.outcome is Outcome.APPLIED:
        return
    advance(att, Stage.REFUSED)
    what = f"directory answered {answer.outcome.name}"
    if answer.outcome in RAN_BEFORE and answer.current_generation >= att.generation:
        raise GenerationBehind(answer.current_generation, f"{what}: request id {request_id!r} ran before, up to "
                               f"generation {answer.current_generation}")
    if answer.outcome is Outcome.ROUTES_STOPPED:  # a rollback: nobody failed, run colocated
        if view is not None:
            view.routes_stopped_elsewhere()
        raise AttemptFailed(DIRECTORY_RESERVE, StatusCode.FAILED_PRECONDITION,
                            f"{what}: a rollback stopped new disaggregated routes")
    lost = answer.outcome is Outcome.LEASE_LOST
    raise AttemptFailed(DIRECTORY_RESERVE, StatusCode.ABORTED, what,
                        frozenset({att.prefill.worker_id, att.decode.worker_id}) if lost else frozenset())


def blame(att: Attempt, code: StatusCode = StatusCode.UNAVAILABLE) -> dict:
    """Who caused a stream failure at this point. Before the decode's token 0 of a
    disaggregated attempt an aborted hand-off may be either end's fault; an
    unreachable D (or any failure after it, or once prefill returned) is D's."""
    handoff = att.prefill is not None and att.tokens_seen == 0 and not att.prefill_done
    if handoff and code is not StatusCode.UNAVAILABLE:
        return {"suspects": frozenset({att.prefill.worker_id, att.decode.worker_id})}
    return {"culprit": att.decode}


# ---- what an attempt hears: its queue's events (router/requests/attempt_drive.py _drive) ----
@dataclasses.dataclass(frozen=True, slots=True)
class FromStream:
    """A token or the complete event of the decode's (or colocated worker's) stream."""

    item: StreamItem


@dataclasses.dataclass(frozen=True, slots=True)
class StreamEnded:
    """The stream closed (after its complete event, or without one: a failure)."""


@dataclasses.dataclass(frozen=True, slots=True)
class StreamFailed:
    error: WorkerCallError


@dataclasses.dataclass(frozen=True, slots=True)
class PrefillReturned:
    done: PrefillDone


@dataclasses.dataclass(frozen=True, slots=True)
class PrefillFailed:
    error: WorkerCallError


@dataclasses.dataclass(frozen=True, slots=True)
class Diverged:
    """The prefill's token 0 is not the one the client has (raised where events are judged)."""

    error: RouterError


AttemptEvent = FromStream | StreamEnded | StreamFailed | PrefillReturned | PrefillFailed | Diverged


async def pump(stream: AsyncIterator[StreamItem], queue: asyncio.Queue) -> None:
    """A worker stream's items into an attempt's queue: FromStream each, then StreamEnded,
    or StreamFailed; the stream closed at the end."""
    try:
        async for item in stream:
            queue.put_nowait(FromStream(item))
        queue.put_nowait(StreamEnded())
    except WorkerCallError as exc:
        queue.put_nowait(StreamFailed(exc))
    except Exception as exc:  # noqa: BLE001 - a gateway bug must not hang the attempt
        queue.put_nowait(StreamFailed(WorkerCallError(StatusCode.INTERNAL, repr(exc))))
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()
