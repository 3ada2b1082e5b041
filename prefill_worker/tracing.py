"""The prefill side's spans of a hand-off (issue 18; names in pdserve_client/spans.py).

The hot path only notes wall-clock times (the engine loop's per-chunk times are on the
Job; a chunk's send here); the spans are built once the transfer is committed, under
the Prefill RPC's context, after its reply left, so tracing adds no await and no lock to
computing, sending or the reply:

    prefill.queue      submitted to the engine loop -> its first compute chunk starts
    prefill.compute    one per compute chunk
    transfer.layer     one per layer: its first chunk handed to the transport -> its
                       last one sent; an event chunk.sent {pd.layer, pd.bytes} per chunk
    transfer.commit    live (it carries the context to the destination in the commit)
"""

from __future__ import annotations

import asyncio
import time

from pdserve_client import spans as S
from services.telemetry import tracing
from services.worker.loop import Job


class PrefillTrace:
    """Times of one prefill's work, turned into spans at the end (nothing while off)."""

    __slots__ = ("on", "layers")

    def __init__(self):
        self.on = tracing.enabled()
        self.layers: dict[int, list] = {}
        """layer -> [first send start ns, last send end ns, chunk.sent events]."""

    def sent(self, layer: int, nbytes: int, start_ns: int) -> None:
        """A chunk of `layer` left (it was handed to the transport at start_ns)."""
        if self.on:
            end = time.time_ns()
            entry = self.layers.setdefault(layer, [start_ns, end, []])
            entry[1] = end
            entry[2].append((S.EVENT_CHUNK_SENT, end, {S.LAYER: layer, S.BYTES: nbytes}))

    def computed(self, job: Job) -> None:
        """The queue and compute spans of `job` (its chunks are done)."""
        if not self.on or not job.chunks_ns:
            return
        tracing.past_span(S.PREFILL_QUEUE, job.submitted_ns, job.chunks_ns[0][0])
        for i, (start, end) in enumerate(job.chunks_ns):
            tracing.past_span(S.PREFILL_COMPUTE, start, end, attributes={"pd.chunk": i})

    def ended(self, job: Job) -> None:
        """Every span of the prefill's work, built after the reply (`call_soon`: the router
        holds token 0 for the reply, not for these)."""
        if self.on:
            asyncio.get_running_loop().call_soon(self._build, job)  # in the Prefill call's context

    def _build(self, job: Job) -> None:
        self.computed(job)
        self.transferred()

    def transferred(self) -> None:
        """One transfer.layer span per layer sent."""
        for layer, (start, end, events) in sorted(self.layers.items()):
            tracing.past_span(S.TRANSFER_LAYER, start, end, attributes={S.LAYER: layer}, events=events)
