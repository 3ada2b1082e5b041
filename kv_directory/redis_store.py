"""``DirectoryStore`` over Redis: every operation is one Lua script (EVALSHA).

One script per operation makes each call — its lazy reaping, its checks and
its writes — a single atomic step on the server; no client-side
read-modify-write exists anywhere. Scripts live in ``lua/``, rendered by
``lua_scripts.py`` with their constants from ``states.py``. redis-py's
``Script`` runs EVALSHA and, on NOSCRIPT (a restarted or flushed server),
loads the text and retries once.

Time is the Redis server's (``TIME`` inside the scripts), deliberately: one
clock for leases and deadlines however many directory replicas and callers
there are, read in the same atomic step that acts on it.

Failure: a connection, timeout or "server cannot serve now" error (LOADING,
READONLY, OOM, BUSY, ...) raises ``DirectoryUnavailable``; the gRPC layer maps
it to UNAVAILABLE. A retry after an ambiguous failure is safe: each script is
idempotent by transfer id / epoch / nonce, so a reserve that did land answers
DUPLICATE the second time.

High availability (docs/design.md, "Redis failover"): with ``PD_REDIS_SENTINELS``
the client is redis-py's ``Sentinel.master_for``, whose pool asks the Sentinels
for the master on every new connection and drops its connections when the
answer changes (or when the old master answers READONLY as a demoted replica),
so the first calls after a promotion reach the new master; the ones in the
window raise DirectoryUnavailable. Replication is asynchronous, so the writes
whose loss would be unsafe — a fence handed out (register, route epoch
advance), a nonce consumed, a publication — wait for ``replicas_to_ack``
replicas (Redis ``WAIT``) before their answer leaves; too few within the
timeout reads, to the caller, like a reply lost on the wire.
"""

from __future__ import annotations

import base64
import urllib.parse
from collections.abc import Sequence
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from kv_directory.config import DirectoryConfig
from kv_directory.lua_scripts import OPERATIONS, script_source
from kv_directory.store import DirectoryStore
from runtime.directory.cost_profile import CostProfile
from runtime.directory.records import (
    CAPACITY_FIELDS,
    LOAD_FIELDS,
    ClusterSnapshot,
    DirectoryUnavailable,
    EpochResult,
    LeaseResult,
    LoadReport,
    ReleaseHead,
    StoredRelease,
    Transaction,
    TransferSpec,
    TxnResult,
    WorkerCapacity,
    WorkerInfo,
    WorkerRecord,
    WorkerRef,
)
from runtime.directory.states import Outcome, TxnState

_SWEEP_LIMIT = 128  # Must match SWEEP_LIMIT in lua/_lib.lua.

# Server replies meaning "not now" rather than "wrong request".
_UNAVAILABLE_ERRORS = (redis.exceptions.ReadOnlyError, redis.exceptions.OutOfMemoryError)
_UNAVAILABLE_REPLIES = ("LOADING", "READONLY", "MASTERDOWN", "BUSY", "OOM", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS")


def _not_now(exc: redis.exceptions.ResponseError) -> bool:
    """A reply that means "not now" (a replica, loading, out of memory, ...), bare or
    raised inside a script ("Error running script ...: -READONLY ...")."""
    if isinstance(exc, _UNAVAILABLE_ERRORS):  # redis-py strips these replies' code
        return True
    text = str(exc).upper()
    return text.startswith(_UNAVAILABLE_REPLIES) or any(f"-{code} " in text for code in _UNAVAILABLE_REPLIES)


def connect(config: DirectoryConfig) -> redis.Redis:
    """The client ``config`` describes: plain from ``redis_url``, or the master the
    Sentinels name (re-asked on every new connection). ``decode_responses=True``."""
    timeouts = {"socket_timeout": config.redis_timeout_s, "socket_connect_timeout": config.redis_timeout_s}
    options: dict[str, Any] = {
        **timeouts,
        "decode_responses": True,
        "retry": Retry(ExponentialBackoff(cap=0.5, base=0.05), config.redis_retries),
        "retry_on_error": [redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
    }
    if config.redis_password:
        options["password"] = config.redis_password
    if not config.redis_sentinels:
        return redis.Redis.from_url(config.redis_url, **options)
    # The URL carries only what the master connection needs besides its address.
    url = redis.connection.parse_url(config.redis_url)
    options.update({name: url[name] for name in ("username", "password", "db") if name in url})
    if urllib.parse.urlsplit(config.redis_url).scheme == "rediss":
        options["ssl"] = True  # SentinelConnectionPool picks its SSL connection class
    sentinel_options = {**timeouts, "retry": Retry(ExponentialBackoff(cap=0.2, base=0.05), 1)}
    if config.redis_sentinel_password:
        sentinel_options["password"] = config.redis_sentinel_password
    sentinel = Sentinel(config.sentinel_addresses(), sentinel_kwargs=sentinel_options)
    return sentinel.master_for(config.redis_sentinel_master, **options)


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}


def _txn(flat: Sequence[Any]) -> Transaction | None:
    if not flat:
        return None
    m = _pairs(flat)
    spec = TransferSpec(
        transfer_id=m["transfer_id"],
        request_id=m["request_id"],
        tenant=m["tenant"],
        generation=int(m["generation"]),
        source=WorkerRef(m["source_worker_id"], int(m["source_epoch"])),
        dest=WorkerRef(m["dest_worker_id"], int(m["dest_epoch"])),
        manifest_digest=m["manifest_digest"],
        chunks_digest=m["chunks_digest"],
        route_epoch=int(m["route_epoch"]),
        manifest_blob=m.get("manifest_blob", ""),
    )
    return Transaction(
        spec, TxnState(int(m["state"])), m["abort_reason"],
        int(m["created_ms"]), int(m["updated_ms"]), int(m["deadline_ms"]), m.get("kv_digest", ""),
    )


def _worker(flat: Sequence[Any]) -> WorkerRecord:
    m = _pairs(flat)
    return WorkerRecord(
        worker_id=m["worker_id"],
        role=m["role"],
        grpc_address=m["grpc_addr"],
        data_plane_address=m["data_addr"],
        cache_abi_digest=m["abi_digest"],
        epoch=int(m["epoch"]),
        lease_expiry_ms=int(m["lease_expiry_ms"]),
        load=LoadReport(**{f: int(m.get(f, 0)) for f in LOAD_FIELDS}),
        capacity=WorkerCapacity(**{f: int(m.get(f, 0)) for f in CAPACITY_FIELDS}),
        profile=CostProfile.from_json(m.get("profile", "")),
        colocated_only_reason=m.get("colocated_only_reason", ""),
        model_identity=m.get("model_identity", ""),
        seal_key=bytes.fromhex(m.get("seal_key", "")),
        load_reported_ms=int(m.get("load_reported_ms", 0)),
    )


def _txn_result(reply: Sequence[Any]) -> TxnResult:
    generation = int(reply[2]) if len(reply) > 2 else 0  # reserve answers the request's generation
    return TxnResult(Outcome(int(reply[0])), _txn(reply[1]), generation)


class RedisDirectoryStore(DirectoryStore):
    """The production directory store. Thread-safe (redis-py pools connections)."""

    def __init__(self, config: DirectoryConfig, client: redis.Redis | None = None):
        """Connects lazily; ``client``, if given, must use ``decode_responses=True``."""
        self._cfg = config
        self._client = client or connect(config)
        self._replicas = config.replicas_to_ack
        self._ack_timeout_ms = max(1, int(config.redis_replica_ack_timeout_s * 1000))
        if not self._client.get_encoder().decode_responses:
            raise ValueError("RedisDirectoryStore needs a client with decode_responses=True")
        # Read every script now: a missing or broken file fails at start, not mid-request.
        self._scripts = {op: self._client.register_script(script_source(op)) for op in OPERATIONS}
        self._base_args = [
            config.key_prefix,
            int(config.lease_ttl_s * 1000),
            int(config.txn_ttl_s * 1000),
            int(config.record_retention_s * 1000),
        ]

    def inline_twin(self, budget_s: float) -> RedisDirectoryStore | None:
        """See ``DirectoryStore.inline_twin``: its own client, `budget_s` socket timeouts,
        no retries. None with replicas to wait for (a WAIT is a replica round trip)."""
        if self._replicas:
            return None
        return RedisDirectoryStore(self._cfg.model_copy(update={"redis_timeout_s": budget_s, "redis_retries": 0}))

    def _run(self, operation: str, *args: Any, acked: bool = False) -> Any:
        """Run ``operation``'s script; with ``acked`` (and replicas to wait for) the
        answer leaves only once that many replicas hold it."""
        try:
            if acked and self._replicas:
                return self._run_acked(operation, [*self._base_args, *args])
            return self._scripts[operation](args=[*self._base_args, *args])
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise DirectoryUnavailable(f"redis unreachable during {operation}: {exc}") from exc
        except redis.exceptions.ResponseError as exc:
            if not _not_now(exc):
                raise
            if "READONLY" in str(exc).upper() or isinstance(exc, redis.exceptions.ReadOnlyError):
                # A demoted master: drop every connection, so that the next ones ask
                # the Sentinels (redis-py does that itself only for a bare READONLY
                # reply, not for one raised inside a script).
                self._client.connection_pool.disconnect()
            raise DirectoryUnavailable(f"redis refused {operation}: {exc}") from exc

    def _run_acked(self, operation: str, args: list[Any]) -> Any:
        """EVALSHA, a mark, WAIT — one pipeline, so one connection: WAIT counts the
        replicas that hold this connection's last write, and the mark (written after
        the script) makes that cover every earlier write too, including the original
        of an answer that is a DUPLICATE of a retried call."""
        script = self._scripts[operation]
        for _ in range(2):
            pipe = self._client.pipeline(transaction=False)
            pipe.evalsha(script.sha, 0, *args)
            pipe.set(f"{self._cfg.key_prefix}:ack_mark", operation)
            pipe.wait(self._replicas, self._ack_timeout_ms)
            reply, _, acks = pipe.execute(raise_on_error=False)
            if not isinstance(reply, redis.exceptions.NoScriptError):
                break
            self._client.script_load(script.script)  # a new (promoted) master: load, run once more
        for result in (reply, acks):
            if isinstance(result, Exception):
                raise result
        if int(acks) < self._replicas:
            raise DirectoryUnavailable(
                f"{operation} applied on the redis master but held by {acks} of the {self._replicas} replicas "
                f"required within {self._ack_timeout_ms} ms; a failover now could lose it")
        return reply

    def ping(self) -> None:
        """Readiness: reach Redis and load every script; raises DirectoryUnavailable."""
        try:
            self._client.ping()
            for script in self._scripts.values():
                self._client.script_load(script.script)
        except redis.exceptions.RedisError as exc:
            raise DirectoryUnavailable(f"redis not ready: {exc}") from exc

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    # ---- WorkerRegistry ----------------------------------------------------

    def register_worker(self, info: WorkerInfo, load: LoadReport | None = None) -> WorkerRecord:
        """See ``WorkerRegistry.register_worker``."""
        load = load or LoadReport()
        epoch, expiry_ms, reported_ms = self._run(
            "register", info.worker_id, info.role.value, info.grpc_address, info.data_plane_address,
            info.cache_abi_digest, *load.as_args(), *info.capacity.as_args(), info.profile.to_json(),
            info.colocated_only_reason, info.model_identity, info.seal_key.hex(), acked=True,
        )
        return WorkerRecord(
            info.worker_id, info.role, info.grpc_address, info.data_plane_address, info.cache_abi_digest,
            info.capacity, load, int(epoch), int(expiry_ms), info.profile, info.colocated_only_reason,
            info.model_identity, info.seal_key, int(reported_ms),
        )

    def seal_key(self, worker_id: str, epoch: int) -> bytes:
        """See ``WorkerRegistry.seal_key``."""
        return bytes.fromhex(self._run("seal_key", worker_id, str(int(epoch))) or "")

    def heartbeat(self, worker_id: str, epoch: int, load: LoadReport) -> LeaseResult:
        """See ``WorkerRegistry.heartbeat``."""
        outcome, expiry_ms, stopped = self._run("heartbeat", worker_id, epoch, *load.as_args())
        return LeaseResult(Outcome(outcome), int(expiry_ms), stopped == "1")

    def deregister_worker(self, worker_id: str, epoch: int) -> Outcome:
        """See ``WorkerRegistry.deregister_worker``."""
        return Outcome(self._run("deregister", worker_id, epoch))

    def reap_expired(self) -> int:
        """See ``WorkerRegistry.reap_expired``. Loops the bounded sweep to completion."""
        total = 0
        while True:
            n = int(self._run("reap"))
            total += n
            if n < _SWEEP_LIMIT:
                return total

    def snapshot(self) -> ClusterSnapshot:
        """See ``WorkerRegistry.snapshot``."""
        reply = self._run("snapshot")
        workers = sorted((_worker(w) for w in reply[3:]), key=lambda w: w.worker_id)
        version, state, stopped = reply[2]
        return ClusterSnapshot(tuple(workers), int(reply[0]), int(reply[1]),
                               ReleaseHead(int(version), int(state), stopped == "1"))

    # ---- TransferLedger ----------------------------------------------------

    def reserve(self, spec: TransferSpec, attempt: str = "") -> TxnResult:
        """See ``TransferLedger.reserve``."""
        # Canonical strings: the script compares them byte-for-byte with a stored retry.
        return _txn_result(self._run(
            "reserve", spec.transfer_id, spec.request_id, spec.tenant, str(spec.generation),
            spec.source.worker_id, str(spec.source.epoch), spec.dest.worker_id, str(spec.dest.epoch),
            spec.manifest_digest, spec.chunks_digest, str(spec.route_epoch), spec.manifest_blob, attempt,
        ))

    def begin(self, transfer_id: str, kv_digest: str = "") -> TxnResult:
        """See ``TransferLedger.begin``."""
        return _txn_result(self._run("forward", transfer_id, int(TxnState.TRANSFERRING), "", kv_digest, ""))

    def validated(self, transfer_id: str, kv_digest: str, chunks_digest: str) -> TxnResult:
        """See ``TransferLedger.validated``."""
        return _txn_result(self._run("forward", transfer_id, int(TxnState.VALIDATED), "", kv_digest,
                                     chunks_digest))

    def publish(self, transfer_id: str, generation: int, kv_digest: str) -> TxnResult:
        """See ``TransferLedger.publish``."""
        return _txn_result(self._run("forward", transfer_id, int(TxnState.PUBLISHED), str(int(generation)),
                                     kv_digest, "", acked=True))

    def validate_publish(self, transfer_id: str, generation: int, kv_digest: str,
                         chunks_digest: str, declare: bool = False) -> TxnResult:
        """See ``TransferLedger.validate_publish``: one script, every move."""
        return _txn_result(self._run("forward", transfer_id, int(TxnState.PUBLISHED), str(int(generation)),
                                     kv_digest, chunks_digest, "2" if declare else "1", acked=True))

    def abort(self, transfer_id: str, reason: str) -> TxnResult:
        """See ``TransferLedger.abort``."""
        return _txn_result(self._run("abort", transfer_id, reason or "aborted"))

    def release(self, transfer_id: str) -> TxnResult:
        """See ``TransferLedger.release``."""
        return _txn_result(self._run("release", transfer_id))

    def lookup(self, transfer_id: str) -> Transaction | None:
        """See ``TransferLedger.lookup``."""
        return _txn(self._run("lookup", transfer_id))

    def list_open(self, worker_id: str | None = None) -> list[Transaction]:
        """See ``TransferLedger.list_open``."""
        txns = [_txn(flat) for flat in self._run("list_open", worker_id or "")]
        return sorted((t for t in txns if t is not None), key=lambda t: t.transfer_id)

    def get_route_epoch(self) -> int:
        """See ``RouteEpochs.get_route_epoch``."""
        return int(self._run("route_epoch", "get", "")[1])

    def advance_route_epoch(self, expected: int | None = None) -> EpochResult:
        """See ``RouteEpochs.advance_route_epoch``."""
        outcome, epoch, pubs = self._run("route_epoch", "advance", "" if expected is None else str(expected),
                                         acked=True)
        return EpochResult(Outcome(outcome), int(epoch), int(pubs))

    def publications(self, route_epoch: int) -> int:
        """See ``RouteEpochs.publications``."""
        return int(self._run("route_epoch", "pubs", str(route_epoch))[2])

    def consume_nonce(self, nonce: str, ttl_s: float, route_epoch: int = 0, attempt: str = "") -> Outcome:
        """See ``NonceLedger.consume_nonce``."""
        if not nonce or ttl_s <= 0:
            raise ValueError("nonce must be non-empty and ttl_s > 0")
        return Outcome(self._run("nonce", nonce, max(1, int(ttl_s * 1000)), route_epoch, attempt, acked=True))

    # ---- ReleaseLedger -------------------------------------------------------

    def get_release(self) -> StoredRelease | None:
        """See ``ReleaseLedger.get_release``."""
        return _release(self._run("release_record", "get")[1:])

    def put_release(self, expected_version: int, head: ReleaseHead,
                    record: bytes) -> tuple[Outcome, StoredRelease | None]:
        """See ``ReleaseLedger.put_release``. Waits for the replicas: a failover must not
        bring back a release state (or a lifted route stop) the cluster moved past."""
        reply = self._run("release_record", "put", str(expected_version), str(head.version), str(head.state),
                          "1" if head.routes_stopped else "0", base64.b64encode(record).decode(), acked=True)
        return Outcome(int(reply[0])), _release(reply[1:])


def _release(fields: Sequence[str]) -> StoredRelease | None:
    """release.lua's {version, state, routes_stopped, record} -> StoredRelease (None: none stored)."""
    version, state, stopped, record = fields
    if int(version) == 0:
        return None
    return StoredRelease(ReleaseHead(int(version), int(state), stopped == "1"), base64.b64decode(record))
