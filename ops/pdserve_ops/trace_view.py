"""The trace of one request, read back from the local collector's span file
(docs/observability.md): what `pdctl trace` shows. Standard library only (the client
distribution installs without the server, and without OpenTelemetry).

    spans, malformed = load(path)          every well-formed line of the JSONL file
    traces = find(spans, request_id)       the trace(s) holding a span of that request
    view = waterfall(traces[0])            rows (a tree by parent, by start) + summary
    render_text(view)                      the terminal table; trace_html.render_html(...)

Reading is trace_read.py, the summary (attempts, T_exposed) trace_summary.py, the page
trace_html.py; this module lays the tree out. The vocabulary (names, attributes,
T_exposed) is spans.py's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pdserve_client import spans as sv
from pdserve_ops.trace_read import Span, Trace, find, load, ms, order, parse, wait_for, wait_for_each
from pdserve_ops.trace_summary import Summary, summarize

__all__ = ["Row", "Span", "Trace", "View", "find", "load", "parse", "render_text", "summary_lines", "wait_for",
           "wait_for_each", "waterfall"]

STATUS_NAMES = {0: "unset", 1: "ok", 2: "error"}
"""OTLP status codes as the collector records them."""
KEY_ATTRIBUTES = (sv.ROUTE, sv.GENERATION, sv.TRANSFER_ID, sv.LAYERS, sv.BYTES, sv.PREFILL_WORKER, sv.DECODE_WORKER)
"""Attributes shown on a waterfall row (the full set is in --json and the HTML details)."""


@dataclass(frozen=True, slots=True)
class Row:
    """One waterfall line: a span at its depth in the tree, times relative to the trace start."""

    span: Span
    depth: int
    orphan: bool  # its parent is not in the trace (lost, or not exported yet)
    offset_ms: float
    duration_ms: float

    @property
    def status(self) -> str:
        return STATUS_NAMES.get(self.span.status, str(self.span.status))

    def key_attributes(self) -> dict:
        return {k: self.span.attributes[k] for k in KEY_ATTRIBUTES if k in self.span.attributes}


@dataclass(frozen=True, slots=True)
class View:
    """A trace laid out: waterfall rows in display order, and its summary."""

    summary: Summary
    rows: tuple[Row, ...]
    malformed_lines: int = 0

    def to_dict(self) -> dict:
        """Plain JSON-able form (pdctl trace --json)."""
        s = self.summary
        return {
            "trace_id": s.trace_id, "request_id": s.request_id, "total_ms": s.total_ms, "route": s.route,
            "first_token_ms": s.first_token_ms, "t_exposed_ms": s.t_exposed_ms, "processes": s.processes,
            "spans": s.spans, "orphans": s.orphans, "errors": s.errors, "malformed_lines": self.malformed_lines,
            "attempts": [_fields(a) for a in s.attempts], "transfers": [_fields(t) for t in s.transfers],
            "rows": [{"span_id": r.span.span_id, "parent_id": r.span.parent_id, "name": r.span.name,
                      "depth": r.depth, "orphan": r.orphan, "service": r.span.service,
                      "instance": r.span.instance, "offset_ms": r.offset_ms, "duration_ms": r.duration_ms,
                      "status": r.status, "attributes": r.span.attributes, "events": list(r.span.events),
                      "reasons": r.span.reasons()} for r in self.rows],
        }


def _fields(obj) -> dict:
    return {f.name: (list(v) if isinstance(v, tuple) else v)
            for f in dataclasses.fields(obj) for v in (getattr(obj, f.name),)}


def waterfall(trace: Trace, malformed_lines: int = 0) -> View:
    """Rows as a depth-first tree by parent_id, siblings by start. A span whose parent is
    not in the trace is an orphan, shown at the top level and flagged — except an entry
    span (ENTRY_SPANS) whose parent is the client's span (not collected)."""
    ids = {s.span_id for s in trace.spans}
    children: dict[str, list[Span]] = {}
    tops = []
    for s in trace.spans:
        if s.parent_id and s.parent_id in ids and s.parent_id != s.span_id:
            children.setdefault(s.parent_id, []).append(s)
        else:
            tops.append(s)
    t0 = trace.start_ns
    rows: list[Row] = []
    seen: set[str] = set()

    def visit(span: Span, depth: int, orphan: bool) -> None:
        stack = [(span, depth, orphan)]
        while stack:
            s, d, o = stack.pop()
            if s.span_id in seen:
                continue
            seen.add(s.span_id)
            rows.append(Row(s, d, o, ms(s.start_ns - t0), ms(s.end_ns - s.start_ns)))
            stack.extend((c, d + 1, False) for c in sorted(children.get(s.span_id, ()), key=order, reverse=True))

    for s in sorted(tops, key=order):
        visit(s, 0, _is_orphan(s, ids))
    for s in trace.spans:  # a parent cycle (corrupt ids) reaches none of its members from a top
        if s.span_id not in seen:
            visit(s, 0, True)
    return View(summarize(trace, orphans=sum(r.orphan for r in rows)), tuple(rows), malformed_lines)


ENTRY_SPANS = frozenset({sv.ROUTER_REQUEST, "/pd.v1.Router/Generate"})
"""Where a request's trace enters pdserve: their parent may be the caller's own span
(a client that sent traceparent), which pdserve does not collect."""


def _is_orphan(s: Span, ids: set[str]) -> bool:
    if not s.parent_id:
        return False
    return s.parent_id not in ids and s.name not in ENTRY_SPANS


# ---- text -------------------------------------------------------------------------

def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def summary_lines(view: View) -> list[str]:
    """The summary as a few lines of text."""
    s = view.summary
    lines = [f"trace {s.trace_id}  request {s.request_id}  route {s.route}  total_ms {s.total_ms:.3f}  "
             f"first_token_ms {_num(s.first_token_ms)}  t_exposed_ms {_num(s.t_exposed_ms)}",
             f"processes {s.processes}  spans {s.spans}  orphans {s.orphans}  errors {s.errors}"
             + (f"  malformed_lines {view.malformed_lines}" if view.malformed_lines else "")]
    for i, a in enumerate(s.attempts, 1):
        why = f"  ({'; '.join(a.reasons)})" if a.reasons else ""
        lines.append(f"attempt {i}: generation {a.generation} route {a.route or '-'} "
                     f"transfer {a.transfer_id or '-'} {a.outcome} {a.duration_ms:.3f} ms{why}")
    for x in s.transfers:
        why = f"  (missing {', '.join(x.missing)})" if x.missing else ""
        lines.append(f"transfer {x.transfer_id or '-'}: t_exposed_ms {_num(x.t_exposed_ms)}  "
                     f"publish_end_ms {_num(x.publish_end_ms)}  decode_ready_ms {_num(x.decode_ready_ms)}{why}")
    return lines


def render_text(view: View) -> str:
    """Summary, then one line per span: offset, duration, status, indented name,
    service/instance, key attributes and reasons; '!' marks an orphan."""
    table = [("OFFSET_MS", "DUR_MS", "STATUS", "SPAN", "PROCESS", "ATTRIBUTES")]
    for r in view.rows:
        attrs = " ".join(f"{k.removeprefix('pd.')}={v}" for k, v in r.key_attributes().items())
        notes = "; ".join(r.span.reasons())
        table.append((f"{r.offset_ms:.3f}", f"{r.duration_ms:.3f}", r.status,
                      ("! " if r.orphan else "") + "  " * r.depth + r.span.name,
                      f"{r.span.service}/{r.span.instance}" if r.span.instance else r.span.service,
                      (attrs + (f"  [{notes}]" if notes else "")).strip()))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    body = ["  ".join(c.rjust(w) if i < 2 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
            for row in table]
    return "\n".join(summary_lines(view) + [""] + body) + "\n"
