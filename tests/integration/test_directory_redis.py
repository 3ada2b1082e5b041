"""KV directory logic on a real, private redis-server (Lua scripts, real clock)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redis

from kv_directory.config import DirectoryConfig
from kv_directory.lua_scripts import OPERATIONS, script_source
from kv_directory.redis_store import RedisDirectoryStore, _txn
from kv_directory.store import DirectoryStore
from runtime.directory.records import DirectoryUnavailable, LoadReport
from runtime.directory.states import Outcome, TxnState
from tests.support.directory.contract import DirectoryContract
from tests.support.directory.harness import CHUNKS, KV, Harness, make_spec, register
from tests.support.redis_ha import start_redis_ha
from tooling.cluster.redis_proc import start_redis


class RedisHarness(Harness):
    """Stores on the session Redis, each under its own key prefix."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.raw = redis.Redis.from_url(url, decode_responses=True)
        self.stores: list[RedisDirectoryStore] = []

    def open(self, **config: object) -> DirectoryStore:
        prefix = "{pdtest-" + uuid.uuid4().hex[:12] + "}"
        store = RedisDirectoryStore(DirectoryConfig(redis_url=self.url, key_prefix=prefix, **config))
        store.test_prefix = prefix
        self.stores.append(store)
        return store

    def advance(self, seconds: float) -> None:
        time.sleep(seconds)  # the store's clock is Redis TIME

    def all_transactions(self, store):
        keys = self.raw.keys(f"{store.test_prefix}:txn:*")
        flat = ([x for kv in self.raw.hgetall(k).items() for x in kv] for k in keys)
        return [_txn(f) for f in flat]

    def assert_no_leaks(self, store) -> None:
        super().assert_no_leaks(store)
        # Index hygiene: no open-index entry outlives its transaction's openness.
        p = store.test_prefix
        assert self.raw.zrange(f"{p}:open", 0, -1) == []
        for k in self.raw.keys(f"{p}:wtxn:*") + self.raw.keys(f"{p}:reqtx:*"):
            assert self.raw.smembers(k) == set(), k
        # Every dpub entry is a transaction still PUBLISHED.
        for k in self.raw.keys(f"{p}:dpub:*"):
            for tid in self.raw.smembers(k):
                assert self.raw.hget(f"{p}:txn:{tid}", "state") == str(int(TxnState.PUBLISHED)), (k, tid)

    def close(self) -> None:
        for store in self.stores:
            store.close()
        self.raw.close()


class TestRedisDirectory(DirectoryContract):
    """The shared contract against RedisDirectoryStore."""

    @pytest.fixture
    def harness(self, redis_server):
        h = RedisHarness(redis_server.url)
        yield h
        h.close()

    def test_noscript_reloads_after_script_flush(self, harness, ends):
        store, p, d = ends
        harness.raw.script_flush()
        assert store.reserve(make_spec(p, d)).outcome == Outcome.APPLIED
        store.abort("t1", "cleanup")
        harness.assert_no_leaks(store)

    def test_every_script_compiles(self, harness):
        store = harness.open()
        store.ping()  # SCRIPT LOAD of every operation: a syntax error fails here
        assert len(OPERATIONS) == len(set(OPERATIONS))
        assert "local LEGAL = " in script_source("forward")
        harness.assert_no_leaks(store)

    def test_terminal_records_expire_in_redis(self, harness):
        store = harness.open(record_retention_s=60)
        p, d = register(store, "p0", "prefill"), register(store, "d0")
        store.reserve(make_spec(p, d))
        store.abort("t1", "client gone")
        ttl_ms = harness.raw.pttl(f"{store.test_prefix}:txn:t1")
        assert 0 < ttl_ms <= 60_000
        harness.assert_no_leaks(store)


class AckedRedisHarness(RedisHarness):
    """Stores that WAIT for one replica after every fence-critical write."""

    def open(self, **config: object) -> DirectoryStore:
        return super().open(**{"redis_min_replicas_ack": 1, **config})


@pytest.fixture(scope="module")
def master_and_replica():
    """A password-protected master with one replica, no Sentinels."""
    with start_redis_ha(replicas=1, sentinels=0) as ha:
        ha.wait_ready()
        yield ha


class TestRedisDirectoryWaitingForReplicas(DirectoryContract):
    """The shared contract with ``PD_REDIS_MIN_REPLICAS_ACK=1`` on a master with a
    replica: register, publish, route epoch advance and nonce go through the WAIT
    pipeline (its NOSCRIPT reload included) and answer exactly as without it."""

    @pytest.fixture
    def harness(self, master_and_replica):
        h = AckedRedisHarness(master_and_replica.master_url())
        yield h
        h.close()

    def test_noscript_reloads_on_the_waited_path(self, harness, ends):
        store, p, d = ends
        harness.raw.script_flush()
        assert register(store, "d1").epoch > 0
        def waits() -> int:
            return harness.raw.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)

        before = waits()
        assert store.consume_nonce("n", 5) == Outcome.APPLIED  # NOSCRIPT, load, run again
        assert waits() == before + 2
        assert store.consume_nonce("n2", 5) == Outcome.APPLIED
        assert waits() == before + 3
        harness.assert_no_leaks(store)


def test_a_replica_answering_readonly_is_unavailable(master_and_replica):
    """A plain URL that reaches a replica (a demoted master behind a Service): every
    write is READONLY, which is "not now", not a wrong request."""
    ha = master_and_replica
    url = f"redis://:{ha.password}@127.0.0.1:{ha.data[1].port}/0"
    store = RedisDirectoryStore(DirectoryConfig(redis_url=url, redis_retries=0))
    try:
        with pytest.raises(DirectoryUnavailable, match="read only replica"):
            register(store, "d0")
    finally:
        store.close()


def test_a_write_no_replica_acknowledges_is_unavailable(redis_server):
    """WAIT 1 on a master without replicas: the write lands, the caller is told
    DirectoryUnavailable (a failover could still lose it); plain calls answer."""
    cfg = DirectoryConfig(redis_url=redis_server.url, key_prefix="{pdtest-ack-" + uuid.uuid4().hex[:8] + "}",
                          redis_min_replicas_ack=1, redis_replica_ack_timeout_s=0.1)
    store = RedisDirectoryStore(cfg)
    try:
        started = time.monotonic()
        with pytest.raises(DirectoryUnavailable, match="held by 0 of the 1 replicas"):
            register(store, "d0")
        assert time.monotonic() - started < 2
        assert [w.worker_id for w in store.snapshot().workers] == ["d0"]  # applied on the master
        for call in (lambda: store.advance_route_epoch(), lambda: store.consume_nonce("n", 5)):
            with pytest.raises(DirectoryUnavailable):
                call()
    finally:
        store.close()


@pytest.fixture
def own_redis():
    """A Redis this test may stop and restart."""
    server = start_redis()
    yield server
    server.stop()


def test_redis_going_away_raises_unavailable_not_a_wrong_answer(own_redis):
    cfg = DirectoryConfig(redis_url=own_redis.url, redis_timeout_s=0.5, redis_retries=1)
    store = RedisDirectoryStore(cfg)
    p, d = register(store, "p0", "prefill"), register(store, "d0")
    route_epoch = store.advance_route_epoch().route_epoch
    assert store.reserve(make_spec(p, d)).outcome == Outcome.APPLIED
    store.begin("t1", KV)
    store.abort("t1", "cleanup")
    assert store.list_open() == []  # leak check while the backend still answers

    own_redis.stop()
    calls = {
        "snapshot": lambda: store.snapshot(),
        "heartbeat": lambda: store.heartbeat("d0", d.epoch, LoadReport()),
        "register": lambda: register(store, "d1"),
        "reserve": lambda: store.reserve(make_spec(p, d, tid="t2", gen=2)),
        "publish": lambda: store.publish("t1", 1, KV),
        "abort": lambda: store.abort("t1", "again"),
        "lookup": lambda: store.lookup("t1"),
        "list_open": lambda: store.list_open(),
        "route_epoch": lambda: store.get_route_epoch(),
        "nonce": lambda: store.consume_nonce("n", 1),
        "reap": lambda: store.reap_expired(),
        "ping": lambda: store.ping(),
    }
    for name, call in calls.items():
        started = time.monotonic()
        with pytest.raises(DirectoryUnavailable):
            call()
        assert time.monotonic() - started < 5, f"{name} hung instead of failing fast"

    # Back on the same port with its data gone: the store reconnects and reloads its
    # scripts (NOSCRIPT path) without being rebuilt, and no fence moved backwards: a
    # stale holder of the old epochs is still fenced off (docs/design.md, The transaction).
    restarted = start_redis(port=own_redis.port)
    try:
        assert store.lookup("t1") is None
        assert register(store, "d0").epoch > d.epoch
        assert store.get_route_epoch() > route_epoch
        assert store.heartbeat("d0", d.epoch, LoadReport()).outcome == Outcome.LEASE_LOST
        assert store.list_open() == []
    finally:
        store.close()
        restarted.stop()


def test_publish_cas_is_atomic_against_a_racing_reserve(redis_server):
    """Many rounds of publish(g) racing reserve(g+1) from two clients: the old
    generation either published before the new reserve, or was superseded —
    never published after it."""

    cfg = DirectoryConfig(redis_url=redis_server.url, key_prefix="{pdtest-race-" + uuid.uuid4().hex[:8] + "}")
    a, b = RedisDirectoryStore(cfg), RedisDirectoryStore(cfg)
    p, d = register(a, "p0", "prefill"), register(a, "d0")
    for rnd in range(100):
        rid = f"r{rnd}"
        a.reserve(make_spec(p, d, tid=f"{rid}-1", gen=1, rid=rid))
        a.begin(f"{rid}-1", KV)
        a.validated(f"{rid}-1", KV, CHUNKS)
        out, gate = {}, threading.Barrier(2)

        def publish_old(rid=rid):
            gate.wait()
            out["pub"] = a.publish(f"{rid}-1", 1, KV)

        def reserve_new(rid=rid):
            gate.wait()
            out["res"] = b.reserve(make_spec(p, d, tid=f"{rid}-2", gen=2, rid=rid))

        threads = [threading.Thread(target=publish_old), threading.Thread(target=reserve_new)]
        for t in threads if rnd % 2 else threads[::-1]:
            t.start()
        for t in threads:
            t.join()
        assert out["res"].outcome == Outcome.APPLIED
        old = a.lookup(f"{rid}-1")
        if out["pub"].outcome == Outcome.APPLIED:
            assert old.state == TxnState.PUBLISHED and old.updated_ms <= out["res"].txn.created_ms
        else:
            assert out["pub"].outcome == Outcome.STALE_GENERATION
            assert (old.state, old.abort_reason) == (TxnState.ABORTED, "superseded")
        a.abort(f"{rid}-2", "cleanup")
        if old.state == TxnState.PUBLISHED:
            a.release(f"{rid}-1")
    assert a.list_open() == []
    a.close()
    b.close()
