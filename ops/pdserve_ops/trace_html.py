"""`pdctl trace --html`: a trace as one self-contained page (docs/observability.md). Inline CSS and a
few lines of JS, nothing fetched (a Content-Security-Policy forbids it): the summary on
top, then one bar per span on a shared time axis, coloured by service, labelled with
its name and duration; a click on a row opens its attributes and events.

Every text on the page comes from spans, which any process (or a client's request id)
can fill: all of it goes through html.escape, none into the script. Each bar carries
data-span-id, one per span (tests count them).
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from pdserve_ops.trace_view import Row, View

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#bab0ac")
"""Bar colours, one per service in name order (wraps after nine)."""

_CSS = """
body{font:13px/1.4 system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:18px;margin:0 0 8px}h2{font-size:15px;margin:18px 0 6px}
table.kv{border-collapse:collapse;margin:4px 0 8px}table.kv td,table.kv th{border:1px solid #ddd;padding:2px 6px;
text-align:left;vertical-align:top}table.kv th{background:#f4f4f4}
.note{color:#a33}.legend span{display:inline-block;margin-right:12px}
.chip{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
.wf{border-top:1px solid #ccc}.row{display:grid;grid-template-columns:minmax(220px,30%) 1fr;
border-bottom:1px solid #eee;cursor:pointer}.row:hover{background:#f7f9fc}
.label{white-space:nowrap;overflow:hidden;text-overflow:ellipsis;padding:2px 4px}
.label small{color:#777;margin-left:6px}.lane{position:relative;height:20px;margin-right:48px}
.bar{position:absolute;top:3px;height:14px;min-width:2px;border-radius:2px;color:#fff;font-size:11px;
line-height:14px;white-space:nowrap;overflow:visible}.bar span{padding-left:3px;color:#111;position:absolute;
left:100%}.bar.flip span{left:auto;right:100%;padding:0 3px 0 0}
.bar.inside span{left:0;color:#fff}.bar.error{outline:2px solid #d00}
.ev{position:absolute;top:-2px;width:1px;height:18px;background:#000}
.orphan .label{color:#a33}.badge{font-size:10px;border:1px solid #a33;border-radius:3px;padding:0 3px;margin-left:4px}
.details{grid-column:1/3;padding:4px 8px 8px 24px;background:#fafafa;cursor:auto}
.axis{display:grid;grid-template-columns:minmax(220px,30%) 1fr;color:#777;font-size:11px}
.ticks{position:relative;height:14px;margin-right:48px}.ticks span{position:absolute;transform:translateX(-50%)}
"""

_JS = """
document.querySelectorAll('.row').forEach(function (row) {
  row.addEventListener('click', function (e) {
    if (e.target.closest('.details')) return;
    var d = row.querySelector('.details');
    d.hidden = !d.hidden;
  });
});
document.getElementById('toggle-all').addEventListener('click', function () {
  var ds = document.querySelectorAll('.details');
  var open = Array.prototype.some.call(ds, function (d) { return d.hidden; });
  ds.forEach(function (d) { d.hidden = !open; });
});
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _kv_table(pairs: Sequence[tuple[object, object]]) -> str:
    cells = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in pairs)
    return f'<table class="kv">{cells}</table>' if cells else ""


def _grid(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="kv"><tr>{head}</tr>{body}</table>'


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _summary(view: View) -> str:
    s = view.summary
    parts = [_kv_table([("request", s.request_id), ("trace", s.trace_id), ("route", s.route),
                        ("total ms", f"{s.total_ms:.3f}"), ("first token ms", _num(s.first_token_ms)),
                        ("T_exposed ms", _num(s.t_exposed_ms)), ("processes", s.processes), ("spans", s.spans),
                        ("orphans", s.orphans), ("errors", s.errors), ("malformed lines", view.malformed_lines)])]
    if s.attempts:
        parts.append(_grid(("attempt", "generation", "route", "transfer", "outcome", "start ms", "ms", "reasons"),
                           [(i, a.generation, a.route or "-", a.transfer_id or "-", a.outcome, f"{a.offset_ms:.3f}",
                             f"{a.duration_ms:.3f}", "; ".join(a.reasons)) for i, a in enumerate(s.attempts, 1)]))
    if s.transfers:
        parts.append(_grid(("transfer", "generation", "T_exposed ms", "publish end ms", "decode ready ms", "missing"),
                           [(x.transfer_id or "-", x.generation, _num(x.t_exposed_ms), _num(x.publish_end_ms),
                             _num(x.decode_ready_ms), ", ".join(x.missing)) for x in s.transfers]))
    return '<div class="summary">' + "".join(parts) + "</div>"


def _pct(ms: float, total_ms: float) -> float:
    return 0.0 if total_ms <= 0 else max(0.0, min(100.0, 100.0 * ms / total_ms))


def _row(row: Row, total_ms: float, t0_ns: int, colour: dict[str, int]) -> str:
    s = row.span
    left, width = _pct(row.offset_ms, total_ms), _pct(row.duration_ms, total_ms)
    label = f"{s.name} {row.duration_ms:.3f} ms"
    ticks = "".join(
        f'<i class="ev" style="left:{_pct((int(ev["t_ns"]) - s.start_ns) / 1e6, row.duration_ms):.3f}%" '
        f'title="{_e(ev.get("name", ""))}"></i>'
        for ev in s.events if isinstance(ev.get("t_ns"), int) and row.duration_ms > 0)
    events = _grid(("event", "at ms", "attributes"),
                   [(ev.get("name", ""), _num((int(ev["t_ns"]) - t0_ns) / 1e6) if isinstance(ev.get("t_ns"), int)
                     else "?", ", ".join(f"{k}={v}" for k, v in (ev.get("attributes") or {}).items()))
                    for ev in s.events]) if s.events else ""
    details = _kv_table([("span", s.span_id), ("parent", s.parent_id or "(root)"), ("service", s.service),
                         ("instance", s.instance), ("start ms", f"{row.offset_ms:.3f}"),
                         ("duration ms", f"{row.duration_ms:.3f}"), ("status", row.status)]
                        + sorted(s.attributes.items())) + events
    badge = '<span class="badge">orphan</span>' if row.orphan else ""
    classes = (f"bar svc{colour[s.service]}" + (" error" if s.status == 2 else "")
               + (" inside" if width > 30 else " flip" if left + width > 70 else ""))
    process = f"{s.service}/{s.instance}" if s.instance else s.service
    return (f'<div class="row{" orphan" if row.orphan else ""}">'
            f'<div class="label" style="padding-left:{4 + 14 * row.depth}px" title="{_e(label)}">'
            f"{_e(s.name)}<small>{_e(process)}</small>{badge}</div>"
            f'<div class="lane"><div class="{classes}" '
            f'data-span-id="{_e(s.span_id)}" style="left:{left:.3f}%;width:{width:.3f}%" '
            f'title="{_e(label)}">{ticks}<span>{_e(label)}</span></div></div>'
            f'<div class="details" hidden>{details}</div></div>')


def _section(view: View, colour: dict[str, int]) -> str:
    s = view.summary
    t0_ns = min(r.span.start_ns for r in view.rows) if view.rows else 0
    ticks = "".join(f'<span style="left:{p}%">{_e(f"{s.total_ms * p / 100:.1f} ms")}</span>'
                    for p in (0, 25, 50, 75, 100))
    rows = "".join(_row(r, s.total_ms, t0_ns, colour) for r in view.rows)
    notes = "".join(f'<p class="note">{_e(line)}</p>' for line in
                    ([f"{s.orphans} span(s) whose parent is not in the trace"] if s.orphans else []))
    return (f'<section class="trace" data-trace-id="{_e(s.trace_id)}"><h2>trace {_e(s.trace_id)}</h2>'
            f"{_summary(view)}{notes}"
            f'<div class="axis"><div></div><div class="ticks">{ticks}</div></div>'
            f'<div class="wf">{rows}</div></section>')


def render_html(views: View | Sequence[View], title: str = "") -> str:
    """The page for one trace, or several (a request id that ran as several traces)."""
    views = [views] if isinstance(views, View) else list(views)
    services = sorted({r.span.service for v in views for r in v.rows})
    colour = {name: i % len(PALETTE) for i, name in enumerate(services)}
    css = _CSS + "".join(f".svc{i}{{background:{c}}}" for i, c in enumerate(PALETTE))
    legend = "".join(f'<span><i class="chip svc{colour[name]}"></i>{_e(name or "(no service)")}</span>'
                     for name in services)
    request = views[0].summary.request_id if views else ""
    heading = title or f"pdserve trace of request {request}"
    many = (f'<p class="note">request {_e(request)} ran as {len(views)} traces</p>' if len(views) > 1 else "")
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">"
            '<link rel="icon" href="data:,">'
            f"<title>{_e(heading)}</title><style>{css}</style></head><body>"
            f"<h1>{_e(heading)}</h1>{many}<div class=\"legend\">{legend}</div>"
            '<p><button id="toggle-all" type="button">expand / collapse all</button> '
            "click a row for its attributes and events</p>"
            + "".join(_section(v, colour) for v in views)
            + f"<script>{_JS}</script></body></html>\n")
