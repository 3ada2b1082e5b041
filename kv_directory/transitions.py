"""One transaction transition's store job: who may make it, the fence, the store's call.

The servicer (kv_directory/server.py) names the caller and the RPC's step (`Op`); this runs
in one store job (on the pool, or inline: kv_directory/store_calls.py). The transaction's
identity (its ends, their epochs, the request id, the generation: fixed at reserve) is the
one this replica kept from its Reserve (kv_directory/destinations.py), else the record's,
read first. The state and the source's declaration change, so they are judged inside the
store's atomic call; a step that needs them before (`Op` answering None on the identity
alone) and a refusal that reports the state read the record as it stands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from kv_directory.access import Denied
from kv_directory.convert import fence, txn_response
from kv_directory.store import DirectoryStore
from pdserve_client.rpc.pd.v1 import directory_pb2
from runtime.directory.records import Transaction, TransferSpec, TxnResult
from runtime.directory.states import Outcome, TxnState
from runtime.directory.wire import STATE_TO_PB
from runtime.security.pki import Identity

Step = Callable[[], TxnResult]
"""A transition's store call, named by its RPC once the request is checked."""
Op = Callable[[DirectoryStore, TransferSpec, Transaction | None], Step | None]
"""An RPC's step: checks the request against the transaction (the record, or None on the
identity alone, where it may answer None: "I need the record") and names its call on the
store it is given (the servicer's, or its inline twin: kv_directory/store_calls.py)."""
ENDED = frozenset(STATE_TO_PB[state] for state in TxnState if state.is_terminal)
"""A transaction answered in these states is not moved again: its kept identity goes."""


class Asked(NamedTuple):
    """A transition request's identity fields (TxnTransitionRequest's, or a Publish's)."""

    request_id: str
    transfer_id: str
    generation: int
    worker_id: str
    worker_epoch: int


def decide(store: DirectoryStore, known: TransferSpec | None, asked: Asked, op: Op, who: Identity | None,
           ends: tuple[str, ...], destination_only: bool) -> directory_pb2.TxnResponse:
    """Blocking (a store job): check that `who` (None: not checked; a router: any) is one of
    `ends` of the transaction, let `op` check the request and name its call, fence against
    the identity, then make the call."""
    tid = asked.transfer_id

    def not_found() -> directory_pb2.TxnResponse:
        return txn_response(Outcome.NOT_FOUND, None, asked.request_id, tid)
    spec, txn = known, None
    if spec is None:
        if (txn := store.lookup(tid)) is None:
            return not_found()
        spec = txn.spec
    if who is not None and who.role != "router":
        allowed = {"source": spec.source.worker_id, "destination": spec.dest.worker_id}
        if who.name not in (allowed[e] for e in ends):
            raise Denied(f"{who} is not the {' or '.join(ends)} of transfer {tid}")
    call = op(store, spec, txn)  # after the caller checks: an outsider learns nothing from the request's content
    rejected = fence(spec, asked.request_id, asked.generation, asked.worker_id, asked.worker_epoch, destination_only)
    if call is None or (rejected is not None and txn is None):  # the record, as it stands
        if (txn := store.lookup(tid)) is None:
            return not_found()
        call = call or op(store, txn.spec, txn)
    if rejected is not None:
        return txn_response(rejected, txn, asked.request_id, tid)
    result = call()
    return txn_response(result.outcome, result.txn, asked.request_id, tid)
