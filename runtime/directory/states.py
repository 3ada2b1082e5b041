"""Transfer-transaction lifecycle and the outcomes the directory reports.

One K/V hand-off is one transaction, keyed by transfer id (docs/design.md, The transaction)::

    RESERVED ──begin──▶ TRANSFERRING ──validated──▶ VALIDATED ──publish──▶ PUBLISHED ──release──▶ RELEASED
        │                    │                          │
        └────────────────────┴──────────abort───────────┴──────────────▶ ABORTED

* RESERVED     destination blocks are reserved under (request, generation).
* TRANSFERRING chunks are moving; nothing is readable by decode.
* VALIDATED    every expected chunk is device-visible and passed identity,
               coverage and checksum checks at the destination.
* PUBLISHED    one compare-and-set on the request's current generation made the
               complete cache visible to decode. The only state decode may read.
* RELEASED     the decode worker released it when the sequence ended, or the
               directory did when that decode worker was gone (terminal). The
               prefill side never releases: it keeps its blocks as prefix cache.
* ABORTED      any failure before PUBLISHED (terminal). A published cache is
               never aborted: it is released.

The numeric order is meaningful: ``state <= VALIDATED`` is "unpublished"
(owns reserved-but-unreadable blocks), ``state >= RELEASED`` is terminal.

``check_transition`` is the single authority on legal moves. The Redis Lua
scripts do not restate the table: ``redis_store`` renders ``LEGAL_SOURCES``
into every script header, so the two implementations cannot drift.
"""

from __future__ import annotations

import enum


class TxnState(enum.IntEnum):
    """State of one transfer transaction; see the module docstring."""

    RESERVED = 1
    TRANSFERRING = 2
    VALIDATED = 3
    PUBLISHED = 4
    RELEASED = 5
    ABORTED = 6

    @property
    def is_unpublished(self) -> bool:
        """True while the transaction owns reserved blocks decode may not read."""
        return self <= TxnState.VALIDATED

    @property
    def is_terminal(self) -> bool:
        """True once nothing can happen to the transaction any more."""
        return self >= TxnState.RELEASED


class Outcome(enum.IntEnum):
    """What a directory operation did. Values travel through Lua: never renumber.

    APPLIED and DUPLICATE are both successes: DUPLICATE means the same operation
    was already applied (an idempotent retry) and the stored record is returned.
    Every other outcome is a rejection that changed nothing the caller asked for.
    """

    APPLIED = 1
    DUPLICATE = 2
    STALE_GENERATION = 3
    ILLEGAL_TRANSITION = 4
    CHECKSUM_CONFLICT = 5
    NOT_FOUND = 6
    LEASE_LOST = 7
    ROUTES_STOPPED = 8
    """A rollback stopped new disaggregated routes (reserve only): run the request colocated."""

    @property
    def ok(self) -> bool:
        """True for APPLIED and DUPLICATE (the requested state now holds)."""
        return self in (Outcome.APPLIED, Outcome.DUPLICATE)


# new state -> states it may be entered from. Must stay the only transition table.
LEGAL_SOURCES: dict[TxnState, frozenset[TxnState]] = {
    TxnState.RESERVED: frozenset(),  # entered only by reserve(), never by a move
    TxnState.TRANSFERRING: frozenset({TxnState.RESERVED}),
    TxnState.VALIDATED: frozenset({TxnState.TRANSFERRING}),
    TxnState.PUBLISHED: frozenset({TxnState.VALIDATED}),
    TxnState.RELEASED: frozenset({TxnState.PUBLISHED}),
    TxnState.ABORTED: frozenset(
        {TxnState.RESERVED, TxnState.TRANSFERRING, TxnState.VALIDATED}
    ),
}


def check_transition(old: TxnState, new: TxnState) -> bool:
    """Return True iff ``old -> new`` is a legal move of the transaction.

    A self-transition is not legal here; callers treat "already in the target
    state" as an idempotent DUPLICATE before asking this function.
    """
    return old in LEGAL_SOURCES[new]



# Abort reasons the directory itself writes, and the outcome a later forward
# move (begin/validated/publish) on that transaction reports, so the caller
# learns *why* it may not proceed. A caller-chosen reason reports
# ILLEGAL_TRANSITION. Rendered into the Lua header like LEGAL_SOURCES.
ABORT_OUTCOMES: dict[str, Outcome] = {
    "superseded": Outcome.STALE_GENERATION,  # a newer generation was reserved
    "lease_expired": Outcome.LEASE_LOST,  # an end's lease ran out (reaped)
    "worker_restarted": Outcome.LEASE_LOST,  # an end re-registered: new epoch
    "worker_deregistered": Outcome.LEASE_LOST,  # an end left gracefully
    "dest_lease_lost": Outcome.LEASE_LOST,  # found dead during a forward move
    "txn_timeout": Outcome.LEASE_LOST,  # unpublished past txn_ttl_s
    "route_epoch_retired": Outcome.STALE_GENERATION,  # reserved under a route epoch a rollback retired
}
