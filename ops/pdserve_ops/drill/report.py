"""What a drill found: one `DrillReport` (JSON through `to_dict`, text through `render`).

Every figure is what the drill measured on the cluster, never assumed: a figure the
cluster did not give is None in JSON, NOT MEASURED in text, and its check fails.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

NOT_MEASURED = "NOT MEASURED"


@dataclass(frozen=True, slots=True)
class Check:
    """One verdict of the drill."""

    name: str
    """Stable name (requests_failed, tokens_equal_colocated, ...): JSON readers key on it."""
    passed: bool
    value: int | float | None
    """The figure judged (None: the cluster did not report it)."""
    detail: str
    """What was seen, in words, with the target; starts with NOT MEASURED when value is None."""


@dataclass(frozen=True, slots=True)
class StepTiming:
    """One rollback step as the release record has it."""

    step: str
    duration_ms: int
    started_unix_ms: int
    ended_unix_ms: int
    """0: it did not end (blocked, or still running)."""
    counts: dict[str, int]
    detail: str


@dataclass(frozen=True, slots=True)
class Replacement:
    """A decode worker replaced by the decode roll-back: its lease before and after."""

    worker_id: str
    role: str
    epoch_before: int
    epoch_after: int


@dataclass(frozen=True, slots=True)
class DecodeRollback:
    """The decode workers' roll-back to their previous revision."""

    replacements: list[Replacement]
    seconds: float
    """From the first stop to the last replacement registered."""
    error: str = ""
    """Why it stopped short ("" when every worker came back registered)."""


@dataclass(frozen=True, slots=True)
class GateVerdict:
    """One promotion gate's verdict, as the router gave it."""

    name: str
    passed: bool
    detail: str


@dataclass(frozen=True, slots=True)
class Promotion:
    """One promotion step of the promotion drill."""

    from_mode: str
    to_mode: str
    passed: bool
    seconds: float
    gates: list[GateVerdict]
    """Every gate's verdict when it passed; the failed ones (the router's refusal names
    only those) when it was refused."""
    refusal: str = ""
    """The router's refusal, verbatim ("" when promoted)."""


@dataclass(slots=True)
class DrillReport:
    """A drill's findings: load figures, release figures, and a verdict per check."""

    kind: str
    """rollback or promote."""
    cluster: str
    options: dict
    sent: int = 0
    succeeded: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    """The first few failures: request id, code and message."""
    routes: dict[str, int] = field(default_factory=dict)
    """Succeeded requests by the route that served them."""
    disaggregated_before: int = 0
    """Requests completed disaggregated before the rollback or the first promotion."""
    compared: int = 0
    """Requests whose tokens were compared with a colocated re-run."""
    mismatches: list[str] = field(default_factory=list)
    """Requests whose tokens differ from colocated (or could not be compared), first few."""
    mismatch_count: int = 0
    publications_under_old_epoch: int | None = None
    reserved_blocks_after: int | None = None
    open_transactions_after: int | None = None
    release_before: str = ""
    release_after: str = ""
    rollback_ms: int = 0
    """The rollback's duration in the record (first step started to last step ended)."""
    steps: list[StepTiming] = field(default_factory=list)
    decode: DecodeRollback | None = None
    promotions: list[Promotion] = field(default_factory=list)
    load_s: float = 0.0
    """How long the load ran (first request sent to the last one answered)."""
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Every check passed (and there was at least one)."""
        return bool(self.checks) and all(c.passed for c in self.checks)

    def check(self, name: str) -> Check:
        """The check called `name` (KeyError if the drill has none)."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_dict(self) -> dict:
        """JSON-ready dict, `passed` included."""
        return {**asdict(self), "passed": self.passed}


def _counts(counts: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(counts.items()))


def _target(ms: float) -> str:
    return f"{ms:g} ms" if ms else "the router's"


def render(r: DrillReport) -> str:
    """The text `pdctl drill` prints: verdict, one line per check, the rollback's steps
    or the promotions, the first errors and mismatches."""
    o = r.options
    lines = [f"drill {r.kind} on {r.cluster}: {'PASS' if r.passed else 'FAIL'}",
             f"load: {r.sent} sent over {r.load_s:.1f} s (target {o['rate_rps']:g} req/s, concurrency "
             f"{o['concurrency']}, max_tokens {o['max_tokens']}, seed {o['seed']}); {r.succeeded} succeeded, "
             f"{r.failed} failed; routes " + (", ".join(f"{k} {v}" for k, v in sorted(r.routes.items())) or "-"),
             f"release: {r.release_before.upper() or '?'} -> {r.release_after.upper() or '?'}"]
    if r.kind == "promote":
        lines.insert(2, f"canary: waits for {o['canary_samples']} requests on each route; load targets "
                        f"TTFT {_target(o['slo_ttft_ms'])}, TPOT {_target(o['slo_tpot_ms'])}")
    width = max((len(c.name) for c in r.checks), default=0)
    # A figure not measured has none to print: its detail starts with NOT MEASURED.
    lines += [f"  {'PASS' if c.passed else 'FAIL'}  {c.name:<{width}}  "
              f"{'' if c.value is None else f'{c.value}  '}{c.detail}" for c in r.checks]
    if r.steps:
        lines.append(f"rollback steps ({r.rollback_ms} ms in all):")
        lines += [f"  {s.step:<26} " + (f"{s.duration_ms:>7d} ms" if s.ended_unix_ms else "  not ended")
                  + (f"  {_counts(s.counts)}" + (f"  ({s.detail})" if s.detail else "")).rstrip() for s in r.steps]
    if r.decode is not None:
        d = r.decode
        lines.append(f"decode roll-back: {len(d.replacements)} replaced in {d.seconds:.1f} s"
                     + (f"; stopped: {d.error}" if d.error else ""))
        lines += [f"  {p.worker_id} ({p.role}): epoch {p.epoch_before} -> {p.epoch_after}" for p in d.replacements]
    for p in r.promotions:
        lines.append(f"promotion {p.from_mode.upper()} -> {p.to_mode.upper()}: "
                     f"{'promoted' if p.passed else 'REFUSED'} in {p.seconds:.1f} s")
        lines += [f"  gate {g.name}: {'ok' if g.passed else 'FAILED'}: {g.detail}" for g in p.gates]
        if p.refusal and not p.gates:
            lines.append(f"  refusal: {p.refusal}")
    lines += [f"error: {e}" for e in r.errors]
    if r.failed > len(r.errors):
        lines.append(f"error: ... and {r.failed - len(r.errors)} more")
    lines += [f"mismatch: {m}" for m in r.mismatches]
    if r.mismatch_count > len(r.mismatches):
        lines.append(f"mismatch: ... and {r.mismatch_count - len(r.mismatches)} more")
    return "\n".join(lines)
