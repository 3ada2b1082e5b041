"""The Directory gRPC service: a thin servicer over a ``DirectoryStore``.

Each RPC is proto -> dataclass (``convert.py``) -> one or two store calls ->
proto. Store calls block (Redis round trips with timeouts), so they run on a
small thread pool and the event loop never waits on Redis.

Errors:
* a malformed request (missing id, generation 0, unknown role) -> INVALID_ARGUMENT
  naming the field;
* ``DirectoryUnavailable`` (Redis down, timing out, loading) -> UNAVAILABLE;
* a rejected transition is *not* an error: it is ``TxnResponse.outcome``.

Transitions carry the caller's identity (request id, generation, worker, epoch):
the servicer checks them against the transaction's identity with ``convert.fence``
(race-free: those fields never change after reserve), as this replica kept it from its
Reserve (``destinations.py``), else as it reads it from the record. A relayed seal is
opened by ``seals.py``.

Liveness without traffic: ``reaper.py`` calls ``store.reap_expired()`` every
``lease_ttl_s / 3`` (a dead worker leaves the snapshot, its unpublished transactions
abort) and drives readiness (health NOT_SERVING while Redis is unreachable).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kv_directory import release
from kv_directory.access import WORKER_ROLE_OF_CERT, Denied, as_worker
from kv_directory.access import rpc as _rpc
from kv_directory.config import DirectoryConfig
from kv_directory.convert import (
    initial_load,
    role_matches,
    spec_from_manifest,
    txn_response,
    txn_to_pb,
    worker_info_from_pb,
)
from kv_directory.destinations import KnownTransfers, signed_destination
from kv_directory.reaper import reap_forever
from kv_directory.seals import SealJudge
from kv_directory.store import DirectoryStore
from kv_directory.store_calls import StoreCalls
from kv_directory.transitions import ENDED, Asked, Op, Step, decide
from pdserve_client.rpc.pd.v1 import common_pb2, directory_pb2, directory_pb2_grpc
from runtime.directory.records import Transaction, TransferSpec, TxnResult, chunk_list_digest, kv_part
from runtime.directory.states import Outcome
from runtime.directory.wire import (
    OUTCOME_FROM_PB,
    BadRequest,
    chunk_layouts,
    evidence_of,
    load_from_pb,
    require,
    role_from_pb,
    worker_record_to_pb,
)
from runtime.security.capability import Verifier
from runtime.security.tls import Security, caller, caller_name
from runtime.telemetry.catalog import DirectoryMetrics

log = logging.getLogger(__name__)

T = TypeVar("T")

STORE_THREADS = 16
"""Concurrent blocking store calls; beyond this, RPCs queue (not the event loop)."""

NONCE_SKEW_MARGIN_S = 60.0
"""A nonce record outlives its capability's expiry by this much, so a verifier
whose clock lags the directory's still sees a replay as a replay."""
MAX_CAPABILITY_LIFETIME_S = 3600.0
"""A capability expiring further ahead than this is refused (a nonce record must not
be kept for years, and Redis refuses expiry times past 2^63 ms)."""


class DirectoryServicer(directory_pb2_grpc.DirectoryServicer):
    """pd.v1.Directory over a DirectoryStore. Call ``start()`` inside the event
    loop (starts the reaper) and ``close()`` at shutdown."""

    def __init__(self, store: DirectoryStore, config: DirectoryConfig, security: Security | None = None,
                 verifier: Verifier | None = None):
        self._store, self._verifier = store, verifier  # verifier: capabilities name their destination
        self._seals = SealJudge(lambda reason: self.metrics.seal_refused(reason))
        self._cfg = config
        self._secure = security is not None and security.secure
        self._lease_ttl_ms = int(config.lease_ttl_s * 1000)
        self._reaper: asyncio.Task | None = None
        self.metrics = DirectoryMetrics()  # served on /metrics (runtime/telemetry/catalog.py)
        self._abis: dict[tuple[str, int], str] = {}  # (worker id, epoch) -> its registered cache ABI
        self._known = KnownTransfers(config.record_retention_s / 2)  # identities reserved here (destinations.py)
        self._calls = StoreCalls(store, STORE_THREADS, budget_s=config.store_inline_budget_s,
                                 cool_off_s=config.store_inline_cool_off_s, on_inline=self.metrics.store_inline)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking store call on the pool."""
        return await self._calls.pooled(fn, *args)

    # ---- lifecycle ---------------------------------------------------------

    def start(self, reachable: Callable[[bool], Awaitable[None]] | None = None) -> None:
        """Start the background reaper (kv_directory/reaper.py); `reachable(ok)` when the
        store stops or starts answering it."""
        assert self._reaper is None, "started twice"
        self._reaper = asyncio.create_task(reap_forever(
            lambda: self._run(self._store.reap_expired), self._cfg.lease_ttl_s / 3, reachable), name="directory-reaper")

    async def stop_reaper(self) -> None:
        """Stop the background reaper (first step of shutdown)."""
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None

    async def close(self) -> None:
        """Stop the reaper, drain the pool, close the store. Call after the
        server stopped, so no RPC still needs the store."""
        await self.stop_reaper()
        self._calls.close()
        self._store.close()

    # ---- registry ----------------------------------------------------------

    @_rpc
    async def RegisterWorker(self, request, context):
        """New epoch and lease; aborts what the worker's previous epoch left unpublished."""
        info = worker_info_from_pb(request)
        who = as_worker(context, self._secure, info.worker_id)
        if who is not None and WORKER_ROLE_OF_CERT[who.role] != info.role.value:
            raise Denied(f"certificate {who} may not register role {info.role.value}")
        rec = await self._run(self._store.register_worker, info, initial_load(info.capacity))
        route_epoch = await self._run(self._store.get_route_epoch)
        release = await self._run(self._store.get_release)
        log.info("registered %s (%s) epoch %d at %s by %s", rec.worker_id, rec.role.value, rec.epoch,
                 rec.grpc_address, caller_name(context))
        return directory_pb2.RegisterWorkerResponse(
            epoch=rec.epoch, lease_ttl_ms=self._lease_ttl_ms, route_epoch=route_epoch,
            routes_stopped=release is not None and release.head.routes_stopped)

    @_rpc
    async def Heartbeat(self, request, context):
        """Renew the lease and replace the load report, or LOST."""
        require(request.worker_id, "worker_id")
        require(request.epoch, "epoch")
        as_worker(context, self._secure, request.worker_id)
        lease = await self._run(self._store.heartbeat, request.worker_id, request.epoch, load_from_pb(request.load))
        route_epoch = await self._run(self._store.get_route_epoch)
        ok = lease.outcome == Outcome.APPLIED
        return directory_pb2.HeartbeatResponse(
            status=directory_pb2.LEASE_STATUS_OK if ok else directory_pb2.LEASE_STATUS_LOST,
            lease_ttl_ms=self._lease_ttl_ms if ok else 0, route_epoch=route_epoch, routes_stopped=lease.routes_stopped)

    @_rpc
    async def DeregisterWorker(self, request, context):
        """Leave now, as if the lease expired (only the worker itself, at its epoch)."""
        require(request.worker_id, "worker_id")
        require(request.epoch, "epoch")
        as_worker(context, self._secure, request.worker_id)
        outcome = await self._run(self._store.deregister_worker, request.worker_id, request.epoch)
        log.info("deregister %s epoch %d by %s: %s", request.worker_id, request.epoch, caller_name(context),
                 outcome.name)
        return directory_pb2.DeregisterWorkerResponse(deregistered=outcome == Outcome.APPLIED)

    @_rpc
    async def ClusterSnapshot(self, request, context):
        """Live workers (optionally of one role, BOTH included) and the route epoch."""
        wanted = None if request.role == common_pb2.WORKER_ROLE_UNSPECIFIED else role_from_pb(request.role)
        snap = await self._run(self._store.snapshot)
        return directory_pb2.ClusterSnapshotResponse(
            workers=[worker_record_to_pb(w) for w in snap.workers if role_matches(w.role, wanted)],
            route_epoch=snap.route_epoch, snapshot_unix_ms=snap.now_ms, release_version=snap.release.version,
            release_mode=snap.release.state, routes_stopped=snap.release.routes_stopped)

    # ---- transactions ------------------------------------------------------

    @_rpc
    async def Reserve(self, request, context):
        """Create the transaction in RESERVED from the manifest."""
        spec = spec_from_manifest(request.manifest)
        await self._check_abi(request.manifest.cache_abi_digest, spec)
        # One token per call: the store's retry of this call after a lost reply answers
        # APPLIED (its own reservation), while another call's reserve stays a DUPLICATE.
        attempt = secrets.token_hex(8)
        result = await self._calls.handoff(lambda store: store.reserve(spec, attempt))
        if result.outcome is Outcome.APPLIED:
            self._known.remember(spec)
        return txn_response(result.outcome, result.txn, spec.request_id, spec.transfer_id,
                            result.request_generation)

    async def _check_abi(self, abi: str, spec) -> None:
        """The manifest's cache ABI must be the one each live end registered (the epochs
        are fixed per registration, so a later re-registration fails the reserve anyway)."""
        require(abi, "manifest.cache_abi_digest")
        ends = [(end.worker_id, end.epoch) for end in (spec.source, spec.dest)]
        if any(end not in self._abis for end in ends):  # a registration not seen yet: read them all
            if len(self._abis) > 4096:
                self._abis.clear()
            self._abis.update({(w.worker_id, w.epoch): w.cache_abi_digest
                               for w in (await self._run(self._store.snapshot)).workers})
        for end in ends:
            registered = self._abis.get(end)
            if registered is not None and registered != abi:
                raise BadRequest(f"manifest cache ABI {abi[:16]} is not the one worker {end[0]} "
                                 f"registered ({registered[:16]})")

    async def _transition(self, context, asked: Asked, op: Op, *, ends: tuple[str, ...], router: bool = False,
                          destination_only: bool = False) -> directory_pb2.TxnResponse:
        """Validate, check the caller may move this transaction (one of `ends` of it, by
        certificate, or the router when `router`), then the rest in one pool job
        (kv_directory/transitions.py): ``op`` checks the request and names its store call,
        the fence, the call."""
        for name in ("request_id", "transfer_id", "generation", "worker_id"):
            require(getattr(asked, name), name)
        who = caller(context) if self._secure else None
        if self._secure and not (router and who is not None and who.role == "router"):
            as_worker(context, self._secure, asked.worker_id)
        response = await self._calls.handoff(decide, self._known.get(asked.transfer_id), asked, op, who, ends,
                                             destination_only)
        if response.state in ENDED:
            self._known.forget(asked.transfer_id)
        return response

    def _simple(self, context, r, op: Op, **kw: Any):
        return self._transition(context, Asked(r.request_id, r.transfer_id, r.generation, r.worker_id,
                                               r.worker_epoch), op, **kw)

    @_rpc
    async def Begin(self, request, context):
        """RESERVED -> TRANSFERRING, and the source's declaration once it has one: its K/V
        digest with the chunk list and each chunk's checksum (kept as one evidence string)."""
        def begin(store: DirectoryStore, _spec: TransferSpec, _txn: Transaction | None) -> Step:
            declared = ""
            if request.kv_digest:
                require(request.chunks, "chunks (the source's chunk list with checksums, declared with the digest)")
                declared = evidence_of(request.kv_digest, request.chunks)
            return functools.partial(store.begin, request.transfer_id, declared)
        return await self._simple(context, request, begin, ends=("source",))

    @_rpc
    async def Validated(self, request, context):
        """TRANSFERRING -> VALIDATED iff the destination's K/V digest is the source's and
        the chunks it received are the manifest's (else CHECKSUM_CONFLICT)."""
        require(request.kv_digest, "kv_digest")
        held, chunks = evidence_of(request.kv_digest, request.chunks), chunk_list_digest(chunk_layouts(request.chunks))
        return self._publication(await self._simple(context, request, lambda store, _spec, _txn: functools.partial(
            store.validated, request.transfer_id, held, chunks),
            ends=("destination",), destination_only=True))

    @_rpc
    async def Publish(self, request, context):
        """VALIDATED -> PUBLISHED, compare-and-set on the current generation; with the
        received chunks, Validated's judgement first, in the same store operation; with
        the source's seal over them (kv_directory/seals.py), its declaration before that."""
        r = request
        require(r.kv_digest, "kv_digest")

        def publish(store: DirectoryStore, spec: TransferSpec, txn: Transaction | None) -> Step | None:
            if r.chunks or r.source_seal:
                held = evidence_of(r.kv_digest, r.chunks)
                if r.source_seal:  # opened on the identity; a seal that does not open, judged on the record
                    if txn is None and not self._seals.opens(store, spec, r.source_seal, held):
                        return None
                    if txn is not None and self._seals.why_not(store, txn, r.source_seal, held):
                        return lambda: TxnResult(Outcome.CHECKSUM_CONFLICT, txn)
                return functools.partial(store.validate_publish, r.transfer_id, r.generation, held,
                                         chunk_list_digest(chunk_layouts(r.chunks)), bool(r.source_seal))
            if txn is None:
                return None
            # The stored declaration (digest + checksums) never changes once made: repeat it
            # when the destination's digest is its K/V part.
            held = txn.kv_digest if kv_part(txn.kv_digest) == r.kv_digest else r.kv_digest
            return functools.partial(store.publish, r.transfer_id, r.generation, held)
        return self._publication(await self._transition(
            context, Asked(r.request_id, r.transfer_id, r.generation, r.destination_worker_id, r.destination_epoch),
            publish, ends=("destination",), destination_only=True))

    def _publication(self, response: directory_pb2.TxnResponse) -> directory_pb2.TxnResponse:
        """`response` to Validated or Publish, counted when not applied (pd_publication_rejects_total)."""
        self.metrics.publication(OUTCOME_FROM_PB[response.outcome].name)
        return response

    @_rpc
    async def Abort(self, request, context):
        """Any unpublished state -> ABORTED (idempotent); logged with the caller."""
        log.info("abort of %s by %s: %s", request.transfer_id, caller_name(context), request.reason or "no reason")
        return await self._simple(context, request, lambda store, _spec, _txn: functools.partial(
            store.abort, request.transfer_id, request.reason or "aborted"), ends=("source", "destination"),
            router=True)

    @_rpc
    async def Release(self, request, context):
        """PUBLISHED -> RELEASED."""
        return await self._simple(context, request, lambda store, _spec, _txn: functools.partial(
            store.release, request.transfer_id),
                                  ends=("source", "destination"))

    @_rpc
    async def Lookup(self, request, context):
        """One transaction with its manifest. Both ids are required: the store is
        keyed by transfer id and has no per-request index without the tenant."""
        require(request.request_id, "request_id")
        require(request.transfer_id, "transfer_id")
        txn = await self._run(self._store.lookup, request.transfer_id)
        if txn is None or txn.spec.request_id != request.request_id:
            return directory_pb2.TxnLookupResponse(found=False)
        return directory_pb2.TxnLookupResponse(found=True, transaction=txn_to_pb(txn))

    @_rpc
    async def ListOpenTransactions(self, request, context):
        """Unpublished transactions, optionally of one worker."""
        txns = await self._run(self._store.list_open, request.worker_id or None)
        return directory_pb2.ListOpenTransactionsResponse(transactions=[txn_to_pb(t) for t in txns])

    # ---- route epoch and nonces --------------------------------------------

    @_rpc
    async def GetRouteEpoch(self, request, context):
        """Current route epoch."""
        pubs = await self._run(self._store.publications, request.publications_of) if request.publications_of else 0
        return directory_pb2.RouteEpochResponse(route_epoch=await self._run(self._store.get_route_epoch),
                                                publications=pubs)

    @_rpc
    async def AdvanceRouteEpoch(self, request, context):
        """Advance (conditionally if expected_route_epoch != 0); logged for audit."""
        expected = request.expected_route_epoch or None
        result = await self._run(self._store.advance_route_epoch, expected)
        advanced = result.outcome == Outcome.APPLIED
        log.info("route epoch %s -> %d (expected %s, by %s, reason %r)", "advanced" if advanced else "not advanced",
                 result.route_epoch, expected, caller_name(context), request.reason)
        return directory_pb2.RouteEpochResponse(route_epoch=result.route_epoch, advanced=advanced,
                                                publications=result.retired_publications)

    @_rpc
    async def ConsumeNonce(self, request, context):
        """True the first time a nonce is seen (kept until the capability expires, plus skew
        margin). Secure: by the transfer's destination only, as its capability names it
        (with the keys), else its identity (kept from this replica's Reserve, else read from
        the record in the same store job as the nonce's; kv_directory/destinations.py)."""
        require(request.nonce, "nonce")
        require(request.expires_unix_ms, "expires_unix_ms")
        tid, who = request.transfer_id, caller(context) if self._secure else None
        if self._secure:
            require(tid, "transfer_id")
        known = self._known.get(tid) if self._secure else None
        kept = known.dest.worker_id if known is not None else None
        if self._secure and request.capability and self._verifier is not None:
            kept = signed_destination(self._verifier, request, int(time.time() * 1000)) or kept
        ahead_s = request.expires_unix_ms / 1000 - time.time()
        attempt = secrets.token_hex(8)  # this call's: its retry after a lost reply is not a replay

        def consume(store: DirectoryStore) -> Outcome | None:  # None: no record of the transfer yet
            if self._secure:
                dest = kept
                if dest is None:
                    txn = store.lookup(tid)
                    if txn is None and who is not None:
                        return None
                    dest = txn.spec.dest.worker_id if txn is not None else None
                if who is None or dest != who.name:
                    raise Denied(f"{who} is not the destination of transfer {tid}")
            if ahead_s > MAX_CAPABILITY_LIFETIME_S:
                raise BadRequest(f"expires_unix_ms is {ahead_s:.0f} s ahead; a capability lives at most "
                                 f"{MAX_CAPABILITY_LIFETIME_S:.0f} s")
            return store.consume_nonce(request.nonce, max(ahead_s, 0.0) + NONCE_SKEW_MARGIN_S,
                                       request.route_epoch, attempt)
        outcome = await self._calls.handoff(consume)
        if outcome is None:
            return directory_pb2.ConsumeNonceResponse(not_recorded=True)
        if outcome == Outcome.STALE_GENERATION:
            log.warning("capability of route epoch %d refused: the route epoch moved on (transfer %s)",
                        request.route_epoch, tid)
        elif outcome != Outcome.APPLIED:
            log.warning("nonce replay rejected (transfer %s)", tid)
        return directory_pb2.ConsumeNonceResponse(consumed=outcome == Outcome.APPLIED,
                                                  stale_route_epoch=outcome == Outcome.STALE_GENERATION)

    # ---- release (kv_directory/release.py) ------------------------------------

    @_rpc
    async def GetRelease(self, request, context):
        """The release record every router follows."""
        return await self._run(release.get_release, self._store)

    @_rpc
    async def WriteRelease(self, request, context):
        """Compare-and-set the release record; only legal transitions."""
        return await self._run(release.write_release, self._store, request, caller_name(context))

