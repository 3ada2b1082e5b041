"""The decode side's spans of a hand-off (docs/observability.md; names in pdserve_client/spans.py).

A reservation outlives the Reserve RPC that made it: its trace keeps that RPC's context
and, once the commit arrives, the commit's (the source's transfer.commit span, carried
on the data plane), under which the rest happens:

    decode.reserve      (Reserve RPC) blocks allocated, receiver expecting
    transfer.receive    reservation ready -> commit received; a layer.visible event per
                        layer {pd.layer, pd.chunks, pd.bytes} when its last chunk landed
                        (and capability.denied, a sender refused)
    decode.validate     commit checks, K/V digest, directory VALIDATED      (live)
    decode.publish      directory PUBLISHED                                 (live)
    decode.admit        imported into the batch, token 0 out                (live)
    decode.generate     admitted -> the sequence finished
    decode.release      directory RELEASED                                  (live)

Spans over work already done are built from noted times (no await added); live ones
wrap directory calls so those RPCs join the trace. transfer.receive is built once token 0
has left (`flush`, from the admission), not on the path from the commit to publication.
"""

from __future__ import annotations

import time

from pdserve_client import spans as S
from runtime.telemetry import tracing
from runtime.telemetry.layer_tally import LayerTally


class ReservationTrace:
    """One reservation's trace context and noted times (inert while tracing is off)."""

    __slots__ = ("on", "context", "ready_ns", "events", "layers", "admitted_ns", "_received", "_committed")

    def __init__(self, reserve_start_ns: int):
        self.on = tracing.enabled()
        self.context = tracing.current_context()
        self.ready_ns = time.time_ns()
        self.events: list[tuple[str, int, dict]] = []
        """Events other than the layers' (capability.denied)."""
        self.layers = LayerTally()
        """Chunks and bytes visible per layer, and when its last chunk landed."""
        self.admitted_ns = 0
        self._received: tuple | None = None  # transfer.receive's end, parent and events noted, not built yet
        self._committed = False  # the commit came: transfer.receive ends there
        if self.on and reserve_start_ns:  # 0: made outside Reserve (tests)
            tracing.past_span(S.DECODE_RESERVE, reserve_start_ns, self.ready_ns, self.context)

    def chunk_visible(self, layer: int, nbytes: int) -> None:
        """A chunk's bytes are in place (counted into its layer's event)."""
        if self.on:
            self.layers.add(layer, nbytes, time.time_ns())

    def _events(self, noted: int | None = None) -> list[tuple[str, int, dict]]:
        """transfer.receive's events in time order: a layer.visible per layer, the rest as
        noted (the first `noted` of them)."""
        return sorted(self.layers.events(S.EVENT_LAYER_VISIBLE) + self.events[:noted],
                      key=lambda e: (e[1], e[2].get(S.LAYER, -1)))

    def denied(self, reason: str) -> None:
        """A sender's capability was refused (the reservation goes on waiting)."""
        if self.on:
            self.events.append((S.EVENT_CAPABILITY_DENIED, time.time_ns(), {S.REASON: reason}))

    def committed(self, headers: tuple[tuple[str, str], ...]) -> None:
        """The commit arrived: the receive span ends (built by `flush`, its events too: every
        chunk is in); what follows is under the commit's context (the reservation's own when
        the commit carries none)."""
        if self.on:
            self._received, self._committed = (time.time_ns(), self.context, len(self.events)), True
            self.context = tracing.extract(dict(headers)) or self.context

    def flush(self, error: str = "") -> None:
        """Build transfer.receive, if its end was noted and it is not built yet (`error`:
        the hand-off failed after its commit, before publication)."""
        if self._received is not None:
            (end_ns, parent, noted), self._received = self._received, None
            tracing.past_span(S.TRANSFER_RECEIVE, self.ready_ns, end_ns, parent, events=self._events(noted),
                              error=error)

    def ended(self, error: str = "") -> None:
        """Decoding finished (or the reservation ended before publication: `error`). One
        transfer.receive per reservation: ending at the commit when one came, at the
        failure otherwise."""
        if not self.on:
            return
        if self.admitted_ns:
            self.flush()
            tracing.past_span(S.DECODE_GENERATE, self.admitted_ns, time.time_ns(), self.context,
                              error=error)
        elif self._committed:
            self.flush(error)
        elif error:
            tracing.past_span(S.TRANSFER_RECEIVE, self.ready_ns, time.time_ns(), self.context,
                              events=self._events(), error=error)
