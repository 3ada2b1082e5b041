"""One worker process, whatever phases it serves.

`WorkerNode` builds what every worker has, in this order: the engine loop (with
its start-up self-check), the calibrated cost profile, each role's data-plane
endpoint and worker, the gRPC server (health NOT_SERVING), directory membership
with its heartbeat (health SERVING once registered with a live lease:
runtime/worker/membership.py), its /metrics endpoint (runtime/telemetry).

Readiness: the self-check is decided before the server starts, so a worker that
reports SERVING has its verdict registered; a worker whose check failed is
SERVING too, for the colocated requests it takes (it registered colocated-only,
so no router hands K/V to or from it).

Drain on SIGTERM (Kubernetes sends it after preStop), in this order:
  1. health NOT_SERVING; new work refused: Reserve, Prefill and Generate fail
     UNAVAILABLE ("draining"), so the router retries them elsewhere
  2. in-flight requests finish (streams, transfers, decodes already accepted),
     for PD_DRAIN_TIMEOUT_S at most; the lease is renewed meanwhile
  3. each role gives back what it holds (a decode role aborts its unpublished
     transactions, freeing their blocks, while the lease still stands)
  4. deregister: the directory drops the worker now, not after its lease TTL
  5. endpoints closed, the server stopped; the process exits 0

A role is one phase: `prefill` (serves pd.v1.Prefill, sends K/V) or `decode`
(serves pd.v1.Decode, receives K/V). A node with both is the mixed worker
(directory role MIXED): the router may run a colocated request on it, decode a
split one on it, or prefill a split one on it for another decode worker. Roles
are found by name through the `pdserve.worker_roles` entry points (see
pyproject.toml), so this shared module imports neither service, and neither
service imports the other.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from importlib.metadata import entry_points
from typing import ClassVar

import grpc
from google.protobuf import descriptor_pool

from pdserve_client.spans import EVENT_CAPABILITY_DENIED, REASON
from runtime.common.grpc_server import RefuseWhen, Registration, setup_logging, start_server, wait_for_shutdown
from runtime.common.heap import freeze_startup_heap
from runtime.common.settings import SettingsError
from runtime.directory.client import DirectoryClient
from runtime.directory.records import LoadReport, WorkerInfo, WorkerRole
from runtime.security.tls import Security, access_table
from runtime.telemetry import tracing
from runtime.telemetry.catalog import WorkerMetrics
from runtime.telemetry.endpoint import serve_metrics
from runtime.transfer.factory import loggable

from .blocks import registration as blocks_registration
from .config import NodeConfig
from .directory_ops import TxnOps
from .holdings import Claim
from .loop import EngineLoop
from .membership import Membership
from .process import advertised, block_counts, build_engine_loop, capacity, parse_config
from .profile import ProfileConfig, active_context_tokens, obtain

log = logging.getLogger(__name__)

ROLE_GROUP = "pdserve.worker_roles"


class Role(abc.ABC):
    """One phase a node serves. `start` builds the role's endpoint and worker on the
    node's loop and returns its gRPC registration; the rest are hooks with defaults."""

    name: ClassVar[str]

    @abc.abstractmethod
    async def start(self, node: WorkerNode) -> Registration:
        """Build and start the role (its data-plane endpoint first); its servicer."""

    @property
    def data_plane_address(self) -> str:
        """Where peers send this role K/V ("" when it receives none)."""
        return ""

    @property
    def transports(self) -> list:
        """Its data-plane endpoints (their own figures are exported on /metrics)."""
        return []

    def reserved_blocks(self) -> int:
        """Blocks it holds reserved for transfers not yet published."""
        return 0

    def in_flight(self) -> int:
        """Requests it accepted and has not finished (a drain waits for 0)."""
        return 0

    def waiting_prompt_tokens(self) -> int:
        """Prompt tokens of jobs it holds before the engine's queue (waiting for blocks)."""
        return 0

    def claims(self) -> dict[int, Claim]:
        """Event loop: the sequences its records hold, id(sequence) -> Claim (its state for
        WorkerAdmin.Blocks, runtime/worker/holdings.py)."""
        return {}

    async def on_lease_lost(self) -> None:
        """The directory expired this node's lease (and aborted its unpublished transactions)."""

    async def stop(self) -> None:
        """Give back what it holds, while the node is still registered."""

    async def close(self) -> None:
        """Close its endpoints, after the node left the directory."""


def pending_prefill_tokens(loop: EngineLoop, roles: list[Role]) -> int:
    """Prompt tokens not computed yet: the engine's queue and the jobs waiting for blocks."""
    return loop.pending_prefill_tokens + sum(r.waiting_prompt_tokens() for r in roles)


def load_role(name: str) -> Role:
    """The role registered under `name` in the `pdserve.worker_roles` entry points."""
    found = {ep.name: ep for ep in entry_points(group=ROLE_GROUP)}
    if name not in found:
        raise ValueError(f"no worker role {name!r} (installed: {', '.join(sorted(found)) or 'none'}; "
                         "is the package installed?)")
    return found[name].load()()


def directory_role(roles: list[Role]) -> WorkerRole:
    names = {r.name for r in roles}
    if names == {"prefill"}:
        return WorkerRole.PREFILL
    if names == {"decode"}:
        return WorkerRole.DECODE
    if names == {"prefill", "decode"}:
        return WorkerRole.MIXED
    raise ValueError(f"a worker serves prefill, decode or both, not {sorted(names)}")


class WorkerNode:
    """What every worker process has; its roles plug in (see the module docstring)."""

    def __init__(self, cfg: NodeConfig, loop: EngineLoop, directory: DirectoryClient,
                 security: Security | None = None):
        self.cfg = cfg
        self.security = security or Security.insecure()
        """This process's TLS identity (its data-plane endpoints use it too)."""
        self.loop = loop
        self.directory = directory
        self.membership: Membership | None = None
        self.txn = TxnOps(directory, cfg.worker_id, lambda: self.epoch)
        self.metrics = WorkerMetrics()
        """This process's families (runtime/telemetry/catalog.py); roles count into it."""

    @property
    def epoch(self) -> int:
        """This node's registration epoch (0 before it registered)."""
        return self.membership.epoch if self.membership else 0

    def load(self, roles: list[Role]) -> LoadReport:
        loop = self.loop
        return LoadReport(
            pending_prefill_tokens=pending_prefill_tokens(loop, roles), active_decode_batch=loop.active_decode,
            active_context_tokens=active_context_tokens(loop),
            connector_disabled=int(self.membership is not None and self.membership.routes_stopped),
            **block_counts(loop.engine, sum(r.reserved_blocks() for r in roles)))


async def run_node(role: str, argv: list[str] | None = None) -> None:
    """Run a worker process serving `role` (and prefill too for a decode worker with
    --serve-prefill) until SIGTERM (the body of
    `python -m prefill_worker` and `python -m decode_worker`)."""
    cfg, role_names = parse_config(role, argv)
    setup_logging(cfg.worker_id, cfg.log_level)
    roles = [load_role(name) for name in role_names]
    kind = directory_role(roles)
    security = worker_security(cfg.worker_id, kind)
    tracing.configure(_CERT_ROLE[kind], cfg.worker_id, files=security.files)
    loop, check = build_engine_loop(cfg)
    loop.start()
    profile = await loop.call(lambda e: obtain(e, ProfileConfig.from_env()))  # before serving: nothing else runs
    node = WorkerNode(cfg, loop, DirectoryClient(cfg.directory_addr, cfg.rpc_timeout_s, security), security)
    registrations = [await role.start(node) for role in roles] + [blocks_registration(node, roles)]
    server, port, health = await start_server(
        cfg.listen, registrations, security, router_only(registrations), ready=False, new_work=NEW_WORK,
        draining_message=f"worker {cfg.worker_id} is draining (shutting down) and takes no new work; "
                         "retry on another worker", refusals=[connector_off(node)])
    data_plane = next((r.data_plane_address for r in roles if r.data_plane_address), "")

    async def lease_lost() -> None:
        for role in roles:
            await role.on_lease_lost()

    node.membership = Membership(
        node.directory, WorkerInfo(cfg.worker_id, kind, advertised(cfg, port), data_plane, loop.engine.abi.digest,
                                   capacity(cfg, loop), profile, check.reason,
                                   loop.engine.abi.model_identity, node.txn.sealer.public),
        lambda: node.load(roles), on_lease_lost=lease_lost, on_ready=health.ready,
        report_change=cfg.load_report_change, min_report_interval_s=cfg.load_report_min_interval_s)
    await node.membership.start()

    def reserved() -> int:
        return sum(r.reserved_blocks() for r in roles)

    node.metrics.bind(lambda: loop.engine.num_free_blocks, reserved, lambda: loop.engine.num_blocks,
                      lambda: pending_prefill_tokens(loop, roles), lambda: loop.active_decode,
                      [loop, *(t for role in roles for t in role.transports)])
    metrics = serve_metrics(cfg.metrics_listen, node.metrics.registry, security)
    log.info("%s worker %s serving on %s%s", kind.value, cfg.worker_id, advertised(cfg, port),
             f", data plane {loggable(data_plane)}" if data_plane else "")
    freeze_startup_heap()

    async def on_stop() -> None:
        node.membership.leaving = True
        await drain(roles, cfg.drain_timeout_s)
        if metrics is not None:
            metrics.close()
        for role in roles:
            await role.stop()
        await node.membership.leave(min(cfg.rpc_timeout_s, 2.0))
        for role in roles:
            await role.close()
        await node.directory.close()
        loop.stop()
        tracing.shutdown()

    await wait_for_shutdown(server, health, on_stop=on_stop)


NEW_WORK = ("/pd.v1.Decode/Reserve", "/pd.v1.Decode/Generate", "/pd.v1.Prefill/Prefill")
"""The calls that start new work on a worker: refused once it drains."""

TRANSFER_WORK = ("/pd.v1.Decode/Reserve", "/pd.v1.Prefill/Prefill")
"""The calls that start a K/V transfer: refused while a rollback disabled the connector
(colocated Generate, and the streams of transfers already published, still run)."""


def connector_off(node: WorkerNode) -> RefuseWhen:
    """Refuse TRANSFER_WORK FAILED_PRECONDITION while the directory says routes are stopped."""
    message = (f"worker {node.cfg.worker_id}: a rollback disabled the K/V connector; it takes no transfer "
               "work (run the request colocated)")
    return RefuseWhen(TRANSFER_WORK, lambda: message if node.membership and node.membership.routes_stopped
                      else None, grpc.StatusCode.FAILED_PRECONDITION)


async def drain(roles: list[Role], budget_s: float, poll_s: float = 0.05) -> int:
    """Wait until no role has a request in flight, for `budget_s` at most; returns how many
    are left (what the roles' `stop` then aborts)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + budget_s
    left = sum(r.in_flight() for r in roles)
    if left:
        log.info("draining: %d request(s) in flight, waiting up to %.1fs", left, budget_s)
    while left and loop.time() < deadline:
        await asyncio.sleep(poll_s)
        left = sum(r.in_flight() for r in roles)
    if left:
        log.warning("drain budget of %.1fs spent: %d request(s) still in flight are stopped", budget_s, left)
    else:
        log.info("drained: nothing in flight")
    return left


_CERT_ROLE = {WorkerRole.PREFILL: "prefill", WorkerRole.DECODE: "decode", WorkerRole.MIXED: "mixed"}


def worker_security(worker_id: str, kind: WorkerRole) -> Security:
    """This worker's TLS identity; its certificate must name it (role and worker id),
    else it stops here with the reason rather than being refused by the directory."""
    security = Security.from_env(worker_id)
    who = security.identity
    if security.secure and (who is None or who.name != worker_id or who.role != _CERT_ROLE[kind]):
        raise SettingsError(f"{worker_id}: the TLS certificate names {who}, not "
                            f"{_CERT_ROLE[kind]}/{worker_id}")
    return security


def router_only(registrations: list[Registration]) -> dict[str, frozenset[str]]:
    """Every method of the worker's services: only the router calls them."""
    table: dict[str, frozenset[str]] = {}
    for _, _, full_name in registrations:
        service = descriptor_pool.Default().FindServiceByName(full_name)
        table.update(access_table(full_name, {m.name: {"router"} for m in service.methods}))
    return table


def _verifier(node: WorkerNode):
    from runtime.security.config import CapabilitySettings, verifier
    return verifier(CapabilitySettings.from_env(), node.security)


def _denied(node: WorkerNode, reason: str) -> None:
    """A capability was refused: counted, and an event on the current span (the call's
    that presented it; none on the data plane, where the reservation's trace notes it)."""
    node.metrics.denied(reason)
    tracing.event(EVENT_CAPABILITY_DENIED, {REASON: reason})


def source_gate(node: WorkerNode):
    """The prefill role's capability check (None when security is off and no keys are set)."""
    from runtime.worker.capabilities import SourceGate
    v = _verifier(node)
    return None if v is None else SourceGate(v, node.cfg.worker_id, lambda: node.epoch, node.loop.engine.abi.digest,
                                             lambda reason: _denied(node, reason))


def destination_gate(node: WorkerNode):
    """The decode role's capability check; nonces are consumed through the directory."""
    from runtime.worker.capabilities import DestinationGate
    v = _verifier(node)
    return None if v is None else DestinationGate(v, node.cfg.worker_id, lambda: node.epoch,
                                                  node.loop.engine.abi.digest, node.directory.consume_nonce,
                                                  lambda reason: _denied(node, reason))
