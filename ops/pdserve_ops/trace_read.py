"""Reading the local collector's span file (docs/observability.md): its lines as Spans, and the
trace(s) of one request. Standard library only, like all of pdserve_client.

The collector writes one span per line (runtime/telemetry/collector.py); the spans of
one trace come in batches from several processes, in any order, so the file is read
whole and joined here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pdserve_client import spans as sv

REASON_EVENTS = (sv.EVENT_RETRY, sv.EVENT_FALLBACK, sv.EVENT_REJECTED, sv.EVENT_CAPABILITY_DENIED)
"""Events whose pd.reason a row and an attempt's outcome show."""
NS_PER_MS = 1e6


@dataclass(frozen=True, slots=True)
class Span:
    """One span as the collector wrote it (ids in hex; parent_id '' for a root)."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    service: str
    instance: str
    start_ns: int
    end_ns: int
    status: int
    attributes: dict
    events: tuple

    @classmethod
    def from_dict(cls, d: dict) -> Span:
        """A Span from one decoded line; ValueError/TypeError/KeyError if it is not one."""
        span = cls(str(d["trace_id"]), str(d["span_id"]), str(d.get("parent_id") or ""), str(d["name"]),
                   str(d.get("service", "")), str(d.get("instance", "")), int(d["start_ns"]), int(d["end_ns"]),
                   int(d.get("status", 0)), dict(d.get("attributes") or {}),
                   tuple(dict(e) for e in d.get("events") or ()))
        if not span.trace_id or not span.span_id:
            raise ValueError("a span needs a trace_id and a span_id")
        return span

    @property
    def request_id(self) -> str:
        return str(self.attributes.get(sv.REQUEST_ID, ""))

    def reasons(self) -> list[str]:
        """'retry: why' for each retry/fallback/rejected/capability.denied event."""
        out = []
        for e in self.events:
            if e.get("name") in REASON_EVENTS:
                reason = (e.get("attributes") or {}).get(sv.REASON, "")
                out.append(f"{e['name']}: {reason}" if reason else e["name"])
        return out


@dataclass(frozen=True, slots=True)
class Trace:
    """Every recorded span of one trace id, by start."""

    trace_id: str
    spans: tuple[Span, ...]

    @property
    def start_ns(self) -> int:
        return min(s.start_ns for s in self.spans)

    @property
    def end_ns(self) -> int:
        return max(s.end_ns for s in self.spans)


def order(s: Span) -> tuple:
    """Display order of siblings: by start, the longer first."""
    return (s.start_ns, -s.end_ns, s.name, s.span_id)


def ms(ns: int) -> float:
    """Nanoseconds as milliseconds, to the microsecond."""
    return round(ns / NS_PER_MS, 3)


def parse(lines: Iterable[str]) -> tuple[list[Span], int]:
    """(spans, malformed line count); a span seen twice (same trace and span id) counts once."""
    spans: dict[tuple[str, str], Span] = {}
    malformed = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            span = Span.from_dict(json.loads(line))
        except (ValueError, TypeError, KeyError, AttributeError):
            malformed += 1
            continue
        spans.setdefault((span.trace_id, span.span_id), span)
    return list(spans.values()), malformed


def load(path: str | Path) -> tuple[list[Span], int]:
    """Every span in the collector's file (none if it does not exist yet), and how many
    lines were not spans (a line being written as we read counts until it is complete)."""
    p = Path(path)
    if not p.exists():
        return [], 0
    with p.open(encoding="utf-8", errors="replace") as f:
        return parse(f)


def find(spans: Sequence[Span], request_id: str) -> list[Trace]:
    """The traces holding a span with pd.request_id == request_id, all their spans each,
    oldest first. More than one when the request ran as several traces."""
    ids = {s.trace_id for s in spans if s.request_id == request_id}
    by_trace: dict[str, list[Span]] = {t: [] for t in ids}
    for s in spans:
        if s.trace_id in by_trace:
            by_trace[s.trace_id].append(s)
    traces = [Trace(t, tuple(sorted(group, key=order))) for t, group in by_trace.items()]
    return sorted(traces, key=lambda t: (t.start_ns, t.trace_id))


def _names(traces: Iterable[Trace]) -> set[str]:
    """Every span's name in `traces`, bare and as "service:name"."""
    return {n for t in traces for s in t.spans for n in (s.name, f"{s.service}:{s.name}")}


def wait_for(path: str | Path, request_id: str, wait_s: float = 10.0, settle_s: float = 0.5,
             poll_s: float = 0.1, expect: Collection[str] = ()) -> tuple[list[Trace], int]:
    """find() over the file, waiting up to wait_s for the request's trace to be whole:
    its router.request span is in (it is exported once the request ended), so is a span
    named each of `expect` (a name, or "service:name" for that process's span), and the
    span count has not changed for settle_s (other processes' batches come on their own
    schedule: a caller that knows which spans a process owes names them in `expect`
    rather than trusting the settle). Returns what there is at the deadline, and the
    file's malformed lines."""
    found, malformed = wait_for_each(path, [request_id], wait_s, settle_s, poll_s, expect)
    return found[request_id], malformed


def wait_for_each(path: str | Path, request_ids: Sequence[str], wait_s: float = 10.0, settle_s: float = 0.5,
                  poll_s: float = 0.1, expect: Collection[str] = ()) -> tuple[dict[str, list[Trace]], int]:
    """wait_for over several requests at once (one read of the file per poll, one settle
    for all): {request id: its traces} once every one ended, holds a span named each of
    `expect`, and none of their spans changed for settle_s, or what there is at the
    deadline; and the file's malformed lines."""
    wanted = {sv.ROUTER_REQUEST, *expect}
    deadline = time.monotonic() + wait_s
    stable_since, count = time.monotonic(), -1
    while True:
        spans, malformed = load(path)
        found = {rid: find(spans, rid) for rid in request_ids}
        n = sum(len(t.spans) for traces in found.values() for t in traces)
        if n != count:
            stable_since, count = time.monotonic(), n
        ended = all(wanted <= _names(traces) for traces in found.values())
        if (ended and time.monotonic() - stable_since >= settle_s) or time.monotonic() >= deadline:
            return found, malformed
        time.sleep(poll_s)
