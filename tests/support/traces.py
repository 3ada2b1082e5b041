"""Hand-made traces as the local collector writes them (runtime/telemetry/collector.py):
span dicts, one per JSON line, for the trace view's tests (pdctl trace, the HTML page).

DISAGGREGATED (request "req-1") is a request that retried: attempt 1 (generation 1,
transfer x1) lost its prefill source after reserving and computing; attempt 2
(generation 2, transfer x2) published and decoded. Its numbers, in ms from the start:
    decode.reserve x2 ends 14.0, last prefill.compute x2 ends 20.25, decode.publish
    x2 ends 23.125  ->  T_exposed(x2) = 23.125 - max(14.0, 20.25) = 2.875
    decode.first_token ends 25.0; the root lasts 50.0.
One directory server span's parent was never exported: an orphan.
"""

from __future__ import annotations

import json
from pathlib import Path

from pdserve_client import spans as sv

T0_NS = 1_700_000_000_000_000_000
TRACE_A = "a" * 32
TRACE_B = "b" * 32
MISSING_PARENT = "f" * 16
SERVICES = {"router": "pdserve-router", "decode": "pdserve-decode", "prefill": "pdserve-prefill",
            "directory": "pdserve-directory"}


def span(span_id: str, name: str, proc: str, start_ms: float, end_ms: float, parent: str = "", *,
         trace: str = TRACE_A, status: int = 1, events: list | None = None, **attrs) -> dict:
    """One collector line; proc is 'router-0', 'decode-0', ...; attrs use short names
    (request_id, generation, transfer_id, route) mapped onto pd.* keys."""
    role, _, _ = proc.partition("-")
    keys = {"request_id": sv.REQUEST_ID, "generation": sv.GENERATION, "transfer_id": sv.TRANSFER_ID,
            "route": sv.ROUTE, "layer": sv.LAYER, "tenant": sv.TENANT}
    return {"trace_id": trace, "span_id": span_id.ljust(16, "0"), "parent_id": parent.ljust(16, "0") if parent else "",
            "name": name, "service": SERVICES[role], "instance": proc,
            "start_ns": T0_NS + round(start_ms * 1e6), "end_ns": T0_NS + round(end_ms * 1e6), "status": status,
            "attributes": {keys.get(k, k): v for k, v in attrs.items()}, "events": events or []}


def event(name: str, at_ms: float, **attrs) -> dict:
    return {"name": name, "t_ns": T0_NS + round(at_ms * 1e6), "attributes": attrs}


def disaggregated(request_id: str = "req-1", trace: str = TRACE_A) -> list[dict]:
    """The retried disaggregated request described above (20 spans)."""
    r = {"request_id": request_id, "trace": trace}
    a1 = {**r, "generation": 1, "transfer_id": "x1"}
    a2 = {**r, "generation": 2, "transfer_id": "x2"}
    retry = event(sv.EVENT_RETRY, 12.0, **{sv.REASON: "TRANSFER_FAILED: source prefill-0 lost"})
    return [
        span("01", sv.ROUTER_REQUEST, "router-0", 0, 50, route="disaggregated", **r),
        span("02", sv.ROUTER_DECIDE, "router-0", 0.1, 0.3, "01", route="disaggregated", **r),
        span("03", sv.ROUTER_ATTEMPT, "router-0", 0.5, 12, "01", status=2, events=[retry],
             route="disaggregated", **a1),
        span("04", sv.DECODE_RESERVE, "decode-0", 1, 3, "03", **a1),
        span("05", sv.PREFILL_COMPUTE, "prefill-0", 2, 8, "03", **a1),
        span("06", sv.ROUTER_ATTEMPT, "router-0", 12.5, 50, "01", route="disaggregated", **a2),
        span("07", sv.DECODE_RESERVE, "decode-0", 13, 14, "06", **a2),
        span("08", sv.PREFILL_QUEUE, "prefill-1", 13, 13.5, "06", **a2),
        span("09", sv.PREFILL_COMPUTE, "prefill-1", 13.5, 17, "06", **a2),
        span("0a", sv.PREFILL_COMPUTE, "prefill-1", 17, 20.25, "06", **a2),
        span("0b", sv.TRANSFER_SEND, "prefill-1", 15, 21, "06", **a2, **{sv.LAYERS: 1, sv.CHUNKS: 1, sv.BYTES: 4096},
             events=[event(sv.EVENT_LAYER_SENT, 16, **{sv.LAYER: 0, sv.CHUNKS: 1, sv.BYTES: 4096})]),
        span("0c", sv.TRANSFER_RECEIVE, "decode-0", 14, 22, "06", **a2,
             events=[event(sv.EVENT_LAYER_VISIBLE, 21.5, **{sv.LAYER: 0, sv.CHUNKS: 1, sv.BYTES: 4096})]),
        span("0d", sv.DECODE_VALIDATE, "decode-0", 22, 22.5, "06", **a2),
        span("0e", sv.DECODE_PUBLISH, "decode-0", 22.5, 23.125, "06", **a2),
        span("0f", "/pd.v1.Directory/Publish", "directory-0", 22.6, 23.0, MISSING_PARENT, **a2),
        span("10", sv.DECODE_ADMIT, "decode-0", 23.2, 23.4, "06", **a2),
        span("11", sv.DECODE_FIRST_TOKEN, "decode-0", 23.4, 25, "06", **a2),
        span("12", sv.DECODE_GENERATE, "decode-0", 25, 49, "06", **a2),
        span("13", sv.DECODE_RELEASE, "decode-0", 49, 49.5, "06", **a2),
        span("14", sv.TRANSFER_COMMIT, "prefill-1", 21, 21.2, "0b", **a2),
    ]


def colocated(request_id: str = "req-colo", trace: str = TRACE_B) -> list[dict]:
    """A colocated request: one attempt, no transfer, no publish (T_exposed n/a)."""
    r = {"request_id": request_id, "trace": trace, "generation": 1}
    return [
        span("21", sv.ROUTER_REQUEST, "router-0", 0, 30, route="colocated", **r),
        span("22", sv.ROUTER_DECIDE, "router-0", 0.1, 0.2, "21", route="colocated", **r),
        span("23", sv.ROUTER_ATTEMPT, "router-0", 0.3, 30, "21", route="colocated", **r),
        span("24", sv.DECODE_ADMIT, "decode-0", 0.5, 0.6, "23", **r),
        span("25", sv.DECODE_FIRST_TOKEN, "decode-0", 0.6, 8, "23", **r),
        span("26", sv.DECODE_GENERATE, "decode-0", 8, 29, "23", **r),
    ]


def write(path: str | Path, spans: list[dict], mode: str = "w") -> Path:
    """The spans as JSON lines, as the collector appends them."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open(mode) as f:
        f.write("".join(json.dumps(s) + "\n" for s in spans))
    return p
