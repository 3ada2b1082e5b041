"""The router's gRPC layer in one process: the real Router/Admin servicers and
gRPC gateways against fake Decode, Prefill and Directory servers on loopback.
Checks proto mapping, status codes, stream cancellation and the Admin service."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest

from kv_directory.access import ACCESS as DIRECTORY_ACCESS
from pdserve_client.rpc.pd.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    decode_pb2,
    decode_pb2_grpc,
    directory_pb2,
    directory_pb2_grpc,
    manifest_pb2,
    prefill_pb2,
    prefill_pb2_grpc,
    router_pb2,
    router_pb2_grpc,
)
from router.__main__ import parse_args
from router.config import RouterConfig
from router.server import build, start
from runtime.common.grpc_server import start_server
from runtime.release.record import check_write
from runtime.release.wire import record_from_pb
from runtime.worker.node import router_only
from tests.support import pki

CAP = common_pb2.WorkerCapacity(total_blocks=64, max_decode_batch=8, max_prefill_tokens=512, block_size=4,
                                vocab_size=512, max_model_len=256)
PROMPT = [5, 6, 7, 8, 9]


def tokens(n: int) -> list[int]:
    return [(100 + 3 * i) % 512 for i in range(n)]


class Log(list):
    def names(self) -> list[str]:
        return [entry[0] for entry in self]


class FakeDecode(decode_pb2_grpc.DecodeServicer):
    def __init__(self, name: str, log: Log, published: dict, gap_s: float = 0.0):
        self.name, self.log, self.published, self.gap_s = name, log, published, gap_s
        self.reserve_error: common_pb2.Error | None = None
        self.reserve_s = 0.0

    async def Reserve(self, request, context):
        self.log.append(("Decode.Reserve", self.name, request.request_id, request.generation))
        await asyncio.sleep(self.reserve_s)
        if self.reserve_error is not None:
            return decode_pb2.DecodeReserveResponse(request_id=request.request_id, error=self.reserve_error)
        tid = f"{request.request_id}/{request.generation}"
        self.published.setdefault(tid, asyncio.Event())
        return decode_pb2.DecodeReserveResponse(request_id=request.request_id, reservation=decode_pb2.DecodeReservation(
            reservation_id=tid, block_ids=[1, 2, 3], data_plane_address=f"dp-{self.name}",
            destination_worker_id=self.name, destination_epoch=3, ttl_ms=5000))

    async def _tokens(self, request_id: str, n: int, digest: str = ""):
        for i, tok in enumerate(tokens(n)):
            await asyncio.sleep(self.gap_s)
            yield decode_pb2.TokenEvent(request_id=request_id, token=decode_pb2.TokenEvent.Token(token_id=tok, index=i))
        yield decode_pb2.TokenEvent(request_id=request_id, complete=decode_pb2.TokenEvent.Complete(
            finish_reason=common_pb2.FINISH_REASON_LENGTH, num_tokens=n, kv_digest=digest))

    async def DecodeStream(self, request, context):
        self.log.append(("Decode.DecodeStream", self.name, request.request_id, request.generation))
        self.published.setdefault(request.transfer_id, asyncio.Event())
        await self.published[request.transfer_id].wait()
        async for ev in self._tokens(request.request_id, request.max_tokens, f"kv-{request.transfer_id}"):
            yield ev

    async def Generate(self, request, context):
        self.log.append(("Decode.Generate", self.name, request.request_id, request.generation))
        async for ev in self._tokens(request.request_id, request.max_tokens):
            yield ev

    async def Cancel(self, request, context):
        self.log.append(("Decode.Cancel", self.name, request.request_id, request.generation))
        return common_pb2.CancelResponse(request_id=request.request_id, found=True)


class FakePrefill(prefill_pb2_grpc.PrefillServicer):
    def __init__(self, name: str, log: Log, published: dict):
        self.name, self.log, self.published = name, log, published
        self.fail = self.refuse_job = self.token_at_job = False

    async def Prefill(self, request_iterator, context):
        requests = aiter(request_iterator)
        if self.refuse_job:  # at the job, before its grant is written
            job = await anext(requests)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"job {job.manifest.transfer_id} refused")
        first = prefill_pb2.PrefillEvent(first_token=prefill_pb2.FirstToken(token_id=tokens(1)[0]))
        self.requests = []  # the job, then its grant
        if self.token_at_job:  # token 0 sampled before the grant came (a compute shorter than D's Reserve)
            self.requests.append(await anext(requests))
            self.log.append(("Prefill.FirstToken", self.name))
            yield first
        self.requests += [r async for r in requests]
        request = self.requests[-1]
        m = request.manifest
        self.log.append(("Prefill.Prefill", self.name, m.request_id, m.generation,
                         request.destination_data_plane_address))
        self.sampling = request.sampling
        if self.fail:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "transport to destination broke")
        if not self.token_at_job:
            yield first
        self.published.setdefault(m.transfer_id, asyncio.Event()).set()
        yield prefill_pb2.PrefillEvent(result=prefill_pb2.PrefillResult(
            request_id=m.request_id, transfer_id=m.transfer_id, first_token_id=tokens(1)[0],
            kv_digest=f"kv-{m.transfer_id}"))

    async def Cancel(self, request, context):
        self.log.append(("Prefill.Cancel", self.name, request.request_id, request.generation))
        return common_pb2.CancelResponse(request_id=request.request_id, found=True)


class FakeDirectory(directory_pb2_grpc.DirectoryServicer):
    def __init__(self, log: Log):
        self.log, self.workers, self.manifests = log, [], []
        self.open = [manifest_pb2.Transaction(
            request_id="x", transfer_id=f"x/{i}", tenant="a" if i % 2 else "b", generation=i + 1,
            state=manifest_pb2.TXN_STATE_TRANSFERRING, source_worker_id="p0", source_epoch=3,
            destination_worker_id="d0", destination_epoch=3, updated_unix_ms=i) for i in range(5)]

    async def ClusterSnapshot(self, request, context):
        return directory_pb2.ClusterSnapshotResponse(workers=self.workers, route_epoch=9, snapshot_unix_ms=1)

    async def Reserve(self, request, context):
        self.log.append(("Directory.Reserve", request.manifest.transfer_id))
        self.manifests.append(request.manifest)
        return directory_pb2.TxnResponse(transfer_id=request.manifest.transfer_id,
                                         outcome=directory_pb2.TXN_OUTCOME_APPLIED)

    async def Abort(self, request, context):
        self.log.append(("Directory.Abort", request.transfer_id, request.worker_id, request.reason))
        return directory_pb2.TxnResponse(transfer_id=request.transfer_id, outcome=directory_pb2.TXN_OUTCOME_APPLIED)

    async def ListOpenTransactions(self, request, context):
        return directory_pb2.ListOpenTransactionsResponse(transactions=self.open)

    release = None

    async def GetRelease(self, request, context):
        return directory_pb2.GetReleaseResponse(found=self.release is not None, record=self.release)

    async def WriteRelease(self, request, context):
        old = record_from_pb(self.release) if self.release is not None else None
        check_write(old, record_from_pb(request.record))  # the real directory's check (kv_directory/release.py)
        self.release = request.record
        return directory_pb2.WriteReleaseResponse(outcome=directory_pb2.TXN_OUTCOME_APPLIED, current=self.release)


def info(name: str, role: int, address: str, free: int = 64) -> common_pb2.WorkerInfo:
    return common_pb2.WorkerInfo(worker_id=name, role=role, grpc_address=address, data_plane_address=f"dp-{name}",
                                 cache_abi_digest="abi", capacity=CAP, epoch=3,
                                 load=common_pb2.LoadReport(free_blocks=free, reserved_blocks=2, total_blocks=64))


@contextlib.asynccontextmanager
async def rig(gap_s: float = 0.0, **config):
    """Fake p0 (prefill), d0 and d1 (decode), a fake directory, and the router."""
    log, published, servers = Log(), {}, []
    directory = FakeDirectory(log)
    d_server, d_port, _ = await start_server("127.0.0.1:0", [
        (directory_pb2_grpc.add_DirectoryServicer_to_server, directory, "pd.v1.Directory")],
        pki.security("directory", "directory"), DIRECTORY_ACCESS)
    servers.append(d_server)
    fakes = {}
    for name, role in (("p0", common_pb2.WORKER_ROLE_PREFILL), ("d0", common_pb2.WORKER_ROLE_DECODE),
                       ("d1", common_pb2.WORKER_ROLE_DECODE)):
        if role == common_pb2.WORKER_ROLE_PREFILL:
            fake, add, svc = (FakePrefill(name, log, published), prefill_pb2_grpc.add_PrefillServicer_to_server,
                              "pd.v1.Prefill")
        else:
            fake, add, svc = (FakeDecode(name, log, published, gap_s), decode_pb2_grpc.add_DecodeServicer_to_server,
                              "pd.v1.Decode")
        registration = [(add, fake, svc)]
        cert_role = "prefill" if role == common_pb2.WORKER_ROLE_PREFILL else "decode"
        server, port, _ = await start_server("127.0.0.1:0", registration, pki.security(cert_role, name),
                                             router_only(registration))
        servers.append(server)
        fakes[name] = fake
        directory.workers.append(info(name, role, f"127.0.0.1:{port}", free=64 if name == "d0" else 32))
    cfg = RouterConfig(listen_addr="127.0.0.1:0", directory_addr=f"127.0.0.1:{d_port}", snapshot_max_age_ms=0, **config)
    orch = build(cfg, pki.security("router", "router"), capabilities=pki.capability_settings())
    server, port, _ = await start(cfg, orch, pki.security("router", "router"))
    channel = pki.security("operator", "ops").aio_channel(f"127.0.0.1:{port}", "router")
    try:
        yield (router_pb2_grpc.RouterStub(channel), admin_pb2_grpc.AdminStub(channel), log, fakes, directory, orch)
    finally:
        await channel.close()
        await server.stop(0)
        await orch.close()
        for s in servers:
            await s.stop(0)


def request(request_id="r1", max_tokens=4, **kw) -> router_pb2.GenerateRequest:
    kw.setdefault("prompt_token_ids", common_pb2.TokenIds(ids=PROMPT))
    return router_pb2.GenerateRequest(request_id=request_id, tenant="acme", max_tokens=max_tokens, **kw)


def run(coro, timeout_s: float = 20.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def test_generate_disaggregated_over_grpc():
    async def go():
        async with rig() as (router, _, log, fakes, directory, _):
            sampling = common_pb2.SamplingParams(temperature=0.7, top_k=5, seed=11, stop_token_ids=[2])
            events = [ev async for ev in router.Generate(request(sampling=sampling))]
            return events, log, directory.manifests, fakes["p0"].sampling, fakes["p0"].requests

    events, log, manifests, prefill_sampling, prefill_requests = run(go())
    # The Prefill call: the job (no destination, no capability, no chunks) beside the
    # decode's Reserve, then its grant naming the same transfer.
    job, granted = prefill_requests
    assert (job.destination_data_plane_address, job.capability, len(job.manifest.expected_chunks)) == ("", b"", 0)
    assert (job.manifest.transfer_id, job.manifest.tenant, list(job.prompt_token_ids)) == ("r1/1", "acme", PROMPT)
    assert (granted.destination_data_plane_address, granted.manifest.transfer_id) == ("dp-d0", "r1/1")
    kinds = [ev.WhichOneof("event") for ev in events]
    assert kinds == ["started"] + ["token"] * 4 + ["complete"]
    s = events[0].started
    assert (s.route, s.prefill_worker_id, s.decode_worker_id, s.generation, s.route_epoch) == \
        (router_pb2.ROUTE_DISAGGREGATED, "p0", "d0", 1, 9)
    assert [ev.token.token_id for ev in events[1:5]] == tokens(4)
    assert [ev.token.index for ev in events[1:5]] == [0, 1, 2, 3]
    c = events[-1].complete
    assert (c.finish_reason, c.num_tokens, c.route, c.attempts) == \
        (common_pb2.FINISH_REASON_LENGTH, 4, router_pb2.ROUTE_DISAGGREGATED, 1)
    assert c.prefill_kv_digest == c.decode_kv_digest == "kv-r1/1"
    assert (prefill_sampling.seed, prefill_sampling.top_k, list(prefill_sampling.stop_token_ids)) == (11, 5, [2])
    assert all(ev.request_id == "r1" for ev in events)
    m = manifests[0]
    assert (m.transfer_id, m.reservation_id, m.tenant, m.destination_epoch, m.source_epoch) == \
        ("r1/1", "r1/1", "acme", 3, 3)
    assert (m.token_interval.start, m.token_interval.end, m.block_size, m.route_epoch) == (0, 5, 4, 9)
    assert ("Prefill.Prefill", "p0", "r1", 1, "dp-d0") in log
    assert "Directory.Abort" not in log.names() and "Decode.Cancel" not in log.names()


def test_prefill_error_aborts_as_the_router_and_recovers_colocated():
    async def go():
        async with rig() as (router, _, log, fakes, _, _):
            fakes["p0"].fail = True
            events = [ev async for ev in router.Generate(request())]
            return events, log

    events, log = run(go())
    abort = next(e for e in log if e[0] == "Directory.Abort")
    assert abort[1:3] == ("r1/1", "router") and "UNAVAILABLE" in abort[3]
    assert ("Decode.Cancel", "d0", "r1", 1) in log and ("Prefill.Cancel", "p0", "r1", 1) in log
    # One prefill worker: attempt 2 is the other distinct pair (p0, d1), then colocated.
    assert [e[3] for e in log if e[0] == "Prefill.Prefill"] == [1, 2]
    started = [ev.started for ev in events if ev.WhichOneof("event") == "started"]
    assert started[-1].route == router_pb2.ROUTE_COLOCATED and events[-1].complete.attempts == 3
    assert [ev.token.token_id for ev in events if ev.WhichOneof("event") == "token"] == tokens(4)


def test_the_prefills_token_0_reaches_the_client_before_the_grant_is_written():
    """A compute shorter than the decode's Reserve: the prefill's token 0 is read and streamed
    at once, not after the grant (whose write waits for the Reserve's answer)."""
    async def go():
        async with rig() as (router, _, log, fakes, _, _):
            fakes["p0"].token_at_job = True
            fakes["d0"].reserve_s = fakes["d1"].reserve_s = 1.0
            events = []
            async for ev in router.Generate(request()):
                events.append(ev)
                if ev.WhichOneof("event") == "token" and ev.token.index == 0:
                    log.append(("client: token 0",))
            return events, log, fakes["p0"].requests

    events, log, requests = run(go())
    order = [e[0] for e in log]
    assert order.index("client: token 0") < order.index("Prefill.Prefill")  # (logged once the grant came)
    assert [ev.token.token_id for ev in events if ev.WhichOneof("event") == "token"] == tokens(4)
    assert [r.destination_data_plane_address for r in requests] == ["", "dp-d0"]


def test_a_job_refused_before_its_grant_fails_the_attempt_with_the_prefills_status():
    """The prefill ended the call at the job: writing the grant finds the call over, and the
    attempt fails with the prefill's own status and message, not the gateway's."""
    async def go():
        async with rig() as (router, _, log, fakes, _, _):
            fakes["p0"].refuse_job = True
            fakes["d0"].reserve_s = 0.1  # the refusal is back before the grant is written
            events = [ev async for ev in router.Generate(request())]
            return events, log

    events, log = run(go())
    abort = next(e for e in log if e[0] == "Directory.Abort")
    assert "FAILED_PRECONDITION" in abort[3] and "job r1/1 refused" in abort[3], abort
    assert events[-1].complete.route == router_pb2.ROUTE_COLOCATED


def test_errors_are_grpc_statuses():
    async def go():
        async with rig() as (router, _, _, fakes, _, _):
            codes = {}
            for name, req in (("empty", request(prompt_token_ids=common_pb2.TokenIds(ids=[]))),
                              ("slo", request(slo=common_pb2.Slo(ttft_ms=-5))),
                              ("vocab", request(prompt_token_ids=common_pb2.TokenIds(ids=[600]))),
                              ("mode", request(mode=99))):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    [ev async for ev in router.Generate(req)]
                codes[name] = (err.value.code(), err.value.details())
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await router.Cancel(common_pb2.CancelRequest(request_id="nope"))
            codes["cancel"] = (err.value.code(), err.value.details())
            fakes["d0"].reserve_error = fakes["d1"].reserve_error = common_pb2.Error(
                code=common_pb2.ERROR_CODE_INVALID_ARGUMENT, message="top_k too large")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                [ev async for ev in router.Generate(request())]
            codes["worker"] = (err.value.code(), err.value.details())
            return codes

    codes = run(go())
    assert codes["empty"][0] == grpc.StatusCode.INVALID_ARGUMENT and "empty" in codes["empty"][1]
    assert codes["slo"][0] == grpc.StatusCode.INVALID_ARGUMENT and "slo.ttft_ms" in codes["slo"][1]
    assert codes["vocab"][0] == grpc.StatusCode.INVALID_ARGUMENT and "vocab_size is 512" in codes["vocab"][1]
    # A mode this router does not know is refused, not served as another mode.
    assert codes["mode"][0] == grpc.StatusCode.INVALID_ARGUMENT
    assert codes["mode"][1].startswith("mode 99 is not a known pd.v1.Mode: 0 (UNSPECIFIED), 1 (DISAGGREGATED)")
    assert codes["cancel"][0] == grpc.StatusCode.NOT_FOUND
    assert codes["worker"] == (grpc.StatusCode.INVALID_ARGUMENT, "top_k too large")


def test_client_cancel_and_router_cancel_reach_prefill_and_decode():
    async def go():
        async with rig(gap_s=0.05) as (router, _, log, _, _, orch):
            call = router.Generate(request("c1", max_tokens=100))
            seen = 0
            async for ev in call:
                seen += ev.WhichOneof("event") == "token"
                if seen == 2:
                    call.cancel()
                    break
            for _ in range(100):
                if orch.in_flight == 0:
                    break
                await asyncio.sleep(0.02)
            call2 = router.Generate(request("c2", max_tokens=100))
            events = []
            async for ev in call2:
                events.append(ev)
                if ev.WhichOneof("event") == "token" and ev.token.index == 1:
                    resp = await router.Cancel(common_pb2.CancelRequest(request_id="c2", reason="stop"))
                    assert resp.found
            return log, events

    log, events = run(go())
    for rid in ("c1", "c2"):
        assert ("Decode.Cancel", "d0", rid, 1) in log and ("Prefill.Cancel", "p0", rid, 1) in log
    done = events[-1].complete
    assert done.finish_reason == common_pb2.FINISH_REASON_CANCELLED and done.num_tokens >= 2


def test_admin_status_release_and_transactions():
    async def go():
        async with rig() as (router, admin, log, _, directory, _):
            status = await admin.Status(admin_pb2.StatusRequest())
            release = await admin.ReleaseStatus(admin_pb2.ReleaseStatusRequest())
            with pytest.raises(grpc.aio.AioRpcError) as err:  # ACTIVE -> PINNED is no transition
                await admin.SetMode(admin_pb2.SetModeRequest(mode=admin_pb2.RELEASE_MODE_PINNED, reason="drill"))
            txns = await admin.ListTransactions(admin_pb2.ListTransactionsRequest(tenant="a", limit=1))
            none = await admin.ListTransactions(admin_pb2.ListTransactionsRequest(
                states=[manifest_pb2.TXN_STATE_RESERVED]))
            assert not none.transactions
            return status, release, err.value, txns, directory.release

    status, release, refused, txns, stored = run(go())
    assert [w.worker_id for w in status.workers] == ["d0", "d1", "p0"]
    assert (status.free_blocks, status.reserved_blocks, status.total_blocks) == (96, 4, 128)
    assert (status.open_transactions, status.mode, status.route_epoch) == (5, admin_pb2.RELEASE_MODE_ACTIVE, 9)
    # The first router to see a worker records the release: its configured mode's state, manifest frozen.
    assert (release.record.mode, release.record.version, release.router_mode) == \
        (admin_pb2.RELEASE_MODE_ACTIVE, 1, "disaggregated")
    assert release.record == stored and release.record.manifest.cache_abi_digests == ["abi"]
    assert release.record.manifest.roles == ["decode=2", "prefill=1"] and len(release.record.manifest.digest) == 64
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION and "ACTIVE -> PINNED" in refused.details()
    assert [(t.transfer_id, t.state, t.source_worker_id) for t in txns.transactions] == \
        [("x/3", manifest_pb2.TXN_STATE_TRANSFERRING, "p0")]


def test_command_line_overrides_the_environment(monkeypatch):
    monkeypatch.setenv("PD_ROUTER_MODE", "colocated")
    monkeypatch.setenv("PD_ROUTER_MAX_TOKENS", "77")
    cfg = parse_args(["--listen", "127.0.0.1:1", "--directory", "127.0.0.1:2", "--model", "tiny"])
    assert (cfg.listen_addr, cfg.directory_addr, cfg.model, cfg.default_mode, cfg.max_tokens_limit) == \
        ("127.0.0.1:1", "127.0.0.1:2", "tiny", "colocated", 77)
    assert parse_args(["--mode", "disaggregated"]).default_mode == "disaggregated"
    with pytest.raises(ValueError):
        RouterConfig(default_mode="sideways")
