"""Admin.Blocks: who holds which K/V blocks on every worker, with orphans flagged.

Each live worker answers pd.v1.WorkerAdmin.Blocks (runtime/worker/holdings.py: every
block free, cached prefix, or charged to one holding naming its request, tenant,
transfer, generation and state). The router then judges each holding.

Orphan, precisely: a holding on worker W is an orphan when nothing that would give
its blocks back claims it, i.e. when
  1. W's epoch (as W reports it) is not the one the directory lists for W: that
     incarnation's lease is gone, the directory aborted its transactions and no
     router routes to it; or
  2. it names no request (blocks the engine holds that no sequence lists); or
  3. neither of these claims it:
     a. this router has the request (tenant, request id) in flight, and the
        holding's generation is not older than the request's latest attempt
        (an older one was torn down, or should have been: "superseded");
     b. the directory has the holding's transfer open (not ABORTED or RELEASED).
An UNOWNED holding (a live sequence no worker record refers to) is judged by the
same rule: while its request runs, its end frees it; after, nothing will.
Cached prefix blocks are owned by nobody and are never orphans.

The reads are not one instant: the router's requests are read before and after
the workers answer (a claim in either counts), the directory's open transactions
after. A holding whose request ended between the reads can be flagged once; an
orphan still there on the next call is a leak. With several router replicas, a
colocated request of another replica looks unclaimed here (it has no transaction).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from pdserve_client.rpc.pd.v1 import admin_pb2, blocks_pb2
from router.edge.refusal import quote
from router.types import RouterError, StatusCode, WorkerCallError

Claims = Mapping[tuple[str, str], int]
"""(tenant, request id) in flight -> generation of its latest attempt (0: none yet)."""


@dataclass(frozen=True, slots=True)
class Witnesses:
    """What may claim a holding: the router's requests and the directory."""

    requests: Claims
    open_transfers: frozenset[str]
    epochs: Mapping[str, int]
    """worker id -> the epoch the directory lists."""


def orphan_reason(worker: blocks_pb2.WorkerBlocks, h: blocks_pb2.BlockHolding, w: Witnesses) -> str:
    """Why `h` (on `worker`) is an orphan, or '' when something claims it (module docstring)."""
    listed = w.epochs.get(worker.worker_id)
    if listed is not None and worker.epoch != listed:
        return f"worker epoch {worker.epoch} is stale (the directory lists {listed})"
    if not h.request_id:
        return "held blocks no sequence lists"
    if h.transfer_id and h.transfer_id in w.open_transfers:
        return ""
    latest = w.requests.get((h.tenant, h.request_id))
    if latest is None:
        return "request not in flight at the router and no open transaction"
    if h.generation < latest:
        return f"superseded: the request is at generation {latest}, no open transaction for {h.generation}"
    return ""


def judge(worker: blocks_pb2.WorkerBlocks, w: Witnesses, orphans_only: bool = False) -> int:
    """Flag `worker`'s orphan holdings in place (and its orphan_blocks); drop the others
    when `orphans_only`. Returns the number of orphans."""
    keep = []
    for h in worker.holdings:
        h.orphan_reason = orphan_reason(worker, h, w)
        h.orphan = bool(h.orphan_reason)
        if h.orphan or not orphans_only:
            keep.append(h)
    worker.orphan_blocks = sum(h.charged_blocks for h in keep if h.orphan)
    del worker.holdings[:]
    worker.holdings.extend(keep)
    return sum(h.orphan for h in keep)


async def blocks(orch, request: admin_pb2.BlocksRequest) -> admin_pb2.BlocksResponse:
    """Ask every live worker (or request.worker_id) and judge the holdings; raises
    RouterError (NOT_FOUND for an unknown worker, UNAVAILABLE without a directory)."""
    cluster = await orch.view.get(max_age_s=0.0)
    workers = [w for w in cluster.workers if request.worker_id in ("", w.worker_id)]
    if request.worker_id and not workers:
        raise RouterError(StatusCode.NOT_FOUND, f"no live worker {quote(request.worker_id)}")
    timeout_s = orch.config.directory_timeout_s
    before = orch.claims()
    answers = await asyncio.gather(*(_ask(orch, w, request.request_id, timeout_s) for w in workers))
    try:
        open_txns = await orch.directory.list_open_transactions(timeout_s)
    except WorkerCallError as exc:
        raise RouterError(StatusCode.UNAVAILABLE, f"directory: {exc.code.name}: {exc.message}") from None
    after = orch.claims()
    requests = dict(before)
    for key, generation in after.items():
        requests[key] = min(generation, requests.get(key, generation))
    witnesses = Witnesses(requests, frozenset(t.transfer_id for t in open_txns),
                          {w.worker_id: w.epoch for w in cluster.workers})
    orphans = sum(judge(a, witnesses, request.orphans_only) for a in answers)
    return admin_pb2.BlocksResponse(workers=sorted(answers, key=lambda a: a.worker_id), orphan_holdings=orphans,
                                    in_flight_requests=len(after), open_transactions=len(open_txns))


async def _ask(orch, worker, request_id: str, timeout_s: float) -> blocks_pb2.WorkerBlocks:
    """One worker's answer; one that fails is an entry with its error."""
    try:
        answer = await orch.workers.blocks(worker, request_id, timeout_s)
    except WorkerCallError as exc:
        answer = blocks_pb2.WorkerBlocks(worker_id=worker.worker_id, epoch=worker.epoch,
                                         error=f"{exc.code.name}: {exc.message}")
    answer.role = worker.role.value
    return answer
