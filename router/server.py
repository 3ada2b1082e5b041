"""Router gRPC servicer (thin: proto -> GenerateParams -> Orchestrator -> proto)
and the process wiring: Router + Admin on one server with health and reflection.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from pdserve_client import contract
from pdserve_client.rpc.pd.v1 import admin_pb2, admin_pb2_grpc, common_pb2, router_pb2, router_pb2_grpc
from router import convert, native
from router.admin import AdminServicer
from router.config import RouterConfig
from router.edge.budget import IntakeBudget
from router.edge.heap import Heap
from router.edge.intake import Intake, add_router_servicer
from router.edge.refusal import Refusal, bounded, quote, too_long
from router.gateway import DirectoryGateway, WorkerGateway
from router.grpc_gateway import GrpcDirectoryGateway, GrpcWorkerGateway, grpc_code
from router.http.front import start_front
from router.identity import caller_tenant
from router.release.controller import ReleaseController
from router.release.manifest import tokenizer_identity
from router.requests.handoff import grant
from router.requests.orchestrator import Orchestrator
from router.requests.request_run import RequestRun
from router.types import RouterError, StatusCode
from runtime.common.grpc_server import start_server, wait_for_shutdown
from runtime.common.heap import freeze_startup_heap
from runtime.security.capability import Signer
from runtime.security.config import CapabilitySettings, signer
from runtime.security.tls import Security, access_table, caller_name
from runtime.telemetry.endpoint import serve_metrics

log = logging.getLogger(__name__)

ROUTER_SERVICE = router_pb2.DESCRIPTOR.services_by_name["Router"].full_name
ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name

_USERS = frozenset({"client", "operator"})
ACCESS = {
    **access_table(ROUTER_SERVICE, {"Generate": _USERS, "Cancel": _USERS}),
    # Reads are open to clients (each sees its own tenant's requests); changes, and Blocks
    # (every tenant's holdings), need an operator.
    **access_table(ADMIN_SERVICE, {"Status": _USERS, "Decisions": _USERS, "ListTransactions": _USERS,
                                   "ReleaseStatus": _USERS, "SetMode": {"operator"}, "Promote": {"operator"},
                                   "Rollback": {"operator"}, "Blocks": {"operator"}}),
}
"""Who may call what (runtime/security/tls.py `Access`)."""
MAX_REASON_CHARS = 256
"""A cancel's reason is kept up to this many characters."""


class RouterServicer(router_pb2_grpc.RouterServicer):
    """pd.v1.Router over an Orchestrator. Errors end the RPC with their status, never as an
    in-band error event; refusals set it and return (`_refuse`) rather than abort, whose
    exception would keep the frames holding the request."""

    def __init__(self, orchestrator: Orchestrator, secure: bool = False):
        self._orch = orchestrator
        self._secure = secure
        self.intake = Intake(orchestrator.view, IntakeBudget(orchestrator.config.intake_bytes))
        self.heap = Heap()

    async def Generate(self, request: bytes, context):
        """`request`: the GenerateRequest's wire bytes (router/edge/intake.py reads them)."""
        self.heap.trim_after(context, len(request))
        async with self.intake.read(request, caller_tenant(context, self._secure), context.time_remaining()) as read:
            run = read if isinstance(read, Refusal) else await self._submit(read)
        if isinstance(run, Refusal):
            _refuse(context, run)
            return
        request_id = run.req.request_id
        try:
            async for event in run.stream():
                yield convert.event_to_pb(request_id, event)
        except RouterError as exc:
            _refuse(context, Refusal.of(exc))
        finally:
            run.cancel("client went away")  # no-op once the request finished

    async def _submit(self, params) -> RequestRun | Refusal:
        try:
            return await self._orch.submit(params)
        except RouterError as exc:
            return Refusal.of(exc)

    async def Cancel(self, request, context):
        refusal = _cancel_refusal(request)
        if refusal is not None:
            return _refuse(context, refusal)
        reason = request.reason[:MAX_REASON_CHARS]  # it reappears in the request's CANCELLED status
        log.info("cancel of %s by %s: %s", request.request_id, caller_name(context), reason or "no reason")
        if not await self._orch.cancel(request.request_id, reason, caller_tenant(context, self._secure)):
            return _refuse(context, Refusal(StatusCode.NOT_FOUND, f"no in-flight request {quote(request.request_id)}"))
        return common_pb2.CancelResponse(request_id=request.request_id, found=True)


def _cancel_refusal(request: common_pb2.CancelRequest) -> Refusal | None:
    if not request.request_id:
        return Refusal(StatusCode.INVALID_ARGUMENT, "request_id is required")
    size = len(request.request_id.encode())
    if size > contract.MAX_REQUEST_ID_BYTES:
        return too_long("request_id", size, contract.MAX_REQUEST_ID_BYTES)
    return None


def _refuse(context, refusal: Refusal) -> None:
    """End the call with `refusal`'s status (the handler returns next); its message bounded
    (router/edge/refusal.py)."""
    context.set_code(grpc_code(refusal.code))
    context.set_details(bounded(refusal.message))


def build(config: RouterConfig, security: Security, tokenizer: Any | None = None,
          workers: WorkerGateway | None = None, directory: DirectoryGateway | None = None,
          capabilities: CapabilitySettings | None = None) -> Orchestrator:
    """The orchestrator over gRPC gateways (or the given ones), minting transfer
    capabilities with the key `capabilities` (default: PD_CAPABILITY_*) names."""
    caps = capabilities or CapabilitySettings.from_env()
    sign = signer(caps, security)
    mint = None if sign is None else functools.partial(_mint, sign, caps.ttl_ms)
    return Orchestrator(workers or GrpcWorkerGateway(security),
                        directory or GrpcDirectoryGateway(config.directory_addr, security, config.router_id,
                                                          config.directory_timeout_s),
                        config, tokenizer, mint=mint)


def _mint(sign: Signer, ttl_ms: int, manifest, reservation) -> bytes:
    """The attempt's capability; none for a transfer set with no chunk (no byte moves)."""
    if not manifest.expected_chunks:
        return b""
    return sign.mint(grant(manifest, reservation, ttl_ms)).raw


async def start(config: RouterConfig, orchestrator: Orchestrator, security: Security, ready: bool = True,
                release: ReleaseController | None = None):
    """Start Router + Admin on config.listen_addr; returns (server, port, health servicer)
    (health NOT_SERVING until `health.ready(True)` unless `ready`). `release`: the
    controller Admin moves the release with (default: one that does not follow in the
    background)."""
    release = release or ReleaseController(orchestrator, config.router_id, config,
                                           tokenizer_identity(orchestrator.tokenizer))
    admin = AdminServicer(orchestrator, release, security.secure)
    return await start_server(config.listen_addr, [
        (add_router_servicer, RouterServicer(orchestrator, security.secure), ROUTER_SERVICE),
        (admin_pb2_grpc.add_AdminServicer_to_server, admin, ADMIN_SERVICE),
    ], security, ACCESS, ready=ready)


async def ready_once_directory_answers(orchestrator: Orchestrator, health, retry_s: float = 0.5) -> None:
    """Readiness: SERVING once the first cluster snapshot came from the directory. It stays
    SERVING through a later directory outage (the router then serves colocated requests
    from its last snapshot: router/requests/cluster_view.py)."""
    while True:
        try:
            await orchestrator.view.get(0.0)
        except RouterError as exc:
            log.warning("not ready: %s", exc.message)
            await asyncio.sleep(retry_s)
            continue
        await health.ready(True)
        return


async def serve(config: RouterConfig, security: Security, tokenizer: Any | None = None) -> None:
    """Serve until SIGTERM/SIGINT, then cancel in-flight requests (their workers
    get Cancel) and stop."""
    Heap().tune()
    orchestrator = build(config, security, tokenizer)
    release = ReleaseController(orchestrator, config.router_id, config, tokenizer_identity(tokenizer))
    server, port, health = await start(config, orchestrator, security, ready=False, release=release)
    http = await start_front(config, orchestrator, security)
    release.start()
    readiness = asyncio.create_task(ready_once_directory_answers(orchestrator, health), name="readiness")
    metrics = serve_metrics(config.metrics_listen, orchestrator.metrics.registry, security)
    compiled = native.status()
    log.info("router on port %d (directory %s, default mode %s, tokenizer %s, per-request modules compiled %d/%d%s)",
             port, config.directory_addr, config.default_mode, "yes" if tokenizer is not None else "no",
             sum(compiled.values()), len(compiled),
             "" if all(compiled.values()) else
             f"; from source: {', '.join(m for m, c in compiled.items() if not c)}"
             + ("" if native.enabled() else f" ({native.ENV}=0)"))
    freeze_startup_heap()
    try:
        await wait_for_shutdown(server, health, on_stop=orchestrator.close)
    finally:
        if http is not None:
            await http.close()
        readiness.cancel()
        await release.close()
        if metrics is not None:
            metrics.close()
