"""`pdctl release`: the release state machine and its rollback (docs/design.md, The release).

    pdctl release status   [--json]
    pdctl release promote  [TARGET] --reason R [--canary-fraction F] [--json]
    pdctl release rollback --reason R [--no-wait] [--json]

`status` prints the state, the frozen manifest, the latest rollback's steps (time and
counts each) and the history. `promote` moves one state through its gates (or to
TARGET: still one legal step) and prints every gate's verdict; a failed gate exits 1
naming it. `rollback` runs the rollback in order, or resumes an unfinished one, and
prints its steps. Promote and rollback present the operator certificate by default.
"""

from __future__ import annotations

import argparse
import json
from typing import TextIO

from pdserve_client import wire
from pdserve_client.client import Client
from pdserve_client.release import ReleaseChange, render

TARGETS = [m for m in wire.RELEASE_MODES if m != "rolled_back"]


def add_parser(commands, shared: argparse.ArgumentParser) -> None:
    """Register `release` on pdctl's sub-command set."""
    release = commands.add_parser("release", help="the release state machine: status, promote, rollback")
    actions = release.add_subparsers(dest="action", required=True, metavar="{status,promote,rollback}")
    status = actions.add_parser("status", parents=[shared], help="state, manifest, rollback steps, history")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(run=cmd_status)
    promote = actions.add_parser("promote", parents=[shared], help="promote one state through the gates")
    # default None, not "": argparse checks a string default against `choices`, and "" is none.
    promote.add_argument("target", nargs="?", default=None, choices=TARGETS, metavar="TARGET",
                         help=f"target state, one of {', '.join(TARGETS)} (default: the next one)")
    promote.add_argument("--canary-fraction", type=float, default=0.0, help="canary share in [0, 1] (CANARY)")
    promote.add_argument("--reason", required=True, help="why, for the history")
    promote.add_argument("--json", action="store_true", help="print JSON")
    promote.set_defaults(run=cmd_promote, default_identity="operator")
    rollback = actions.add_parser("rollback", parents=[shared], help="roll back in order (or resume one)")
    rollback.add_argument("--reason", required=True, help="why, for the history")
    rollback.add_argument("--no-wait", dest="wait", action="store_false", help="return once it started")
    rollback.add_argument("--json", action="store_true", help="print JSON")
    rollback.set_defaults(run=cmd_rollback, default_identity="operator")


def cmd_status(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    view = client.release()
    out.write((json.dumps(view.to_dict()) if args.json else render(view)) + "\n")
    return 0


def _change(change: ReleaseChange, args: argparse.Namespace, out: TextIO) -> int:
    if args.json:
        out.write(json.dumps(change.to_dict()) + "\n")
        return 0
    out.write(f"release: {change.previous_mode.upper()} -> {change.release.mode.upper()} "
              f"(version {change.release.version})\n")
    for g in change.gates:
        out.write(f"  gate {g.name}: {'ok' if g.passed else 'FAILED'}: {g.detail}\n")
    out.write(render(change.release) + "\n")
    return 0


def cmd_promote(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    change = client.promote(args.target or "", canary_fraction=args.canary_fraction, reason=args.reason)
    return _change(change, args, out)


def cmd_rollback(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    return _change(client.rollback(reason=args.reason, wait=args.wait), args, out)
