"""The directory's check of a source's sealed declaration (runtime/security/seal.py).

A destination's Publish may relay the source's seal from its COMMIT instead of the
source declaring with a Begin. The directory rebuilds the declaration from the
*destination's* digest and chunk list and the transaction's own identity (transfer id,
generation, source worker and epoch, all fixed at reserve), and opens the seal with
the key that source registered at that epoch. Opened, the store declares, validates
and publishes in one step (``DirectoryStore.validate_publish(declare=True)``); not
opened, the Publish is CHECKSUM_CONFLICT and nothing moves.

Keys never change within an epoch, so they are cached here by (worker, epoch): the
first Publish from a source's epoch pays one Redis read, later ones none.

The seal is over the transaction's identity, which never changes once reserved: a replica
that kept it (kv_directory/destinations.py) opens the seal without the record (`opens`),
and only a seal that does not open there is judged against the record (`why_not`), where
a transaction already past its declaration is not judged at all.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from kv_directory.store import DirectoryStore
from runtime.directory.records import Transaction, TransferSpec
from runtime.security import seal

log = logging.getLogger(__name__)

MAX_CACHED_KEYS = 4096
"""Source epochs whose keys are held; past it the cache starts over (one read each)."""


class SealJudge:
    """Opens relayed seals against the keys sources registered. Thread-safe: called
    from the directory's store jobs, on its pool or inline on its loop."""

    def __init__(self, on_refused: Callable[[str], None] = lambda reason: None) -> None:
        """`on_refused(reason)`: a seal refused, `no_key` or `not_opened` (a metric). Each
        call names the store a key not cached yet is read from (the servicer's, or its
        inline twin: kv_directory/store_calls.py)."""
        self._on_refused = on_refused
        self._keys: dict[tuple[str, int], Ed25519PublicKey] = {}
        self._lock = threading.Lock()

    def _key(self, store: DirectoryStore, worker_id: str, epoch: int) -> Ed25519PublicKey | None:
        with self._lock:
            key = self._keys.get((worker_id, epoch))
        if key is not None:
            return key
        raw = store.seal_key(worker_id, epoch)
        if not raw:
            return None
        key = seal.public_key(raw)
        with self._lock:
            if len(self._keys) >= MAX_CACHED_KEYS:
                self._keys.clear()
            self._keys[(worker_id, epoch)] = key
        return key

    def opens(self, store: DirectoryStore, spec: TransferSpec, sealed: bytes, held: str) -> bool:
        """Whether `sealed` is the source's seal over `held` for the transfer `spec` names.
        Quiet (no metric, no log): False means "judge it on the record" (`why_not`)."""
        key = self._key(store, spec.source.worker_id, spec.source.epoch)
        return key is not None and _opened(key, spec, sealed, held)

    def why_not(self, store: DirectoryStore, txn: Transaction, sealed: bytes, held: str) -> str:
        """'' when `sealed` is the source's seal over `held` (the destination's evidence)
        for this transaction; else why not (never the seal or the key themselves). A
        transaction past any declaration (published, released, aborted: states only move
        forward) is not judged: the store answers it as it stands (DUPLICATE, the abort's
        cause), so a retried Publish after the source restarted is not a conflict."""
        if not txn.state.is_unpublished:
            return ""
        src = txn.spec.source
        key = self._key(store, src.worker_id, src.epoch)
        if key is None:
            self._on_refused("no_key")
            return f"source {src.worker_id} registered no seal key at epoch {src.epoch}"
        if not _opened(key, txn.spec, sealed, held):
            self._on_refused("not_opened")
            log.warning("transfer %s: the relayed seal is not %s's (epoch %d) over what the destination holds",
                        txn.transfer_id, src.worker_id, src.epoch)
            return (f"the source's seal does not open over the destination's digest and chunks "
                    f"(source {src.worker_id} epoch {src.epoch})")
        return ""


def _opened(key: Ed25519PublicKey, spec: TransferSpec, sealed: bytes, held: str) -> bool:
    """`sealed` opens with `key` over `held` and the transfer's identity (`spec`)."""
    src = spec.source
    return seal.opens(key, sealed, spec.transfer_id, spec.generation, src.worker_id, src.epoch, held)
