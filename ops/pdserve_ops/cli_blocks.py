"""`pdctl blocks`: who holds which K/V blocks on every worker, orphans flagged.

    pdctl blocks [--json] [--orphans-only] [--request R] [--worker W]

Presents the operator certificate by default (Admin.Blocks is operators only).
One line per worker, its pool in the columns `pdctl status` prints (tables.POOL_HELP:
FREE counts the cached prefix blocks too; FREE + RESERVED + ACTIVE = TOTAL),
then one line per holding: request, tenant, transfer, state, age, blocks, and
ORPHAN with the router's reason for a holding nothing will give back.
"""

from __future__ import annotations

import argparse
import json
from typing import TextIO

from pdserve_client.blocks import BlockHolding
from pdserve_client.client import Client
from pdserve_ops.tables import POOL_HEADERS, POOL_HELP, pool_cells, table


def add_parser(commands, shared: argparse.ArgumentParser) -> None:
    """Register `blocks` on pdctl's sub-command set."""
    p = commands.add_parser("blocks", parents=[shared], help="who holds which K/V blocks; orphans flagged",
                            description="Every worker's K/V pool and who holds its blocks. " + POOL_HELP)
    p.add_argument("--orphans-only", action="store_true", help="list only orphan holdings")
    p.add_argument("--request", default="", help="only this request's holdings")
    p.add_argument("--worker", default="", help="only this worker")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=cmd_blocks, default_identity="operator")


def _ranges(h: BlockHolding) -> str:
    return ",".join(f"{s}" if n == 1 else f"{s}-{s + n - 1}" for s, n in h.ranges)


def cmd_blocks(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Print every worker's block counts and holdings."""
    view = client.blocks(request_id=args.request, worker_id=args.worker, orphans_only=args.orphans_only)
    if args.json:
        out.write(json.dumps(view.to_dict()) + "\n")
        return 0
    out.write(table(("WORKER", "ROLE", "EPOCH", *POOL_HEADERS, "ORPHANED"),
                    [(w.worker_id, w.role, w.epoch,
                      *pool_cells(free=w.free_blocks, cached=w.cached_prefix_blocks, reserved=w.reserved_blocks,
                                  active=w.active_blocks, total=w.total_blocks),
                      w.orphan_blocks) for w in view.workers]) + "\n")
    for w in view.workers:
        if w.error:
            out.write(f"{w.worker_id}: no answer: {w.error}\n")
    rows = [(w.worker_id, h.request_id or "-", h.tenant or "-", h.transfer_id or "-", h.state, f"{h.age_s:.1f}",
             f"{h.charged_blocks}/{h.num_blocks}", _ranges(h), f"ORPHAN: {h.orphan_reason}" if h.orphan else "")
            for w in view.workers for h in w.holdings]
    if rows:
        out.write("\n" + table(("WORKER", "REQUEST", "TENANT", "TRANSFER", "STATE", "AGE_S", "CHARGED/BLOCKS",
                                "BLOCK_IDS", ""), rows) + "\n")
    out.write(f"{len(rows)} holding(s), {view.orphan_holdings} orphan(s); {view.in_flight_requests} request(s) "
              f"in flight, {view.open_transactions} open transaction(s)\n")
    return 0
