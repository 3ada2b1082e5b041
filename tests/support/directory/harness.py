"""What the DirectoryStore contract runs on: a ``Harness`` per implementation (how
to open a store, move its clock and read its raw state) and the specs and moves the
contract's tests share (tests/support/directory/contract.py)."""

from __future__ import annotations

import abc

import pytest

from kv_directory.store import DirectoryStore
from runtime.directory.records import (
    Transaction,
    TransferSpec,
    WorkerInfo,
    WorkerRecord,
    chunk_list_digest,
)
from runtime.directory.states import Outcome, TxnState

FINAL_OK = {TxnState.PUBLISHED, TxnState.ABORTED, TxnState.RELEASED}


class Harness(abc.ABC):
    """How the contract opens a store, moves time and inspects raw state."""

    @abc.abstractmethod
    def open(self, **config: object) -> DirectoryStore:
        """A fresh, empty store; ``config`` overrides DirectoryConfig fields."""

    @abc.abstractmethod
    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass on the store's clock (fake or real)."""

    @abc.abstractmethod
    def all_transactions(self, store: DirectoryStore) -> list[Transaction]:
        """Every stored transaction record, bypassing the store's indexes."""

    def assert_no_leaks(self, store: DirectoryStore) -> None:
        """Leak check: nothing open, nothing stored outside the final states."""
        assert store.list_open() == []
        stuck = [(t.transfer_id, t.state.name) for t in self.all_transactions(store) if t.state not in FINAL_OK]
        assert stuck == [], f"leaked transactions: {stuck}"


def register(store: DirectoryStore, worker_id: str, role: str = "decode") -> WorkerRecord:
    """Register a worker with placeholder addresses."""
    return store.register_worker(WorkerInfo(worker_id, role, f"{worker_id}:1", f"{worker_id}:2", "abi-1"))


LAYOUT = ((0, 0, 2, 4096), (1, 0, 2, 4096))
"""The expected chunks of the specs below: two layers of two blocks."""
CHUNKS = chunk_list_digest(LAYOUT)
KV = "kv" * 16
"""The K/V digest the source declares and the destination matches."""


def make_spec(p: WorkerRecord, d: WorkerRecord, tid: str = "t1", gen: int = 1, rid: str = "r1",
              tenant: str = "acme", chunks: tuple = LAYOUT, route_epoch: int = 0) -> TransferSpec:
    """A TransferSpec from ``p`` to ``d`` at their current epochs."""
    digest = chunk_list_digest(chunks)
    return TransferSpec(tid, rid, tenant, gen, p.ref, d.ref, f"manifest-{digest[:16]}", digest, route_epoch)


# op name -> (target state, call)
OPS = {
    "begin": (TxnState.TRANSFERRING, lambda s, tid, gen: s.begin(tid, KV)),
    "validated": (TxnState.VALIDATED, lambda s, tid, gen: s.validated(tid, KV, CHUNKS)),
    "publish": (TxnState.PUBLISHED, lambda s, tid, gen: s.publish(tid, gen, KV)),
    "release": (TxnState.RELEASED, lambda s, tid, gen: s.release(tid)),
    "abort": (TxnState.ABORTED, lambda s, tid, gen: s.abort(tid, "test")),
}
PATH_TO = {
    TxnState.RESERVED: [],
    TxnState.TRANSFERRING: ["begin"],
    TxnState.VALIDATED: ["begin", "validated"],
    TxnState.PUBLISHED: ["begin", "validated", "publish"],
    TxnState.RELEASED: ["begin", "validated", "publish", "release"],
    TxnState.ABORTED: ["abort"],
}


def drive(store: DirectoryStore, tid: str, gen: int, state: TxnState) -> None:
    """Move a freshly reserved transaction to ``state`` by legal steps."""
    for op in PATH_TO[state]:
        target, call = OPS[op]
        result = call(store, tid, gen)
        assert result.outcome == Outcome.APPLIED and result.txn.state == target, (op, result)



class ContractBase:
    """The fixture every contract test starts from: a store with one prefill and one
    decode worker registered. Subclasses supply ``harness``."""

    @pytest.fixture
    def ends(self, harness):
        store = harness.open()
        return store, register(store, "p0", "prefill"), register(store, "d0", "decode")
