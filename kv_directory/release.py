"""The directory's half of the release (docs/design.md, The release): it keeps the one release record
and lets it move only as the state machine allows (runtime/release/record.py
`check_write`), whoever writes. Read-check-write is safe because the write is a
compare-and-set on the version the check read."""

from __future__ import annotations

import logging

from kv_directory.store import DirectoryStore
from pdserve_client.rpc.pd.v1 import directory_pb2, release_pb2
from runtime.directory.records import ReleaseHead, StoredRelease
from runtime.directory.states import Outcome
from runtime.directory.wire import OUTCOME_TO_PB, BadRequest
from runtime.release.machine import IllegalTransition
from runtime.release.record import ReleaseRecord, check_write
from runtime.release.wire import BadRelease, decode, encode, record_from_pb

log = logging.getLogger(__name__)


def _pb(stored: StoredRelease | None) -> release_pb2.ReleaseRecord | None:
    return None if stored is None else release_pb2.ReleaseRecord.FromString(stored.record)


def get_release(store: DirectoryStore) -> directory_pb2.GetReleaseResponse:
    """The stored record (found=False while none was written)."""
    stored = store.get_release()
    return directory_pb2.GetReleaseResponse(found=stored is not None, record=_pb(stored))


def write_release(store: DirectoryStore, request: directory_pb2.WriteReleaseRequest,
                  by: str) -> directory_pb2.WriteReleaseResponse:
    """Check `request.record` against the stored one and store it (compare-and-set)."""
    try:
        new = record_from_pb(request.record)
    except BadRelease as exc:
        raise BadRequest(f"record: {exc}") from None
    stored = store.get_release()
    old: ReleaseRecord | None = decode(stored.record) if stored is not None else None

    def refused(outcome: Outcome, message: str) -> directory_pb2.WriteReleaseResponse:
        return directory_pb2.WriteReleaseResponse(outcome=OUTCOME_TO_PB[outcome], current=_pb(stored),
                                                  message=message)

    current = old.version if old is not None else 0
    if current != request.expected_version:
        return refused(Outcome.STALE_GENERATION, f"the stored release is version {current}, not "
                                                 f"{request.expected_version}: read it again")
    try:
        check_write(old, new)
    except IllegalTransition as exc:
        log.warning("release write by %s refused: %s", by, exc)
        return refused(Outcome.ILLEGAL_TRANSITION, str(exc))
    head = ReleaseHead(new.version, int(new.state), new.routes_stopped)
    outcome, stored = store.put_release(request.expected_version, head, encode(new))
    if outcome is not Outcome.APPLIED:
        return refused(outcome, "another writer came first: read it again")
    if old is None or old.state is not new.state:
        log.info("release %s -> %s (version %d, by %s)", old.state.name if old else "none", new.state.name,
                 new.version, by)
    return directory_pb2.WriteReleaseResponse(outcome=OUTCOME_TO_PB[outcome], current=_pb(stored))
