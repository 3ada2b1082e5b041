"""Readiness and drain at the gRPC server (runtime/common/grpc_server.py): health is
NOT_SERVING until the process says it is ready, follows `ready`, and is NOT_SERVING for
good once draining, when the calls that start new work fail UNAVAILABLE with the
reason while every other call (a stream already accepted, a cancel) still runs.
A real asyncio server on loopback, plaintext; no worker behind it."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pdserve_client.rpc.pd.v1 import common_pb2, decode_pb2, decode_pb2_grpc, prefill_pb2, prefill_pb2_grpc
from runtime.common.grpc_server import start_server
from runtime.security.tls import Security
from runtime.worker.config import NodeConfig
from runtime.worker.node import NEW_WORK
from runtime.worker.process import advertised

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


class Decode(decode_pb2_grpc.DecodeServicer):
    """Answers Reserve, Generate (two tokens) and Cancel at once."""

    async def Reserve(self, request, context):
        return decode_pb2.DecodeReserveResponse(request_id=request.request_id)

    async def Generate(self, request, context):
        for i in range(2):
            yield decode_pb2.TokenEvent(request_id=request.request_id, token=decode_pb2.TokenEvent.Token(index=i))

    async def Cancel(self, request, context):
        return common_pb2.CancelResponse(request_id=request.request_id, found=True)


class Prefill(prefill_pb2_grpc.PrefillServicer):
    """Answers a Prefill (its job, then its grant: a bidirectional call) once both came."""

    async def Prefill(self, request_iterator, context):
        requests = [r async for r in request_iterator]
        yield prefill_pb2.PrefillEvent(result=prefill_pb2.PrefillResult(
            request_id=requests[0].manifest.request_id, sent_chunks=len(requests)))


async def prefill(stub, request_id: str, grant: bool = True) -> prefill_pb2.PrefillResult:
    """The job, then (`grant`) its grant, as the router writes them; the call's result."""
    call = stub.Prefill(timeout=2)
    await call.write(prefill_pb2.PrefillRequest(manifest={"request_id": request_id}))
    if grant:
        await call.write(prefill_pb2.PrefillRequest(destination_data_plane_address="d"))
        await call.done_writing()
    return [e async for e in call][-1].result


async def statuses(channel) -> set[int]:
    stub = health_pb2_grpc.HealthStub(channel)
    return {(await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=2)).status
            for name in ("", "pd.v1.Decode")}


def test_health_follows_readiness_and_a_draining_server_refuses_new_work_only():
    async def main():
        server, port, health = await start_server(
            "127.0.0.1:0", [(decode_pb2_grpc.add_DecodeServicer_to_server, Decode(), "pd.v1.Decode"),
                            (prefill_pb2_grpc.add_PrefillServicer_to_server, Prefill(), "pd.v1.Prefill")],
            Security.insecure(), {}, ready=False, new_work=NEW_WORK, draining_message="worker w is draining")
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = decode_pb2_grpc.DecodeStub(channel)
                prefills = prefill_pb2_grpc.PrefillStub(channel)
                assert await statuses(channel) == {NOT_SERVING}
                await health.ready(True)
                assert await statuses(channel) == {SERVING}
                await health.ready(False)  # a lease lost
                assert await statuses(channel) == {NOT_SERVING}
                await health.ready(True)
                assert (await stub.Reserve(decode_pb2.DecodeReserveRequest(request_id="r1"), timeout=2)).request_id
                assert (await prefill(prefills, "p1")).sent_chunks == 2  # both requests reached it
                await health.enter_graceful_shutdown()  # SIGTERM
                await health.ready(True)  # a late re-registration changes nothing
                assert await statuses(channel) == {NOT_SERVING}
                for call in (stub.Reserve(decode_pb2.DecodeReserveRequest(request_id="r2"), timeout=2),
                             _first(stub.Generate(decode_pb2.DecodeGenerateRequest(request_id="r3"), timeout=2)),
                             prefill(prefills, "p2", grant=False)):
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await call
                    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
                    assert "worker w is draining" in refused.value.details()
                assert (await stub.Cancel(common_pb2.CancelRequest(request_id="r1"), timeout=2)).found
        finally:
            await server.stop(0)

    asyncio.run(main())


async def _first(stream):
    async for event in stream:
        return event


@pytest.mark.parametrize(("advertise", "registered"), [
    ("10.1.2.3", "10.1.2.3:7001"), ("10.1.2.3:9000", "10.1.2.3:9000"), ("fd00::5", "[fd00::5]:7001"),
    ("[fd00::5]:9000", "[fd00::5]:9000"), ("decode-0.pool.svc", "decode-0.pool.svc:7001"), ("", "127.0.0.1:7001"),
])
def test_pd_advertise_may_be_a_host_alone(advertise, registered):
    assert advertised(NodeConfig(advertise=advertise, listen="0.0.0.0:0"), 7001) == registered
