"""The numbers above a trace's waterfall (docs/observability.md): route, attempts, first token, and
T_exposed per transfer exactly as client/pdserve_client/spans.py defines it.
Standard library only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdserve_client import spans as sv
from pdserve_ops.trace_read import Span, Trace, ms, order


@dataclass(frozen=True, slots=True)
class Attempt:
    """One router.attempt: its generation, route, transfer id and how it ended."""

    generation: object
    route: str
    transfer_id: str
    outcome: str  # ok | error
    reasons: tuple[str, ...]
    offset_ms: float
    duration_ms: float


@dataclass(frozen=True, slots=True)
class Exposure:
    """T_exposed of one transfer (spans.py): max(0, publish_end - decode_ready), where
    decode_ready = max(end of decode.reserve, end of the last prefill.compute) and
    publish_end = end of decode.publish, or the start of decode.admit when the publication
    came before decode_ready (a commit ahead of the first token).
    t_exposed_ms is None when a piece is missing (named in `missing`)."""

    transfer_id: str
    generation: object
    t_exposed_ms: float | None
    publish_end_ms: float | None
    decode_ready_ms: float | None
    missing: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Summary:
    """The numbers above the waterfall; times in ms from the trace start."""

    trace_id: str
    request_id: str
    total_ms: float
    route: str
    attempts: tuple[Attempt, ...]
    first_token_ms: float | None
    transfers: tuple[Exposure, ...]
    t_exposed_ms: float | None  # of the last transfer that has one
    processes: int
    spans: int
    orphans: int
    errors: int


def _named(trace: Trace, name: str) -> list[Span]:
    return [s for s in trace.spans if s.name == name]


def summarize(trace: Trace, orphans: int = 0) -> Summary:
    """Total, route, attempts, first token, T_exposed per transfer, processes, orphans."""
    t0 = trace.start_ns
    attempts = tuple(
        Attempt(a.attributes.get(sv.GENERATION), str(a.attributes.get(sv.ROUTE, "")),
                str(a.attributes.get(sv.TRANSFER_ID, "")), "error" if a.status == 2 else "ok",
                tuple(a.reasons()), ms(a.start_ns - t0), ms(a.end_ns - a.start_ns))
        for a in _named(trace, sv.ROUTER_ATTEMPT))
    transfers = exposures(trace)
    exposed = [x.t_exposed_ms for x in transfers if x.t_exposed_ms is not None]
    request_ids = [s.request_id for s in trace.spans if s.request_id]
    return Summary(
        trace_id=trace.trace_id, request_id=request_ids[0] if request_ids else "",
        total_ms=ms(trace.end_ns - t0), route=_route(trace, attempts), attempts=attempts,
        first_token_ms=_first_tokenms(trace), transfers=transfers,
        t_exposed_ms=exposed[-1] if exposed else None,
        processes=len({(s.service, s.instance) for s in trace.spans}), spans=len(trace.spans),
        orphans=orphans, errors=sum(s.status == 2 for s in trace.spans))


def _route(trace: Trace, attempts: Sequence[Attempt]) -> str:
    """The route the request ended on: the router.request's, else the last attempt's,
    else the decision's."""
    for s in _named(trace, sv.ROUTER_REQUEST):
        if s.attributes.get(sv.ROUTE):
            return str(s.attributes[sv.ROUTE])
    if attempts and attempts[-1].route:
        return attempts[-1].route
    for s in _named(trace, sv.ROUTER_DECIDE):
        if s.attributes.get(sv.ROUTE):
            return str(s.attributes[sv.ROUTE])
    return "n/a"


def _first_tokenms(trace: Trace) -> float | None:
    """When the first token came out of decode (end of decode.first_token), else the
    earliest first_token event any span recorded."""
    ends = [s.end_ns for s in _named(trace, sv.DECODE_FIRST_TOKEN)]
    if not ends:
        ends = [int(e["t_ns"]) for s in trace.spans for e in s.events
                if e.get("name") == sv.EVENT_FIRST_TOKEN and isinstance(e.get("t_ns"), int)]
    return ms(min(ends) - trace.start_ns) if ends else None


def exposures(trace: Trace) -> tuple[Exposure, ...]:
    """T_exposed for every transfer of the trace: each transfer id an attempt or a
    decode.publish names, in order; spans without a transfer id join the transfer of
    their generation, or the only transfer. A colocated trace has none."""
    keys: dict[str, object] = {}
    for s in sorted(_named(trace, sv.ROUTER_ATTEMPT) + _named(trace, sv.DECODE_PUBLISH), key=order):
        keys.setdefault(str(s.attributes.get(sv.TRANSFER_ID, "")), s.attributes.get(sv.GENERATION))
    keys = {k: g for k, g in keys.items() if k} or ({"": None} if _named(trace, sv.DECODE_PUBLISH) else {})
    only = len(keys) == 1
    out = []
    for tid, generation in keys.items():
        publish, reserve, compute = (_ends(trace, name, tid, generation, only)
                                     for name in (sv.DECODE_PUBLISH, sv.DECODE_RESERVE, sv.PREFILL_COMPUTE))
        missing = tuple(n for n, e in ((sv.DECODE_PUBLISH, publish), (sv.DECODE_RESERVE, reserve),
                                       (sv.PREFILL_COMPUTE, compute)) if not e)
        ready = max(max(reserve), max(compute)) if reserve and compute else None
        publish_end = max(publish) if publish else None
        admits = [s.start_ns for s in _spans(trace, sv.DECODE_ADMIT, tid, generation, only)]
        if publish_end is not None and ready is not None and publish_end < ready and admits:
            publish_end = max(admits)  # published ahead of its first token: the decode waited for it
        t_exposed = None if missing else ms(max(0, publish_end - ready))
        out.append(Exposure(tid, generation, t_exposed,
                            None if publish_end is None else ms(publish_end - trace.start_ns),
                            None if ready is None else ms(ready - trace.start_ns), missing))
    return tuple(out)


def _ends(trace: Trace, name: str, transfer_id: str, generation: object, only: bool) -> list[int]:
    """End times of the `name` spans of one transfer (`_spans`)."""
    return [s.end_ns for s in _spans(trace, name, transfer_id, generation, only)]


def _spans(trace: Trace, name: str, transfer_id: str, generation: object, only: bool) -> list[Span]:
    """The `name` spans of one transfer: those naming its id; else those with no id but
    its generation; else, when it is the trace's only transfer, all without an id."""
    group = _named(trace, name)
    mine = [s for s in group if str(s.attributes.get(sv.TRANSFER_ID, "")) == transfer_id]
    if not mine:
        loose = [s for s in group if not s.attributes.get(sv.TRANSFER_ID)]
        mine = [s for s in loose if generation is not None and s.attributes.get(sv.GENERATION) == generation]
        mine = mine or (loose if only else [])
    return mine
