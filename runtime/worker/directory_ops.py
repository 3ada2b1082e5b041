"""The transaction calls a worker makes on the directory, bound to its identity.

A thin layer over `runtime.directory.client.DirectoryClient`: it fills in this
worker's id and current epoch (which changes when the worker re-registers) and
makes the clean-up calls (`abort`, `release`) best effort. Errors are the
client's: `DirectoryUnavailable` when the directory cannot answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import tenacity

from pdserve_client.rpc.pd.v1 import manifest_pb2
from runtime.common.tasks import TaskSet
from runtime.directory.client import DirectoryClient, TxnReply
from runtime.directory.records import DirectoryUnavailable
from runtime.directory.states import Outcome, TxnState
from runtime.security.seal import Sealer

__all__ = ["RESERVED_WAIT_S", "DirectoryUnavailable", "TxnOps"]

RELEASE_RETRY_S = 120.0
"""How long a worker keeps retrying the release of a finished transaction."""
RESERVED_WAIT_S = 2.0
"""How long a destination's unsealed Publish waits for a transaction still RESERVED: a
source that declares with a Begin instead of a seal (not pdserve's prefill, which seals
its COMMIT) may reach the directory second. A transaction the directory does not hold is
never waited for: the decode publishes once the router's DecodeStream came, which leaves
after the directory recorded the transaction (docs/design.md, "The protocol is
one-way"), so NOT_FOUND is an answer, not a race."""


async def _asking_again(call: Callable[[], Awaitable[TxnReply]], not_yet: Callable[[TxnReply], bool],
                        wait_s: float) -> TxnReply:
    """`call`'s reply, asked again (1 ms doubling to 50 ms) while `not_yet(reply)`; past
    `wait_s` the last reply stands (returned, not raised). The first answer most often
    stands: it is taken without the retry machinery (~50 µs a call here, on the path)."""
    reply = await call()
    if not not_yet(reply):
        return reply
    retrying = tenacity.AsyncRetrying(retry=tenacity.retry_if_result(not_yet),
                                      wait=tenacity.wait_exponential(multiplier=0.001, max=0.05),
                                      stop=tenacity.stop_after_delay(wait_s),
                                      retry_error_callback=lambda state: state.outcome.result())
    return await retrying(call)


class TxnOps:
    """publish / abort / release for one worker identity, and its seal (a source declares
    under its seal in its COMMIT; nothing of a hand-off Begins: docs/design.md)."""

    def __init__(self, client: DirectoryClient, worker_id: str,
                 epoch_fn: Callable[[], int] = lambda: 0, sealer: Sealer | None = None):
        self.client = client
        self.worker_id = worker_id
        self.epoch_fn = epoch_fn
        """This worker's current epoch (it changes when the worker re-registers)."""
        self.sealer = sealer or Sealer()
        """This process's sealing key; its public half is registered (runtime/security/seal.py)."""
        self._background = TaskSet()
        """Aborts being retried while the directory is away (strong references)."""

    def seal(self, transfer_id: str, generation: int, evidence: str) -> bytes:
        """This worker's seal, at its current epoch, over its declaration of a transfer
        it sends (`evidence`: runtime.directory.wire.evidence_of)."""
        return self.sealer.seal(transfer_id, generation, self.worker_id, self.epoch_fn(), evidence)

    async def publish(self, request_id: str, transfer_id: str, generation: int,
                      kv_digest: str, chunks: Sequence[manifest_pb2.ChunkSpec] = (),
                      wait_s: float = RESERVED_WAIT_S, source_seal: bytes = b"") -> TxnReply:
        """VALIDATED -> PUBLISHED, compare-and-set on the request's current generation;
        with ``chunks`` (what arrived), TRANSFERRING -> VALIDATED -> PUBLISHED in one call;
        with ``source_seal`` (relayed from the source's COMMIT), declared first in that call.
        Without a seal, asked again (1 ms doubling to 50 ms) for up to `wait_s` while the
        transaction is still RESERVED (the source's declaring Begin may land second); a
        NOT_FOUND stands (the record came before the grant: the router gave it up)."""
        async def call() -> TxnReply:
            return await self.client.publish(request_id, transfer_id, generation, self.worker_id,
                                             self.epoch_fn(), kv_digest, chunks, source_seal)
        return await _asking_again(call, lambda r: r.outcome is Outcome.ILLEGAL_TRANSITION
                                   and r.state is TxnState.RESERVED, wait_s)

    async def abort(self, request_id: str, transfer_id: str, generation: int,
                    reason: str) -> TxnReply | None:
        """Any unpublished state -> ABORTED (idempotent). Never raises and never waits
        for an absent directory: if it cannot answer now, the abort is retried in the
        background (as `release` is) for up to RELEASE_RETRY_S, so that a transaction
        does not stay open until its TTL because the directory blinked; past that the
        lease/TTL reaper aborts it."""
        try:
            return await self.client.abort(request_id, transfer_id, generation, self.worker_id,
                                           self.epoch_fn(), reason)
        except ValueError:
            return None
        except DirectoryUnavailable:
            self._background.spawn(self._retry(lambda: self.client.abort(
                request_id, transfer_id, generation, self.worker_id, self.epoch_fn(), reason)))
            return None

    async def _retry(self, call: Callable[[], Awaitable[TxnReply]],
                     give_up_s: float = RELEASE_RETRY_S) -> TxnReply | None:
        """`call` until the directory answers (backoff 0.2 s doubling to 5 s) or give_up_s."""
        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception_type(DirectoryUnavailable),
            wait=tenacity.wait_exponential(multiplier=0.2, max=5.0),
            stop=tenacity.stop_after_delay(give_up_s), reraise=True)
        try:
            async for attempt in retrying:
                with attempt:
                    return await call()
        except (DirectoryUnavailable, ValueError):
            return None
        return None

    async def release(self, request_id: str, transfer_id: str, generation: int,
                      give_up_s: float = RELEASE_RETRY_S) -> TxnReply | None:
        """PUBLISHED -> RELEASED. Never raises. While the directory is unreachable the
        call is retried (backoff 0.2 s doubling to 5 s) for up to `give_up_s`: a
        published transaction must not stay PUBLISHED because the directory blinked
        as its sequence finished. Past that, this worker's lease expiry or restart
        releases it (the directory's `dpub` index)."""
        return await self._retry(lambda: self.client.release(
            request_id, transfer_id, generation, self.worker_id, self.epoch_fn()), give_up_s)
