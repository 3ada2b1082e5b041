"""The release record: the one place the release state lives (the directory keeps it in
Redis, so every router replica follows it), with its frozen deployment manifest, its
history and the progress of a rollback. Pure data; the wire mapping is
runtime/release/wire.py.

Writes are compare-and-set on `version` (the directory refuses a stale one), so two
routers cannot both move the release, and a rollback step is recorded only by the
router that holds the rollback's lease (`Rollback.owner`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping

from runtime.release.machine import ROLLBACK_ORDER, IllegalTransition, Release, RollbackStep, check_transition

HISTORY_KEPT = 64
"""Transitions the record keeps (oldest dropped first)."""


@dataclasses.dataclass(frozen=True, slots=True)
class DeploymentManifest:
    """What a release runs, frozen when it is PINNED; its digest names it."""

    model: str
    """Model name the cluster serves."""
    model_identity: tuple[str, ...]
    """The workers' model identities (digest of config and weights); one, when they agree."""
    tokenizer_identity: str
    """Digest of the router's tokenizer (files and settings)."""
    cache_abi_digests: tuple[str, ...]
    """The workers' cache ABI digests; one, when every worker may pair with every other."""
    transports: tuple[str, ...]
    """Data-plane transports the workers advertise (ucx, tcp, inproc)."""
    roles: tuple[str, ...]
    """Worker roles present, as role=count."""
    route_epoch: int
    """The route epoch when it was frozen."""
    allowed_modes: tuple[str, ...]
    """Router modes the release may run requests in."""
    fallback_mode: str
    """Where requests go when disaggregation is off (rollback): colocated."""

    def canonical(self) -> str:
        """Canonical JSON (sorted keys, no spaces): what the digest covers."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))

    @property
    def digest(self) -> str:
        """sha256 of the canonical JSON, hex."""
        return hashlib.sha256(self.canonical().encode()).hexdigest()

    @classmethod
    def from_json(cls, text: str) -> DeploymentManifest:
        """Inverse of `canonical` (ValueError on another shape)."""
        raw = json.loads(text)
        if not isinstance(raw, dict) or set(raw) != {f.name for f in dataclasses.fields(cls)}:
            raise ValueError("not a deployment manifest")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})


@dataclasses.dataclass(frozen=True, slots=True)
class StepRecord:
    """One rollback step as it ran."""

    step: RollbackStep
    started_ms: int
    ended_ms: int = 0
    """0 while it runs (or when the router running it died)."""
    counts: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """What it did: transfers_drained, transfers_aborted, blocks_reclaimed, workers..."""
    detail: str = ""

    @property
    def ended(self) -> bool:
        return self.ended_ms > 0


@dataclasses.dataclass(frozen=True, slots=True)
class Rollback:
    """The rollback of one release: started from `from_state`, steps in order."""

    from_state: Release
    started_ms: int
    reason: str
    by: str
    steps: tuple[StepRecord, ...] = ()
    retired_epoch: int = 0
    """The route epoch ADVANCE_ROUTE_EPOCH retired (0 before that step)."""
    owner: str = ""
    """The router running it; another takes over once `owner_until_ms` passed."""
    owner_until_ms: int = 0

    @property
    def complete(self) -> bool:
        """True once ROLLBACK_COMPLETE ended."""
        return any(s.step is RollbackStep.ROLLBACK_COMPLETE and s.ended for s in self.steps)

    def next_step(self) -> RollbackStep | None:
        """The first step in order that has not ended (None: complete)."""
        done = {s.step for s in self.steps if s.ended}
        return next((s for s in ROLLBACK_ORDER if s not in done), None)

    def step(self, step: RollbackStep) -> StepRecord | None:
        """The record of `step` (None: not started)."""
        return next((s for s in self.steps if s.step is step), None)

    def with_step(self, record: StepRecord) -> Rollback:
        """This rollback with `record` replacing its step's earlier record."""
        assert record.step is self.next_step(), (record.step, self.next_step())  # steps run in order
        return dataclasses.replace(self, steps=tuple(s for s in self.steps if s.step is not record.step) + (record,))

    @property
    def duration_ms(self) -> int:
        """Start to the last step's end (0 while none ended)."""
        ends = [s.ended_ms for s in self.steps if s.ended]
        return max(ends) - self.started_ms if ends else 0


@dataclasses.dataclass(frozen=True, slots=True)
class Transition:
    """One entry of the release history."""

    from_state: Release
    to_state: Release
    at_ms: int
    by: str
    reason: str
    gates: str = ""
    """The gates' verdicts that let it through (promotions), one line."""


@dataclasses.dataclass(frozen=True, slots=True)
class ReleaseRecord:
    """The release: state, version, manifest, history, rollback."""

    state: Release
    version: int
    """Bumped by every write; a write names the version it read (compare-and-set)."""
    manifest: DeploymentManifest | None = None
    canary_fraction: float = 0.0
    history: tuple[Transition, ...] = ()
    rollback: Rollback | None = None
    """The latest rollback (kept after it completed, until the next one)."""

    @property
    def manifest_digest(self) -> str:
        return self.manifest.digest if self.manifest is not None else ""

    @property
    def rolling_back(self) -> bool:
        """ROLLED_BACK with steps left to run."""
        return self.state is Release.ROLLED_BACK and self.rollback is not None and not self.rollback.complete

    @property
    def routes_stopped(self) -> bool:
        """No new disaggregated route may start: from STOP_NEW_ROUTES until the release is
        PINNED again (the directory refuses transfer reservations meanwhile)."""
        return self.state is Release.ROLLED_BACK

    def moved(self, to: Release, at_ms: int, by: str, reason: str, gates: str = "", **changes) -> ReleaseRecord:
        """The next version of this record in state `to`, with the transition in its history."""
        entry = Transition(self.state, to, at_ms, by, reason, gates)
        return dataclasses.replace(self, state=to, version=self.version + 1,
                                   history=(self.history + (entry,))[-HISTORY_KEPT:], **changes)

    def next_version(self, **changes) -> ReleaseRecord:
        """The next version with `changes` (no transition)."""
        return dataclasses.replace(self, version=self.version + 1, **changes)


def check_write(old: ReleaseRecord | None, new: ReleaseRecord) -> None:
    """Return if `new` may replace `old` (None: none stored), else raise IllegalTransition.

    The directory runs this on every write, so no router — stale, buggy or not the
    rollback's owner — can move the release other than the machine allows: a state
    change is a legal transition, the manifest changes only on the way into PINNED, a
    rollback's ended steps are never rewritten and its steps stay in order."""
    expected = (old.version if old is not None else 0) + 1
    if new.version != expected:
        raise IllegalTransition(f"version {new.version} does not follow the stored {expected - 1}")
    if old is None:
        return
    if new.state is not old.state:
        check_transition(old.state, new.state, old.rollback is not None and old.rollback.complete)
    if new.state is Release.PINNED and old.state is not Release.PINNED:
        if new.manifest is None:
            raise IllegalTransition("PINNED freezes a deployment manifest; the write carries none")
    elif new.manifest != old.manifest:
        raise IllegalTransition("the deployment manifest is frozen: it changes only on the way into PINNED")
    if new.state is Release.ROLLED_BACK:
        entering = old.state is not Release.ROLLED_BACK
        rb = new.rollback
        # The write that enters ROLLED_BACK is itself STOP_NEW_ROUTES (it sets routes_stopped).
        if rb is None or (entering and (rb.from_state is not old.state or
                                        any(s.step is not RollbackStep.STOP_NEW_ROUTES for s in rb.steps))):
            raise IllegalTransition(f"entering ROLLED_BACK needs a new rollback from {old.state.name}")
        order = [s.step for s in rb.steps]
        if order != sorted(order) or len(set(order)) != len(order) or \
                any(s.step is not step for s, step in zip(rb.steps, ROLLBACK_ORDER)):
            raise IllegalTransition(f"rollback steps out of order: {[s.name for s in order]}")
        if not entering and old.rollback is not None:
            kept = [s for s in old.rollback.steps if s.ended]
            if list(rb.steps[:len(kept)]) != kept or rb.started_ms != old.rollback.started_ms:
                raise IllegalTransition("a rollback's ended steps are never rewritten")
