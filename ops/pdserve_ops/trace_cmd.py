"""`pdctl trace REQUEST_ID`: the waterfall of one request from the local collector's
span file (docs/observability.md). Reads a file, talks to no router.

    pdctl trace REQUEST_ID [--spans FILE | --state-dir DIR] [--wait-s S] [--json] [--html FILE]

The file defaults to <state dir>/traces/spans.jsonl (state dir: .pdserve, as for
`pdserve up`). Spans are exported in batches, so a request not found yet is waited for
up to --wait-s, and then until its spans stop arriving. Exit codes: 0 shown, 1 not
found or the file unreadable (message on stderr), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

from pdserve_client import contract, spans
from pdserve_ops import trace_html, trace_view

EXIT_OK, EXIT_ERROR = 0, 1


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def register(commands) -> None:
    """Add `trace` to pdctl's sub-commands (it needs no router: offline=True)."""
    p = commands.add_parser("trace", help="show one request's trace (waterfall, T_exposed) from the span file")
    p.add_argument("request_id", help="the request id (pd.request_id)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--spans", default=None, help=f"span file (default: <state dir>/{spans.SPANS_FILE})")
    source.add_argument("--state-dir", default=contract.LOCAL_STATE_DIR,
                        help=f"local cluster state dir (default: {contract.LOCAL_STATE_DIR})")
    p.add_argument("--wait-s", type=_seconds, default=10.0,
                   help="how long to wait for the request's whole trace (default 10)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--html", default=None, metavar="FILE", help="also write a self-contained timeline page")
    p.set_defaults(run=run, offline=True)


def spans_path(args: argparse.Namespace) -> Path:
    """--spans, else the state dir's span file."""
    return Path(args.spans) if args.spans else Path(args.state_dir) / spans.SPANS_FILE


def run(args: argparse.Namespace, out: TextIO, err: TextIO | None = None) -> int:
    """Find, lay out and print the request's trace(s); write the page with --html."""
    err = err or sys.stderr
    path = spans_path(args)
    try:
        traces, malformed = trace_view.wait_for(path, args.request_id, wait_s=args.wait_s)
    except OSError as e:
        print(f"pdctl: error: cannot read {path}: {e}", file=err)
        return EXIT_ERROR
    if malformed:
        print(f"pdctl: warning: {malformed} malformed line(s) skipped in {path}", file=err)
    if not traces:
        why = "no such file (is tracing on? `pdserve up` starts the collector)" if not path.exists() else \
            f"no span with {spans.REQUEST_ID}={args.request_id!r}"
        print(f"pdctl: error: request {args.request_id} not found in {path}: {why}", file=err)
        return EXIT_ERROR
    if len(traces) > 1:
        print(f"pdctl: note: request {args.request_id} ran as {len(traces)} traces: "
              + ", ".join(t.trace_id for t in traces), file=err)
    views = [trace_view.waterfall(t, malformed) for t in traces]
    if args.json:
        out.write(json.dumps({"request_id": args.request_id, "spans_file": str(path),
                              "traces": [v.to_dict() for v in views]}) + "\n")
    else:
        out.write("\n".join(trace_view.render_text(v) for v in views))
    if args.html:
        try:
            Path(args.html).write_text(trace_html.render_html(views), encoding="utf-8")
        except OSError as e:
            print(f"pdctl: error: cannot write {args.html}: {e}", file=err)
            return EXIT_ERROR
        print(f"pdctl: wrote {args.html}", file=err)
    return EXIT_OK
