"""A script's reply lost on the way back from a real redis-server: the store's own
retry (redis-py's, on the timeout) runs the script again, and the directory must not
take its own first run for somebody else's.

Between the store and Redis sits a loopback TCP relay that, when told, holds the next
reply longer than the store's socket timeout and then drops the connection: Redis ran
the script, the store never heard, and redis-py reconnects and sends it again. Without
the call's attempt token the second run answers DUPLICATE — a reserve that took for a
request id that ran before, a nonce check that took for a replay (the capability
denied, the transfer failed). With it, the same call answers APPLIED, and every other
call still gets DUPLICATE.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid

import pytest

from kv_directory.config import DirectoryConfig
from kv_directory.redis_store import RedisDirectoryStore
from runtime.directory.states import Outcome, TxnState
from tests.support.directory.harness import make_spec, register

TIMEOUT_S = 0.5  # far above a loopback call on a busy host; a reply lost is held twice as long


class LosingRelay:
    """Relays loopback TCP to `port`; `lose_next()` makes it hold the next reply from
    Redis past the client's timeout and then close that connection unanswered."""

    def __init__(self, port: int) -> None:
        self._upstream = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lose = threading.Event()
        self.lost = 0
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def lose_next(self) -> None:
        self._lose.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            server = socket.create_connection(("127.0.0.1", self._upstream))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while data := src.recv(65536):
                if replies and self._lose.is_set():
                    self._lose.clear()
                    self.lost += 1
                    time.sleep(TIMEOUT_S * 2)  # the client gives up on this reply meanwhile
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def store(redis_server):
    relay = LosingRelay(redis_server.port)
    cfg = DirectoryConfig(redis_url=f"redis://127.0.0.1:{relay.port}/0", key_prefix=f"{{lost-{uuid.uuid4().hex[:8]}}}",
                          redis_timeout_s=TIMEOUT_S, redis_retries=2)
    s = RedisDirectoryStore(cfg)
    s.relay = relay
    yield s
    s.close()
    relay.close()


def test_a_nonce_check_whose_reply_was_lost_is_not_taken_for_a_replay(store):
    assert store.consume_nonce("warm", 30, attempt="w") == Outcome.APPLIED  # the script is loaded

    store.relay.lose_next()
    assert store.consume_nonce("n-bare", 30) == Outcome.DUPLICATE  # the hazard: its own first run
    assert store.relay.lost == 1

    store.relay.lose_next()
    assert store.consume_nonce("n-token", 30, attempt="a1") == Outcome.APPLIED
    assert store.relay.lost == 2 and store.relay.connections >= 3  # it did run twice
    assert store.consume_nonce("n-token", 30, attempt="a2") == Outcome.DUPLICATE  # a replay still is one
    assert store.consume_nonce("n-token", 30) == Outcome.DUPLICATE


def test_a_reserve_whose_reply_was_lost_answers_applied(store):
    p, d = register(store, "p0", "prefill"), register(store, "d0")
    assert store.reserve(make_spec(p, d, tid="warm/1", gen=1, rid="warm"), attempt="w").outcome == Outcome.APPLIED

    store.relay.lose_next()
    bare = store.reserve(make_spec(p, d, tid="bare/1", gen=1, rid="bare"))
    assert store.relay.lost == 1
    assert (bare.outcome, bare.txn.state) == (Outcome.DUPLICATE, TxnState.RESERVED)  # the hazard

    store.relay.lose_next()
    took = store.reserve(make_spec(p, d, tid="tok/1", gen=1, rid="tok"), attempt="a1")
    assert store.relay.lost == 2
    assert (took.outcome, took.txn.state, took.request_generation) == (Outcome.APPLIED, TxnState.RESERVED, 1)
    assert store.reserve(make_spec(p, d, tid="tok/1", gen=1, rid="tok"), attempt="a2").outcome == \
        Outcome.DUPLICATE
    for tid in ("warm/1", "bare/1", "tok/1"):
        assert store.abort(tid, "cleanup").outcome == Outcome.APPLIED
    assert store.list_open() == []
