"""The directory's Redis master SIGKILLed under a store that follows Sentinel (docs/design.md, Failures).

Real processes on loopback (tests/support/redis_ha.py): a master, one replica,
three Sentinels (quorum 2), passwords on all of them. What the store must do
(docs/design.md, "Redis failover"): in the window every call raises
DirectoryUnavailable (never a wrong answer); after the promotion the same store
object reaches the new master and finds what was replicated — workers and their
epochs, the route epoch, a published and an in-flight transaction, a consumed
nonce — and no fence moves backwards. With its only replica gone the new master
cannot acknowledge a fence-critical write (WAIT 1): that write is refused until
the old master comes back as a replica, and its retry then answers DUPLICATE.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from kv_directory.config import DirectoryConfig
from kv_directory.redis_store import RedisDirectoryStore
from runtime.directory.records import DirectoryUnavailable, LoadReport
from runtime.directory.states import Outcome, TxnState
from tests.support.directory.harness import CHUNKS, KV, drive, make_spec, register
from tests.support.redis_ha import start_redis_ha


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def ha():
    """Master + replica + 3 Sentinels; afterwards no process of theirs is left."""
    deployment = start_redis_ha(replicas=1, sentinels=3)
    try:
        deployment.wait_ready()
        yield deployment
    finally:
        deployment.stop()
        assert [pid for pid in deployment.pids() if not _gone(pid)] == [], "stray redis-server"


def _unavailable_fast(call, limit_s: float = 5.0) -> None:
    started = time.monotonic()
    with pytest.raises(DirectoryUnavailable):
        call()
    assert time.monotonic() - started < limit_s, "hung instead of failing fast"


def test_store_follows_a_sentinel_failover(ha):
    cfg = DirectoryConfig(**ha.directory_settings(), redis_timeout_s=0.5, redis_retries=1, lease_ttl_s=60,
                          redis_replica_ack_timeout_s=0.3)
    assert cfg.replicas_to_ack == 1
    store = RedisDirectoryStore(cfg)
    try:
        store.ping()
        p, d = register(store, "p0", "prefill"), register(store, "d0")
        route_epoch = store.advance_route_epoch().route_epoch
        store.reserve(make_spec(p, d, tid="t1", rid="r1", route_epoch=route_epoch))
        drive(store, "t1", 1, TxnState.PUBLISHED)  # the commit point: acknowledged by the replica
        store.reserve(make_spec(p, d, tid="t2", rid="r2", route_epoch=route_epoch))
        drive(store, "t2", 1, TxnState.TRANSFERRING)  # in flight across the failover
        assert store.consume_nonce("n1", 60, route_epoch) == Outcome.APPLIED
        ha.wait_replicated()
        # SCRIPT LOAD replicates in Redis 6.2: empty the replica's cache so the new
        # master answers NOSCRIPT and both call paths (plain and WAITed) must reload.
        for node in ha.data[1:]:
            with ha.client(node) as c:
                c.script_flush()

        old = ha.kill_master()
        # The window: the Sentinels still name the dead master. Unavailable, fast.
        _unavailable_fast(lambda: store.heartbeat("d0", d.epoch, LoadReport()))
        _unavailable_fast(lambda: store.publish("t2", 1, KV))
        _unavailable_fast(lambda: store.snapshot())
        new = ha.wait_promoted(old)

        # The same store object, the new master, the replicated state.
        workers = {w.worker_id: w.epoch for w in store.snapshot().workers}
        assert workers == {"p0": p.epoch, "d0": d.epoch}
        assert store.heartbeat("d0", d.epoch, LoadReport()).outcome == Outcome.APPLIED
        assert store.get_route_epoch() == route_epoch
        assert store.lookup("t1").state == TxnState.PUBLISHED
        assert store.lookup("t2").state == TxnState.TRANSFERRING
        assert [t.transfer_id for t in store.list_open()] == ["t2"]
        assert store.validated("t2", KV, CHUNKS).outcome == Outcome.APPLIED  # not WAITed: goes on

        # A fence-critical write with no replica left to hold it: applied on the new
        # master, refused to the caller (a failover now could lose it).
        assert [n.name for n in ha.data if n.running()] == [new.name]
        _unavailable_fast(lambda: store.publish("t2", 1, KV))
        _unavailable_fast(lambda: store.consume_nonce("n2", 60, route_epoch))

        # The old master returns (a pod restarted), empty, as the new master's replica.
        ha.restart(old, replica_of=new)
        ha.wait_replicas(1)
        assert ha.master_node() is new
        again = store.publish("t2", 1, KV)  # the retry of the refused publish
        assert (again.outcome, again.txn.state) == (Outcome.DUPLICATE, TxnState.PUBLISHED)
        assert store.consume_nonce("n2", 60, route_epoch) == Outcome.DUPLICATE
        assert store.consume_nonce("n1", 60, route_epoch) == Outcome.DUPLICATE  # replicated: no replay

        # Fences never go backwards.
        assert register(store, "d0").epoch > d.epoch
        assert register(store, "p0", "prefill").epoch > p.epoch
        assert store.advance_route_epoch().route_epoch > route_epoch

        # Leak check: the workers' re-registration released t1 and t2 (their K/V went
        # with the old incarnation); nothing is open.
        assert store.lookup("t1").state == TxnState.RELEASED
        assert store.lookup("t2").state == TxnState.RELEASED
        assert store.list_open() == []
    finally:
        store.close()


def test_a_failover_loses_only_what_no_replica_acknowledged(ha):
    """Replication cut, then the master dies: what it answered alone is lost, and the
    WAITed write it applied was answered "unavailable", never "done". A lost step
    reads as an earlier state after the promotion (the next step is refused and the
    attempt aborts), never as a later one; fences stay ahead."""
    cfg = DirectoryConfig(**ha.directory_settings(), redis_timeout_s=0.5, redis_retries=1, lease_ttl_s=60,
                          redis_replica_ack_timeout_s=0.3)
    store = RedisDirectoryStore(cfg)
    replica = ha.data[1]
    try:
        p, d = register(store, "p0", "prefill"), register(store, "d0")
        store.reserve(make_spec(p, d, tid="t1", rid="r1"))
        drive(store, "t1", 1, TxnState.VALIDATED)
        ha.wait_replicated()

        # Freeze the replica and drop its link: later writes reach no replica.
        replica.proc.send_signal(signal.SIGSTOP)
        with ha.client(ha.master_node()) as c:
            assert c.client_kill_filter(_type="replica") == 1
        assert store.reserve(make_spec(p, d, tid="t9", rid="r9")).outcome == Outcome.APPLIED  # master only
        _unavailable_fast(lambda: store.publish("t1", 1, KV))  # applied on the master, not acknowledged

        old = ha.kill_master()
        replica.proc.send_signal(signal.SIGCONT)
        ha.wait_promoted(old)

        assert store.lookup("t9") is None  # the reserve the router was told about is gone:
        assert store.begin("t9", KV).outcome == Outcome.NOT_FOUND  # its next step fails, it retries
        assert store.lookup("t1").state == TxnState.VALIDATED  # the publish nobody was told of is gone
        aborted = store.abort("t1", "publish unavailable")  # the decode's answer to "unavailable"
        assert (aborted.outcome, aborted.txn.state) == (Outcome.APPLIED, TxnState.ABORTED)
        assert [w.epoch for w in store.snapshot().workers] == [d.epoch, p.epoch]  # acknowledged: kept
        assert store.list_open() == []
    finally:
        if replica.running():
            replica.proc.send_signal(signal.SIGCONT)
        store.close()


def test_a_demoted_master_still_answering_sends_the_store_to_the_new_one(ha):
    """SENTINEL FAILOVER (a planned switch, or a healed partition): the old master is
    alive and turns replica under the store's open connections. A write on it
    answers READONLY, from inside the script; the store must answer UNAVAILABLE and
    drop those connections, so that its next call asks the Sentinels again."""
    cfg = DirectoryConfig(**ha.directory_settings(), redis_timeout_s=0.5, redis_retries=1, lease_ttl_s=60,
                          redis_min_replicas_ack=0)
    store = RedisDirectoryStore(cfg)
    try:
        d = register(store, "d0")
        old = ha.master_node()
        with ha.client(ha.sentinels[0]) as c:
            assert c.execute_command("SENTINEL", "FAILOVER", "pdmaster")
        new = ha.wait_promoted(old)
        with ha.client(old) as c:
            # What the Sentinels send it on their next look (up to 10 s), sent now.
            c.replicaof(*new.address)
            assert c.info("replication")["role"] == "slave"
        deadline = time.monotonic() + 10
        while True:  # at most a call or two in the switch answer UNAVAILABLE
            try:
                again = register(store, "d0")
                break
            except DirectoryUnavailable:
                assert time.monotonic() < deadline, "the store did not leave the demoted master"
                time.sleep(0.05)
        assert again.epoch > d.epoch
        with ha.client(new) as c:
            assert c.hget(f"{cfg.key_prefix}:w:d0", "epoch") == str(again.epoch)
    finally:
        store.close()
