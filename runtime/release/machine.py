"""The release state machine of the disaggregated path and the order of its rollback
(docs/design.md, The release). Pure logic: no grpc, no redis.

    PINNED ──> SHADOW ──> CANARY ──> ACTIVE        promotion: one step at a time,
      │          │          │          │           each through its gates
      └──────────┴────┬─────┴──────────┘           (runtime/release/gates.py)
                      v
                 ROLLED_BACK ──> PINNED            only once the rollback completed

ROLLED_BACK is entered from any other state and runs the rollback in `ROLLBACK_ORDER`;
every step is recorded (time, counts) as it ends, so a router that dies mid-rollback
leaves a record the next one resumes from the first step not ended. Back to PINNED freezes a new deployment manifest.

What each state means for a request that names no mode (`ROUTER_MODE`): PINNED and
ROLLED_BACK run colocated, SHADOW scores disaggregated routes and runs colocated,
CANARY runs a share disaggregated, ACTIVE lets the router choose per request.
"""

from __future__ import annotations

import enum


class Release(enum.IntEnum):
    """Release state; the values are pd.v1.ReleaseMode's (Must match proto/pd/v1/admin.proto)."""

    PINNED = 1
    SHADOW = 2
    CANARY = 3
    ACTIVE = 4
    ROLLED_BACK = 5


PROMOTION_ORDER = (Release.PINNED, Release.SHADOW, Release.CANARY, Release.ACTIVE)
"""The promotion path; a promotion moves one place along it."""

ROUTER_MODE = {Release.PINNED: "colocated", Release.SHADOW: "shadow", Release.CANARY: "canary",
               Release.ACTIVE: "auto", Release.ROLLED_BACK: "colocated"}
"""Router mode (router/requests/planner.py) of requests that name none, per state."""

RELEASE_OF_MODE = {"colocated": Release.PINNED, "shadow": Release.SHADOW, "canary": Release.CANARY,
                   "auto": Release.ACTIVE, "disaggregated": Release.ACTIVE}
"""The state a cluster starts in when no release was recorded yet: its router's mode's."""


class RollbackStep(enum.IntEnum):
    """The rollback's steps, in the order they run (docs/design.md, The release).

    Safety invariant: routes stop before the connector is disabled (a request whose
    prompt owner already committed to a remote decode is not stranded), fallback is
    enabled before transfer is disabled (no availability gap), and unpublished
    allocations are reclaimed only after the transport is quiet (no buffer is freed
    under an in-flight write)."""

    STOP_NEW_ROUTES = 1
    ADVANCE_ROUTE_EPOCH = 2
    DRAIN_OR_ABORT_TRANSFERS = 3
    ENABLE_COLOCATED_FALLBACK = 4
    DISABLE_CONNECTOR = 5
    REVOKE_CAPABILITIES = 6
    RECLAIM_UNPUBLISHED = 7
    ROLLBACK_COMPLETE = 8


ROLLBACK_ORDER = tuple(RollbackStep)


class IllegalTransition(ValueError):
    """A release transition the machine refuses; the message says why and what is legal."""


def next_promotion(state: Release) -> Release | None:
    """The state a promotion from `state` goes to (None: ACTIVE and ROLLED_BACK have none)."""
    if state not in PROMOTION_ORDER or state is Release.ACTIVE:
        return None
    return PROMOTION_ORDER[PROMOTION_ORDER.index(state) + 1]


def check_transition(current: Release, target: Release, rollback_complete: bool = False) -> None:
    """Return if `current -> target` is legal, else raise IllegalTransition saying why.

    `rollback_complete`: the current rollback ended its last step (only read from
    ROLLED_BACK, which may go back to PINNED only then)."""
    if target is current:
        hint = " (an unfinished rollback resumes with `pdctl release rollback`)" \
            if current is Release.ROLLED_BACK and not rollback_complete else ""
        raise IllegalTransition(f"the release is already {current.name}{hint}")
    if target is Release.ROLLED_BACK:
        return
    if current is Release.ROLLED_BACK:
        if target is not Release.PINNED:
            raise IllegalTransition(f"ROLLED_BACK -> {target.name} is not a transition: after a rollback the "
                                    "release goes back to PINNED (a new manifest), then promotes again")
        if not rollback_complete:
            raise IllegalTransition("ROLLED_BACK -> PINNED needs the rollback completed first; "
                                    "`pdctl release rollback` resumes it")
        return
    step = next_promotion(current)
    if target is not step:
        legal = f"{current.name} -> {step.name}" if step is not None else "none (ACTIVE is the last)"
        raise IllegalTransition(f"{current.name} -> {target.name} is not a transition: a promotion moves one "
                                f"state at a time (legal now: {legal}, or ROLLED_BACK)")
