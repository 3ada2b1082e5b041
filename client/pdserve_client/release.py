"""The release (Admin.ReleaseStatus / Promote / Rollback, `pdctl release`) as plain values,
their conversion from pd.v1, and their text form.

The release is a state machine (pinned -> shadow -> canary -> active, rolled_back from
any of them, pinned again after a completed rollback); its record lives in the
directory, with the deployment manifest frozen when it was pinned, its history, and the
latest rollback's steps with their times and counts.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from pdserve_client.rpc.pd.v1 import admin_pb2, release_pb2
from pdserve_client.types import PdError
from pdserve_client.wire import enum_name

RELEASE_TIMEOUT_S = 120.0
"""Default deadline of a promotion or a rollback: gates run requests, a drain waits."""


def _mode(value: int) -> str:
    return enum_name(release_pb2.ReleaseMode, value, "RELEASE_MODE_")


def _step(value: int) -> str:
    return release_pb2.RollbackStep.Name(value).removeprefix("ROLLBACK_STEP_")


@dataclass(frozen=True, slots=True)
class RollbackStepView:
    """One rollback step as it ran."""

    step: str
    """STOP_NEW_ROUTES, ADVANCE_ROUTE_EPOCH, ... ROLLBACK_COMPLETE."""
    started_unix_ms: int
    ended_unix_ms: int
    """0 while it runs (or when it stopped: see detail)."""
    counts: dict[str, int]
    detail: str

    @property
    def duration_ms(self) -> int:
        return self.ended_unix_ms - self.started_unix_ms if self.ended_unix_ms else 0


@dataclass(frozen=True, slots=True)
class RollbackView:
    """The latest rollback."""

    from_mode: str
    started_unix_ms: int
    reason: str
    by: str
    steps: tuple[RollbackStepView, ...]
    retired_epoch: int
    owner: str
    owner_until_unix_ms: int

    @property
    def complete(self) -> bool:
        return any(s.step == "ROLLBACK_COMPLETE" and s.ended_unix_ms for s in self.steps)

    @property
    def duration_ms(self) -> int:
        ends = [s.ended_unix_ms for s in self.steps if s.ended_unix_ms]
        return max(ends) - self.started_unix_ms if ends else 0


@dataclass(frozen=True, slots=True)
class ReleaseView:
    """The release record and what the answering router sees."""

    mode: str
    """pinned, shadow, canary, active or rolled_back."""
    version: int
    manifest: dict = field(default_factory=dict)
    """The frozen deployment manifest's fields ({} while none was frozen), digest included."""
    canary_fraction: float = 0.0
    history: tuple[dict, ...] = ()
    """Transitions, oldest first: from_mode, to_mode, at_unix_ms, by, reason, gates."""
    rollback: RollbackView | None = None
    router_mode: str = ""
    routes_stopped: bool = False
    router_id: str = ""
    route_epoch: int = 0
    manifest_drift: str = ""
    """Where the live cluster is not the frozen manifest ("field frozen -> live; ..."): the
    record was kept from another deployment. Empty: the manifest describes what runs."""
    canary_min_samples: int = 0
    """What the answering router's canary gates judge on at least, per route (0: unknown)."""
    canary_slo_ttft_ms: float = 0.0
    """The TTFT target a request of the caller's tenant that names none gets (0: none)."""
    canary_slo_tpot_ms: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Gate:
    """One gate's verdict."""

    name: str
    passed: bool
    measured: float
    threshold: float
    detail: str


@dataclass(frozen=True, slots=True)
class ReleaseChange:
    """A promotion's or a rollback's result."""

    previous_mode: str
    release: ReleaseView
    gates: tuple[Gate, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)


def record_from_proto(r: release_pb2.ReleaseRecord, **seen) -> ReleaseView:
    rollback = None
    if r.HasField("rollback"):
        rb = r.rollback
        rollback = RollbackView(_mode(rb.from_mode), rb.started_unix_ms, rb.reason, rb.by, tuple(
            RollbackStepView(_step(s.step), s.started_unix_ms, s.ended_unix_ms, dict(s.counts), s.detail)
            for s in rb.steps), rb.retired_epoch, rb.owner, rb.owner_until_unix_ms)
    manifest = {}
    if r.HasField("manifest"):
        m = r.manifest
        values = {f.name: getattr(m, f.name) for f in m.DESCRIPTOR.fields}
        manifest = {k: v if isinstance(v, (str, int)) else list(v) for k, v in values.items()}
    history = tuple({"from_mode": _mode(t.from_mode), "to_mode": _mode(t.to_mode), "at_unix_ms": t.at_unix_ms,
                     "by": t.by, "reason": t.reason, "gates": t.gates} for t in r.history)
    return ReleaseView(_mode(r.mode), r.version, manifest, r.canary_fraction, history, rollback, **seen)


def status_from_proto(s: admin_pb2.ReleaseStatusResponse) -> ReleaseView:
    return record_from_proto(s.record, router_mode=s.router_mode, routes_stopped=s.routes_stopped,
                             router_id=s.router_id, route_epoch=s.route_epoch, manifest_drift=s.manifest_drift,
                             canary_min_samples=s.canary.min_samples, canary_slo_ttft_ms=s.canary.slo_ttft_ms,
                             canary_slo_tpot_ms=s.canary.slo_tpot_ms)


def change_from_proto(c: admin_pb2.ReleaseChange) -> ReleaseChange:
    return ReleaseChange(_mode(c.previous_mode), record_from_proto(c.record), tuple(
        Gate(g.name, g.passed, g.measured, g.threshold, g.detail) for g in c.gates))


NEXT = {"rolled_back": "PINNED", "pinned": "SHADOW", "shadow": "CANARY", "canary": "ACTIVE"}
"""The state `pdctl release promote` moves each to (runtime/release/machine.py's order)."""
SERVES = {"rolled_back": "every request runs colocated, one that asks for disaggregated too",
          "pinned": "requests that name no mode run colocated",
          "shadow": "requests that name no mode run colocated (disaggregated routes are only scored)",
          "canary": "a share of the requests that name no mode run disaggregated"}


def standing(view: ReleaseView) -> str:
    """What the release means for requests now and the commands that move it, when it is
    not simply ACTIVE under a manifest of what runs ("" then): what `pdserve up` prints."""
    lines = []
    if view.mode != "active":
        lines.append(f"release {view.mode.upper()}{_since(view)}: {SERVES.get(view.mode, '')}; {_moves(view)}")
    if view.manifest_drift:
        lines.append(f"release manifest {view.manifest.get('digest', '')[:16]} is NOT the live cluster's: "
                     f"{view.manifest_drift}; {_refreeze(view)}")
    return "\n".join(lines)


def _refreeze(view: ReleaseView) -> str:
    """What freezes a manifest of the live cluster: a promotion to PINNED, after a rollback."""
    first = "" if view.mode == "rolled_back" else "`pdctl release rollback --reason R`, then "
    return f"frozen for an earlier deployment: {first}`pdctl release promote --reason R` to PINNED freezes this one"


def stopped_routes(view: ReleaseView) -> str:
    """Why a request that asked for disaggregated ran colocated with no attempt failed,
    when the release is why (a rollback stops those routes); "" when it is not."""
    if not view.routes_stopped:
        return ""
    return (f"the release is {view.mode.upper()}, which stops disaggregated routes until it is promoted "
            "(`pdctl release promote --reason R`; `pdctl release status` says more)")


def stopped_routes_of(client) -> str:
    """`stopped_routes` of the release `client` (a pdserve_client.Client) reads now; "" when it
    cannot be read: the request's answer stands, the release is only its explanation."""
    try:
        return stopped_routes(client.release())
    except PdError:
        return ""


def _since(view: ReleaseView) -> str:
    entered = [t for t in view.history if t["to_mode"] == view.mode]
    if not entered:
        return ""
    t = entered[-1]
    return f" since {_when(t['at_unix_ms'])} ({t['by']}: {t['reason'] or '-'})"


def _moves(view: ReleaseView) -> str:
    rb = view.rollback
    if view.mode == "rolled_back" and rb is not None and not rb.complete:
        return "its rollback is unfinished: `pdctl release rollback --reason R` resumes it"
    step = NEXT.get(view.mode, "the next state")
    onwards = "" if step == "ACTIVE" else ", then one state at a time on to ACTIVE"
    promote = (f"`pdctl release promote --reason R` moves it to {step}{onwards} through the gates "
               "(`pdctl drill promote` takes it to ACTIVE under load)")
    return promote + ("" if view.mode == "rolled_back" else "; `pdctl release rollback --reason R` rolls it back")


def _when(unix_ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(unix_ms / 1000)) + f".{unix_ms % 1000:03d}Z"


def render(view: ReleaseView) -> str:
    """The text `pdctl release status` prints."""
    lines = [f"release: {view.mode.upper()} (version {view.version})"
             + (f", canary fraction {view.canary_fraction:g}" if view.mode == "canary" else "")]
    if view.router_id:
        lines.append(f"router {view.router_id}: requests without a mode run {view.router_mode}; "
                     f"{'colocated only (routes stopped)' if view.routes_stopped else 'disaggregated routes allowed'}; "
                     f"route epoch {view.route_epoch}")
    m = view.manifest
    if m:
        lines.append(f"manifest {m.get('digest', '')[:16]}: model {m.get('model', '')}, cache ABI "
                     f"{', '.join(d[:12] for d in m.get('cache_abi_digests', []))}, transports "
                     f"{', '.join(m.get('transports', [])) or '-'}, roles {', '.join(m.get('roles', []))}, "
                     f"fallback {m.get('fallback_mode', '')}, frozen at route epoch {m.get('route_epoch', 0)}")
    else:
        lines.append("manifest: none frozen")
    if view.manifest_drift:
        lines.append(f"  NOT the live cluster's: {view.manifest_drift}; {_refreeze(view)}")
    rb = view.rollback
    if rb is not None:
        state = f"complete in {rb.duration_ms} ms" if rb.complete else f"in progress (runner {rb.owner or '-'})"
        lines.append(f"rollback from {rb.from_mode.upper()} at {_when(rb.started_unix_ms)} by {rb.by}: {state}; "
                     f"reason: {rb.reason or '-'}")
        for s in rb.steps:
            counts = " ".join(f"{k}={v}" for k, v in sorted(s.counts.items()))
            took = f"{s.duration_ms:>6d} ms" if s.ended_unix_ms else "   ... "
            lines.append(f"  {s.step:<26} {took}  {counts}{'  ' + s.detail if s.detail else ''}")
    for t in view.history[-10:]:
        lines.append(f"history: {_when(t['at_unix_ms'])} {t['from_mode']} -> {t['to_mode']} by {t['by']}: "
                     f"{t['reason'] or '-'}")
    return "\n".join(lines)
