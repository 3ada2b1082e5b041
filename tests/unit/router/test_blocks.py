"""Admin.Blocks (router/blocks.py): every worker's holdings, and the orphan rule —
a holding is an orphan when its worker's epoch is stale, when it names no request,
or when neither the router (request in flight, at this generation or newer) nor
the directory (transfer open) claims it. In-process gateways, plus the gRPC
surface: operators only, bad input refused."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import pytest

from pdserve_client.rpc.pd.v1 import admin_pb2, admin_pb2_grpc, blocks_pb2
from router.blocks import Witnesses, blocks, orphan_reason
from router.requests.orchestrator import Orchestrator
from router.server import start
from router.types import RouterError, StatusCode, WorkerCallError
from runtime.directory.records import WorkerRole
from tests.support import pki
from tests.support.orchestrator import FakeCluster, collect, config, params, run, worker

HOLD = blocks_pb2.BlockHolding
DECODING, RESERVED = blocks_pb2.BLOCK_HOLD_STATE_DECODING, blocks_pb2.BLOCK_HOLD_STATE_RESERVED


def holding(request_id="r", generation=1, tenant="t", state=DECODING, charged=3) -> blocks_pb2.BlockHolding:
    return HOLD(request_id=request_id, tenant=tenant, transfer_id=f"{request_id}/{generation}" if request_id else "",
                generation=generation, state=state, num_blocks=charged, charged_blocks=charged)


W = blocks_pb2.WorkerBlocks(worker_id="d0", epoch=5)


def witnesses(requests=None, open_transfers=(), epoch=5) -> Witnesses:
    return Witnesses(requests or {}, frozenset(open_transfers), {"d0": epoch})


@pytest.mark.parametrize("h, w, reason", [
    (holding(), witnesses({("t", "r"): 1}), ""),
    (holding(), witnesses({("t", "r"): 0}), ""),  # in flight, no attempt noted yet
    (holding(), witnesses(open_transfers={"r/1"}), ""),
    (holding(), witnesses(), "request not in flight at the router and no open transaction"),
    (holding(tenant="u"), witnesses({("t", "r"): 1}), "request not in flight"),  # another tenant's request
    (holding(), witnesses({("t", "r"): 2}), "superseded: the request is at generation 2"),
    (holding(), witnesses({("t", "r"): 2}, {"r/1"}), ""),  # its transaction is still open
    (holding(), witnesses({("t", "r"): 1}, epoch=6), "worker epoch 5 is stale (the directory lists 6)"),
    (holding(request_id=""), witnesses(), "held blocks no sequence lists"),
])
def test_the_orphan_rule(h, w, reason):
    got = orphan_reason(W, h, w)
    assert got.startswith(reason) and bool(got) == bool(reason)


class BlockCluster(FakeCluster):
    """FakeCluster whose workers answer WorkerAdmin.Blocks from `held`."""

    def __init__(self, workers):
        super().__init__(workers)
        self.held: dict[str, list[blocks_pb2.BlockHolding]] = {}
        self.open_transfers: list[str] = []

    async def blocks(self, w, request_id, timeout_s):
        await self._enter("blocks", w.worker_id)
        hs = [h for h in self.held.get(w.worker_id, []) if request_id in ("", h.request_id)]
        held = sum(h.charged_blocks for h in hs)
        return blocks_pb2.WorkerBlocks(worker_id=w.worker_id, epoch=w.epoch, total_blocks=64, free_blocks=64 - held,
                                       active_blocks=held, holdings=hs)

    async def list_open_transactions(self, timeout_s):
        return [SimpleNamespace(transfer_id=t) for t in self.open_transfers]


def rig() -> tuple[BlockCluster, Orchestrator]:
    fake = BlockCluster([worker("d0", WorkerRole.DECODE), worker("d1", WorkerRole.DECODE),
                         worker("p0", WorkerRole.PREFILL)])
    return fake, Orchestrator(fake, fake, config(default_mode="colocated"))


def test_holdings_of_a_running_request_are_claimed_and_a_leak_is_an_orphan():
    fake, orch = rig()
    fake.hang.add(("generate", "d0"))
    fake.hang.add(("generate", "d1"))

    async def go():
        task = asyncio.ensure_future(collect(orch, params("live")))
        while not fake.ops("generate"):
            await asyncio.sleep(0.01)
        where, gen = fake.ops("generate")[0][1], fake.ops("generate")[0][3]
        fake.held[where] = [holding("live", gen)]
        fake.held["d1" if where == "d0" else "d0"] = [holding("leak", 4, charged=2)]
        fake.held["p0"] = [holding("sent", 1, state=RESERVED)]
        fake.open_transfers = ["sent/1"]
        everything = await blocks(orch, admin_pb2.BlocksRequest())
        orphans = await blocks(orch, admin_pb2.BlocksRequest(orphans_only=True))
        one = await blocks(orch, admin_pb2.BlocksRequest(worker_id="p0", request_id="sent"))
        await orch.cancel("live", "test over")
        await task
        return everything, orphans, one, where

    everything, orphans, one, where = run(go())
    by = {w.worker_id: w for w in everything.workers}
    assert [w.worker_id for w in everything.workers] == ["d0", "d1", "p0"]
    assert [(h.request_id, h.orphan) for h in by[where].holdings] == [("live", False)]
    (leak,) = by["d1" if where == "d0" else "d0"].holdings
    assert leak.orphan and leak.orphan_reason.startswith("request not in flight")
    assert [(h.request_id, h.orphan) for h in by["p0"].holdings] == [("sent", False)]
    assert (everything.orphan_holdings, everything.in_flight_requests, everything.open_transactions) == (1, 1, 1)
    assert by["d1" if where == "d0" else "d0"].orphan_blocks == 2 and by["p0"].role == "prefill"
    assert orphans.orphan_holdings == 1 and sum(len(w.holdings) for w in orphans.workers) == 1
    assert [w.worker_id for w in one.workers] == ["p0"] and one.workers[0].holdings[0].request_id == "sent"


def test_a_worker_that_does_not_answer_is_listed_with_its_error_and_an_unknown_one_is_not_found():
    fake, orch = rig()
    fake.fail[("blocks", "d1")] = WorkerCallError(StatusCode.UNAVAILABLE, "d1 down")

    async def go():
        answer = await blocks(orch, admin_pb2.BlocksRequest())
        with pytest.raises(RouterError) as err:
            await blocks(orch, admin_pb2.BlocksRequest(worker_id="nope"))
        return answer, err.value

    answer, err = run(go())
    assert [(w.worker_id, w.error) for w in answer.workers] == [("d0", ""), ("d1", "UNAVAILABLE: d1 down"), ("p0", "")]
    assert err.code is StatusCode.NOT_FOUND


def test_admin_blocks_is_for_operators_and_refuses_bad_input():
    fake, orch = rig()

    async def go():
        cfg = config(listen_addr="127.0.0.1:0")
        server, port, _ = await start(cfg, orch, pki.security("router", "router"))
        codes = []
        try:
            for role, name, req in (("client", "acme", admin_pb2.BlocksRequest()),
                                    ("operator", "ops", admin_pb2.BlocksRequest(request_id="x" * 300)),
                                    ("operator", "ops", admin_pb2.BlocksRequest())):
                async with pki.security(role, name).aio_channel(f"127.0.0.1:{port}", "router") as ch:
                    try:
                        reply = await admin_pb2_grpc.AdminStub(ch).Blocks(req, timeout=5)
                        codes.append((grpc.StatusCode.OK, len(reply.workers)))
                    except grpc.aio.AioRpcError as exc:
                        codes.append((exc.code(), exc.details()))
        finally:
            await server.stop(0)
            await orch.close()
        return codes

    denied, bad, ok = run(go())
    assert denied[0] == grpc.StatusCode.PERMISSION_DENIED
    assert bad == (grpc.StatusCode.INVALID_ARGUMENT, "request_id is over 256 bytes")
    assert ok == (grpc.StatusCode.OK, 3)
