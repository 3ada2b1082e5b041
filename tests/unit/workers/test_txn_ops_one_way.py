"""The protocol is one-way (docs/design.md): the decode publishes once the router's
DecodeStream came, which leaves after the directory recorded the transaction, so a Publish
that finds no record has its answer (NOT_FOUND, asked once). The one wait left is between
the two ends: an unsealed Publish waits, bounded, for a source's declaring Begin."""

from __future__ import annotations

import asyncio
import time

from runtime.directory.client import TxnReply
from runtime.directory.states import Outcome, TxnState
from runtime.worker.directory_ops import TxnOps


class Publisher:
    """Publish answers ILLEGAL_TRANSITION with the transaction RESERVED (an unsealed source's Begin
    not landed yet) `reserved_for` times, then APPLIED (None: always RESERVED); `unrecorded`
    times NOT_FOUND before that (a transaction the directory does not hold)."""

    def __init__(self, reserved_for: int | None, other: Outcome | None = None, unrecorded: int = 0):
        self.reserved_for, self.other, self.unrecorded, self.calls = reserved_for, other, unrecorded, 0

    async def publish(self, request_id, transfer_id, generation, worker_id, epoch, kv_digest, chunks, source_seal=b""):
        self.calls += 1
        if self.other is not None:
            return TxnReply(request_id, transfer_id, self.other, TxnState.TRANSFERRING, generation)
        if self.calls <= self.unrecorded:
            return TxnReply(request_id, transfer_id, Outcome.NOT_FOUND, None, 0)
        if self.reserved_for is None or self.calls - self.unrecorded <= self.reserved_for:
            return TxnReply(request_id, transfer_id, Outcome.ILLEGAL_TRANSITION, TxnState.RESERVED, generation)
        return TxnReply(request_id, transfer_id, Outcome.APPLIED, TxnState.PUBLISHED, generation)


def test_publish_waits_for_the_sources_begin_on_its_way():
    directory = Publisher(reserved_for=2)
    r = asyncio.run(TxnOps(directory, "d0", lambda: 3).publish("r", "r/1", 1, "ab"))
    assert (r.outcome, r.state, directory.calls) == (Outcome.APPLIED, TxnState.PUBLISHED, 3)


def test_publish_gives_up_on_a_begin_that_never_comes():
    directory = Publisher(reserved_for=None)
    t0 = time.monotonic()
    r = asyncio.run(TxnOps(directory, "d0", lambda: 3).publish("r", "r/1", 1, "ab", wait_s=0.2))
    assert (r.outcome, r.state) == (Outcome.ILLEGAL_TRANSITION, TxnState.RESERVED) and directory.calls > 2
    assert 0.2 <= time.monotonic() - t0 < 5.0


def test_publish_answers_a_refusal_in_any_other_state_at_once():
    for outcome in (Outcome.CHECKSUM_CONFLICT, Outcome.ILLEGAL_TRANSITION):
        directory = Publisher(reserved_for=None, other=outcome)
        r = asyncio.run(TxnOps(directory, "d0", lambda: 3).publish("r", "r/1", 1, "ab"))
        assert (r.outcome, directory.calls) == (outcome, 1)


def test_publish_takes_not_found_as_the_answer():
    """A sealed Publish or an unsealed one: a transaction the directory does not hold was
    given up (the router records it before the grant), not on its way."""
    for seal in (b"s", b""):
        directory = Publisher(reserved_for=0, unrecorded=3)
        r = asyncio.run(TxnOps(directory, "d0", lambda: 3).publish("r", "r/1", 1, "ab", source_seal=seal))
        assert (r.outcome, directory.calls) == (Outcome.NOT_FOUND, 1)
