"""What bench/handoff.py reads from the requests' traces: the per-hop waterfall (`hops`),
the gRPC calls per request (`rpc_counts`), the spans and events per request
(`span_counts`), and the time between two traced steps of a
request, per trace, as medians (`legs`): the legs of the hand-off (`EXTRA_LEGS`: a
colocated request has none; they are on the way to the decode's first token), those of
token 0's way, which a colocated request has too (`SHARED_LEGS`), the decode's tokens held
for the prefill's digest (`HELD_LEG`), and from the compute's end, step by step, the way
to token 0 (`AFTER_COMPUTE`, `after_compute`) and the hand-off (`HANDOFF`). A trace is the
SDK's trace_view view of it: its spans, each with service, name, start_ns, end_ns and
events ({"name", "t_ns"})."""

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
"""The legs between processes of the hand-off, which a colocated request does not make:
from the last traced step of one process to the first of the next (span start or end, or
an event's time), in each trace; then the one-way hops the leg takes. Token 0 leaves from
the prefill as soon as it is sampled: these are on the way to the decode's tokens."""
SHARED_LEGS = {
    "router -> prefill Prefill (colocated: decode Generate)":
        (("router", "router.attempt", "start"), ("prefill", "/pd.v1.Prefill/Prefill", "start"), 1),
    "prefill sends token 0 -> router sends it on (colocated: the decode's)":
        (("prefill", "/pd.v1.Prefill/Prefill@first_token", "at"), ("router", "router.request@first_token", "at"), 1),
}
"""Token 0's legs, which a colocated request has too (to and from its decode worker)."""
AFTER_COMPUTE = (
    ("compute ended", ("prefill", "prefill.compute", "last_end")),  # its last compute chunk
    ("token 0 left the prefill", ("prefill", "/pd.v1.Prefill/Prefill@first_token", "at")),
    ("token 0 left the router", ("router", "router.request@first_token", "at")),
)
"""The disaggregated path from the prefill's compute's end to token 0 leaving the router,
step by step (the `path` row: each segment is the median gap between two consecutive
steps; a colocated request's decode sends its own token 0 the same way)."""
HANDOFF = (
    ("compute ended", ("prefill", "prefill.compute", "last_end")),
    ("first layer sent", ("prefill", "transfer.send@layer.sent", "at")),
    ("last layer visible", ("decode", "transfer.receive@layer.visible", "last_at")),
    ("validation began", ("decode", "decode.validate", "start")),
    ("Publish left", ("decode", "decode.publish", "start")),
    ("published", ("decode", "decode.publish", "end")),
    ("decoding", ("decode", "decode.generate", "start")),
)
"""The hand-off from the prefill's compute's end until the decode decodes (the blocks
imported and the sequence in its batch), step by step (the `handoff_path` row): the way
to token 1, which a colocated request's decode has computed by then."""
HELD_LEG = {"the decode's tokens held for the prefill's digest":
            (("router", "router.attempt@token.held", "at"), ("router", "router.attempt@prefill.done", "at"), 0)}
"""How long the router held the decode's tokens for the Prefill's reply, whose K/V digest
it compares with the decode's before they stream (only where the decode's token 0 came
first without the prefill's seal)."""


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


def after_compute(traces, path=AFTER_COMPUTE) -> tuple[dict[str, tuple[float, int]], tuple[float, int] | None]:
    """The `path` row (`handoff_path` with HANDOFF): the path's segments (median ms, traces)
    and the whole way from its first step to its last (its own median; None without a trace
    holding both)."""
    steps = dict(path)
    segments = legs(traces, {f"{a} -> {b}": (steps[a], steps[b], 0) for (a, _), (b, _) in zip(path, path[1:])})
    whole = legs(traces, {"all": (path[0][1], path[-1][1], 0)})
    return segments, whole.get("all")


def trace_rows(traces: dict, modes, rtt_ms: float, overhead_ms: float, handoff_ms: float | None) -> list[dict]:
    """bench/handoff.py's rows from the traces (`traces`: mode -> traces), none without a
    disaggregated one: `legs` (against half the idle round trip `rtt_ms`), `path` (token
    0's way), `handoff_path`, `held`, then per mode `calls` and `spans`."""
    dis, rows = traces["disaggregated"], []
    if not dis:
        return rows
    handoff = None if handoff_ms is None else round(handoff_ms, 2)
    extra, shared = legs(dis, EXTRA_LEGS), legs(dis, SHARED_LEGS)
    extra_ms = sum(ms for ms, _ in extra.values())
    extra_hops = sum(n for *_, n in EXTRA_LEGS.values())
    rows.append(dict(metric="legs", extra_legs={k: round(ms, 2) for k, (ms, _) in extra.items()},
                     shared_legs={k: round(ms, 2) for k, (ms, _) in shared.items()}, extra_legs_ms=round(extra_ms, 2),
                     one_way_idle_ms=round(rtt_ms / 2, 3), extra_one_way_hops=extra_hops,
                     extra_legs_over_idle=round(extra_ms / (extra_hops * rtt_ms / 2), 2), handoff_overhead_ms=handoff,
                     traces=min((n for _, n in extra.values()), default=0)))
    for metric, path, whole_key, against in (("path", AFTER_COMPUTE, "compute_end_to_token_0_ms",
                                              {"overhead_ms": round(overhead_ms, 2)}),
                                             ("handoff_path", HANDOFF, "compute_end_to_decoding_ms",
                                              {"handoff_overhead_ms": handoff})):
        segments, whole = after_compute(dis, path)
        if whole is not None:
            rows.append({"metric": metric, "after_compute": {k: round(ms, 2) for k, (ms, _) in segments.items()},
                         whole_key: round(whole[0], 2), **against, "traces": whole[1]})
    (held_ms, n_held), = legs(dis, HELD_LEG).values() or [(0.0, 0)]
    rows.append(dict(metric="held", leg=next(iter(HELD_LEG)), held_median_ms=round(held_ms, 2), traces_held=n_held,
                     traces=len(dis), overhead_ms=round(overhead_ms, 2)))
    for mode in modes:
        per_trace = rpc_counts(traces[mode])
        rows.append(dict(metric="calls", mode=mode, per_request={k: round(v, 2) for k, v in per_trace.items()},
                         total=round(sum(per_trace.values()), 2), traces=len(traces[mode])))
        by_service, events = span_counts(traces[mode])
        rows.append(dict(metric="spans", mode=mode, per_request={k: round(v, 2) for k, v in by_service.items()},
                         total=round(sum(by_service.values()), 2), events_per_request=round(events, 2),
                         traces=len(traces[mode])))
    return rows
