"""What bench/handoff.py reads from the requests' traces: the per-hop waterfall (`hops`),
the gRPC calls per request (`rpc_counts`), the spans and events per request
(`span_counts`), and the time between two traced steps of a
request, per trace, as medians (`legs`): the legs a disaggregated request adds
(`EXTRA_LEGS`), those a colocated one has too (`SHARED_LEGS`), token 0 held for the
prefill's digest (`HELD_LEG`), and the path from the compute's end to token 0, step by
step (`AFTER_COMPUTE`, `after_compute`). A trace is the SDK's trace_view view of it: its
spans, each with service, name, start_ns, end_ns and events ({"name", "t_ns"})."""

from __future__ import annotations

import statistics
from collections import defaultdict

EXTRA_LEGS = {
    "decode Reserve -> router -> prefill's grant (2 one-way hops)":
        (("decode", "/pd.v1.Decode/Reserve", "end"), ("prefill", "/pd.v1.Prefill/Prefill@granted", "at"), 2),
    "prefill layer sent -> decode layer visible (data plane)":
        (("prefill", "transfer.send@layer.sent", "at"), ("decode", "transfer.receive@layer.visible", "at"), 1),
    "decode -> directory Publish":
        (("decode", "decode.publish", "start"), ("directory", "/pd.v1.Directory/Publish", "start"), 1),
    "directory Publish -> decode":
        (("directory", "/pd.v1.Directory/Publish", "last_end"), ("decode", "decode.publish", "end"), 1),
}
"""The legs between processes a disaggregated request adds to a colocated one's path (both
go router -> decode and decode -> router): from the last traced step of one process to the
first of the next (span start or end, or an event's time), in each trace; then the one-way
hops the leg takes."""
SHARED_LEGS = {
    "router -> decode Reserve (colocated: Generate)":
        (("router", "router.attempt", "start"), ("decode", "/pd.v1.Decode/Reserve", "start"), 1),
    "decode publish done -> router sends token 0":
        (("decode", "decode.publish", "end"), ("router", "router.request@first_token", "at"), 1),
}
"""Legs a colocated request has too (its Generate instead of the Reserve; its own token)."""
AFTER_COMPUTE = (
    ("compute ended", ("prefill", "prefill.compute", "last_end")),  # its last compute chunk
    ("first layer sent", ("prefill", "transfer.send@layer.sent", "at")),
    ("last layer visible", ("decode", "transfer.receive@layer.visible", "last_at")),
    ("validation began", ("decode", "decode.validate", "start")),
    ("Publish left", ("decode", "decode.publish", "start")),
    ("published", ("decode", "decode.publish", "end")),
    ("token 0 left the router", ("router", "router.request@first_token", "at")),
)
"""The disaggregated path from the prefill's compute's end to token 0 leaving the router,
step by step (the `path` row: each segment is the median gap between two consecutive
steps; what a colocated request pays after its compute is the last segment's like)."""
HELD_LEG = {"token 0 held for the prefill's digest":
            (("router", "router.attempt@token.held", "at"), ("router", "router.attempt@prefill.done", "at"), 0)}
"""How long the router held the decode's token 0 for the Prefill's reply, whose K/V digest
it compares with the decode's before anything streams (only where token 0 came first)."""


def hops(traces) -> dict[str, tuple[float, float, int]]:
    """span key -> (median start offset ms, median duration ms, traces holding it); a span's
    events as "service/span@event" (duration 0)."""
    offsets, durations = defaultdict(list), defaultdict(list)
    for trace in traces:
        roots = [s for s in trace.spans if not s.parent_id]
        if len(roots) != 1:
            continue
        t0 = roots[0].start_ns
        firsts: dict[str, object] = {}
        for s in sorted(trace.spans, key=lambda s: s.start_ns):
            firsts.setdefault(f"{s.service.removeprefix('pdserve-')}/{s.name}", s)
            for e in s.events:  # e.g. the router's first_token: when token 0 left for the client
                if isinstance(e.get("t_ns"), int):
                    firsts.setdefault(f"{s.service.removeprefix('pdserve-')}/{s.name}@{e.get('name')}", e)
        for key, s in firsts.items():
            if isinstance(s, dict):
                offsets[key].append((s["t_ns"] - t0) / 1e6)
                durations[key].append(0.0)
                continue
            offsets[key].append((s.start_ns - t0) / 1e6)
            durations[key].append((s.end_ns - s.start_ns) / 1e6)
    return {k: (statistics.median(offsets[k]), statistics.median(durations[k]), len(offsets[k])) for k in offsets}


def rpc_counts(traces) -> dict[str, float]:
    """"service/method" -> server spans of that gRPC method per trace (mean): the calls a
    request made, asked-again ones included."""
    counts: dict[str, int] = defaultdict(int)
    for trace in traces:
        for s in trace.spans:
            if s.name.startswith("/pd.v1."):
                counts[f"{s.service.removeprefix('pdserve-')}/{s.name.rsplit('/', 1)[-1]}"] += 1
    return {k: counts[k] / len(traces) for k in sorted(counts)} if traces else {}


def span_counts(traces) -> tuple[dict[str, float], float]:
    """(service -> spans per trace, events per trace), means: what tracing a request makes,
    exports and stores."""
    spans: dict[str, int] = defaultdict(int)
    events = 0
    for trace in traces:
        for s in trace.spans:
            spans[s.service.removeprefix("pdserve-")] += 1
            events += len(s.events)
    if not traces:
        return {}, 0.0
    return {k: spans[k] / len(traces) for k in sorted(spans)}, events / len(traces)


def edge(trace, service: str, name: str, which: str) -> int | None:
    """When a step happened in `trace` (ns): the first span `name` of `service` (its start or
    end; "last_end": the last such span's end), or an event "span@event" (its first, "at",
    or its last, "last_at")."""
    span_name, _, event = name.partition("@")
    spans = sorted((s for s in trace.spans if s.service == f"pdserve-{service}" and s.name == span_name),
                   key=lambda s: s.start_ns)
    if not spans:
        return None
    if which in ("at", "last_at"):
        times = [e["t_ns"] for s in spans for e in s.events
                 if e.get("name") == event and isinstance(e.get("t_ns"), int)]
        return (min(times) if which == "at" else max(times)) if times else None
    return spans[-1].end_ns if which == "last_end" else spans[0].end_ns if which == "end" else spans[0].start_ns


def legs(traces, table: dict) -> dict[str, tuple[float, int]]:
    """leg -> (median ms from its first step to its second, traces holding both)."""
    out = {}
    for leg, (a, b, _hops) in table.items():
        ms = [(tb - ta) / 1e6 for t in traces
              if (ta := edge(t, *a)) is not None and (tb := edge(t, *b)) is not None]
        if ms:
            out[leg] = (statistics.median(ms), len(ms))
    return out


def after_compute(traces) -> tuple[dict[str, tuple[float, int]], tuple[float, int] | None]:
    """The `path` row: AFTER_COMPUTE's segments (median ms, traces) and the whole way from
    the compute's end to token 0 (its own median; None without a trace holding both)."""
    steps = dict(AFTER_COMPUTE)
    segments = legs(traces, {f"{a} -> {b}": (steps[a], steps[b], 0)
                             for (a, _), (b, _) in zip(AFTER_COMPUTE, AFTER_COMPUTE[1:])})
    whole = legs(traces, {"all": (AFTER_COMPUTE[0][1], AFTER_COMPUTE[-1][1], 0)})
    return segments, whole.get("all")
