"""The prefill side's spans of a hand-off (docs/observability.md; names in pdserve_client/spans.py).

The hot path only notes wall-clock times (the engine loop's per-chunk times are on the
Job; a chunk's send here); the spans are built once the transfer is committed, under
the Prefill RPC's context, after its reply left, so tracing adds no await and no lock to
computing, sending or the reply:

    prefill.queue      submitted to the engine loop -> its first compute chunk starts
    prefill.compute    one per compute chunk
    transfer.send      the first chunk handed to the transport -> the last one sent;
                       pd.layers, pd.chunks, pd.bytes, and an event layer.sent {pd.layer,
                       pd.chunks, pd.bytes} per layer when its last chunk left: one span
                       and L events per hand-off, whatever the model's depth or the
                       prompt's length (a span per layer was 32-80 per request on real
                       models)
    transfer.commit    live (it carries the context to the destination in the commit)
"""

from __future__ import annotations

import asyncio
import time

from pdserve_client import spans as S
from runtime.telemetry import tracing
from runtime.telemetry.layer_tally import LayerTally
from runtime.worker.loop import Job


class PrefillTrace:
    """Times of one prefill's work, turned into spans at the end (nothing while off)."""

    __slots__ = ("on", "first_ns", "last_ns", "layers")

    def __init__(self):
        self.on = tracing.enabled()
        self.first_ns = self.last_ns = 0
        """The first chunk handed to the transport; the last one sent."""
        self.layers = LayerTally()
        """Chunks and bytes sent per layer, and when its last chunk left."""

    def sent(self, layer: int, nbytes: int, start_ns: int) -> None:
        """A chunk of `layer` left (it was handed to the transport at start_ns)."""
        if self.on:
            end = time.time_ns()
            if not self.layers:
                self.first_ns = start_ns
            self.last_ns = end
            self.layers.add(layer, nbytes, end)

    def computed(self, job: Job) -> None:
        """The queue and compute spans of `job` (its chunks are done)."""
        if not self.on or not job.chunks_ns:
            return
        tracing.past_span(S.PREFILL_QUEUE, job.submitted_ns, job.chunks_ns[0][0])
        for i, (start, end) in enumerate(job.chunks_ns):
            tracing.past_span(S.PREFILL_COMPUTE, start, end, attributes={"pd.chunk": i})

    def ended(self, job: Job) -> None:
        """Every span of the prefill's work, built after the reply (`call_soon`: the router
        holds the decode's tokens for the reply, not for these)."""
        if self.on:
            asyncio.get_running_loop().call_soon(self._build, job)  # in the Prefill call's context

    def _build(self, job: Job) -> None:
        self.computed(job)
        self.transferred()

    def transferred(self) -> None:
        """The transfer.send span: one layer.sent event per layer, in the order they left."""
        if self.layers:
            tracing.past_span(S.TRANSFER_SEND, self.first_ns, self.last_ns, attributes=self.layers.totals(),
                              events=self.layers.events(S.EVENT_LAYER_SENT))
