"""One attempt (one generation) of a request, on one route, and its teardown.

Disaggregated attempt on (P, D), generation g, transfer id "{request_id}/{g}":

    1. concurrently, the job leaving first
         Prefill.Prefill on P, the job -> computes meanwhile (a transfer too small to
                                        stream; one that may stream waits for its grant)
         Decode.Reserve on D         -> reservation (blocks, data-plane address)
    2. leaving in this order
         Directory.Reserve(manifest) -> must be APPLIED        [txn RESERVED]; Started
         the Prefill's grant         -> manifest, destination, capability; P sends token 0
                                        as soon as it is sampled, sends and commits the
                                        K/V; returns after D accepted the commit (nothing
                                        of P's needs the record)
    3. once the directory answered APPLIED
         Decode.DecodeStream on D    -> D publishes only once its stream came: one-way, no
                                        party asks about a transaction the directory does
                                        not hold yet; waits for PUBLISHED, then tokens 0, 1, ...
       P's token 0                   -> out as soon as it is read, at any of these steps
                                        (P's own result; a retry reproduces it)
    4. D's token 0 arrives           -> published (D releases it); equal to P's; D's tokens
                                        go out once the two ends' digests compared (P's
                                        seal relayed with D's token 0, or P's reply)
    5. complete event                -> done

Colocated attempt on W: Started event, Decode.Generate on W, tokens, complete.

Every failure, cancellation or deadline runs one teardown (`_teardown`), in this order:
Directory.Abort (only while the transaction may be unpublished: `Attempt.txn_open`, read
from its stage; after the Reserve's answer),
Decode.Cancel, close the stream call, Prefill.Cancel; in its own task under `asyncio.shield`
(a second cancellation cannot cut it short). Failures become `AttemptFailed` (the
orchestrator retries elsewhere) unless retrying cannot help: a worker's INVALID_ARGUMENT
about the client's request and output divergence raise `RouterError` directly.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from typing import Any

from router.config import RouterConfig
from router.gateway import DirectoryGateway, WorkerGateway
from router.requests.admission import Admitted
from router.requests.attempt import Attempt
from router.requests.attempt_drive import AttemptDrive
from router.requests.attempt_start import AttemptStart
from router.requests.attempt_teardown import AttemptTeardown
from router.requests.cluster_view import ClusterView
from router.requests.inflight import InFlight
from router.requests.output import OutputLog
from router.types import Event, PrefillDone, Route, StreamComplete


@dataclasses.dataclass(frozen=True, slots=True)
class RouterReach:
    """What every request's attempts use of their router (one per router: the Orchestrator's)."""

    workers: WorkerGateway
    directory: DirectoryGateway
    inflight: InFlight
    config: RouterConfig
    spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task]
    """Runs a teardown that must finish even when the request's task is cancelled."""
    view: ClusterView | None = None
    """The cluster view (liveness of an attempt's workers; routes stopped), if any."""
    mint: Callable[..., bytes] | None = None
    """(manifest, reservation) -> the attempt's signed transfer capability; None: none."""


class AttemptRunner(AttemptStart, AttemptDrive, AttemptTeardown):
    """Runs the attempts of one request; `current` is the attempt in flight."""

    def __init__(self, req: Admitted, reach: RouterReach, output: OutputLog, emit: Callable[[Event], None],
                 remaining_s: Callable[[], float | None],
                 on_prefill: Callable[[Attempt, PrefillDone], None] | None = None):
        self.req = req
        self._mint = reach.mint
        self._workers, self._directory, self._inflight = reach.workers, reach.directory, reach.inflight
        self._cfg, self._output, self._emit, self._spawn = reach.config, output, emit, reach.spawn
        self._remaining_s = remaining_s
        self._on_prefill = on_prefill  # told each PrefillResult (the cost model learns from its timings)
        self._view = reach.view
        self.current: Attempt | None = None
        self.last: Attempt | None = None
        """The latest attempt started (kept after it ends, for error messages)."""

    async def run(self, att: Attempt) -> StreamComplete:
        """Run `att` to its complete event; raises AttemptFailed or RouterError
        (after teardown), or CancelledError (after teardown)."""
        self.current = self.last = att
        try:
            queue: asyncio.Queue = asyncio.Queue()
            req = self.req.replaying(self._output.tokens[:att.first_index])  # a resumed attempt's request
            if att.route is Route.DISAGGREGATED:
                await self._start_disaggregated(att, req, queue)
            else:
                self._start_colocated(att, req, queue)
            done = await self._drive(att, queue)
            await self._settle_prefill(att)
            return done
        except BaseException as exc:
            reason = f"{att.describe()} cancelled" if isinstance(exc, asyncio.CancelledError) else \
                f"{att.describe()} failed: {exc}"
            await asyncio.shield(self._spawn(self._teardown(att, reason)))
            raise
        finally:
            self._inflight.release((*att.overlay_handles, att.prefill_handle))
            for task in (att.stream_task, att.prefill_task, att.reserve_task):
                if task is not None and not task.done():
                    task.cancel()
            self.current = None
