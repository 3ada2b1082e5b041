"""Gates of the release, evaluated from what the system measured, never asserted: the
rollback's completion gate and the promotion gates (docs/design.md, The release).

A gate is a `Check`: its name, whether it passed, the measured value against its
threshold where it has one, and a line saying what was seen."""

from __future__ import annotations

import dataclasses

from router.release.probes import RollbackBlocked, colocated_probe, open_transfers, reserved_blocks
from runtime.release.machine import RollbackStep


@dataclasses.dataclass(frozen=True, slots=True)
class Check:
    """One gate's verdict."""

    name: str
    passed: bool
    detail: str
    measured: float = 0.0
    threshold: float = 0.0

    def line(self) -> str:
        """`name ok|FAILED (measured vs threshold): detail`."""
        figures = f" ({self.measured:g} vs {self.threshold:g})" if self.measured or self.threshold else ""
        return f"{self.name} {'ok' if self.passed else 'FAILED'}{figures}: {self.detail}"


async def completion_gate(ctl) -> list[Check]:
    """Every completion condition of the rollback, checked now (it completes only if all pass)."""
    record, orch = ctl.record, ctl.orch
    cluster = await orch.view.get(max_age_s=0.0)
    retired = record.rollback.retired_epoch
    open_txns = await open_transfers(ctl)
    advanced = record.rollback.step(RollbackStep.ADVANCE_ROUTE_EPOCH)
    at_retirement = advanced.counts.get("publications_at_retirement", 0) if advanced is not None else 0
    late = await orch.directory.publications(retired, ctl.config.directory_timeout_s) - at_retirement
    checks = [
        Check("no_route_selects_the_connector", cluster.release.routes_stopped and orch.view.colocated_only,
              "the directory refuses transfer reservations and this router places colocated only"),
        Check("nothing_publishes_under_the_retired_epoch", cluster.route_epoch > retired and not open_txns,
              f"route epoch {cluster.route_epoch} > retired {retired}; {len(open_txns)} unpublished transfers open",
              len(open_txns), 0),
        Check("no_publication_under_the_retired_epoch_since", late == 0,
              f"{late} transfers published under route epoch {retired} after it was retired", late, 0),
        Check("capabilities_revoked", cluster.route_epoch > retired,
              "a capability's nonce is honoured only under the route epoch it was minted in"),
    ]
    try:
        left = await reserved_blocks(ctl)
        checks.append(Check("unpublished_allocations_reclaimed", left == 0, f"{left} blocks reserved", left, 0))
    except RollbackBlocked as exc:
        checks.append(Check("unpublished_allocations_reclaimed", False, str(exc)))
    try:
        ttft_ms = await colocated_probe(ctl)
        clocks = _samples(orch.metrics.registry, "pd_ttft_seconds"), _samples(orch.metrics.registry, "pd_tpot_seconds")
        checks.append(Check("fallback_healthy_and_both_slo_clocks_visible", all(clocks),
                            f"colocated probe TTFT {ttft_ms:.1f} ms; TTFT samples {clocks[0]:g}, "
                            f"TPOT samples {clocks[1]:g}"))
    except RollbackBlocked as exc:
        checks.append(Check("fallback_healthy_and_both_slo_clocks_visible", False, str(exc)))
    checks.append(Check("manifest_preserved", record.manifest is not None,
                        f"deployment manifest {record.manifest_digest[:16] or 'none'} kept in the record"))
    return checks


def _samples(registry, family: str) -> float:
    """Observations so far of histogram `family` (all label sets)."""
    return sum(s.value for m in registry.collect() if m.name == family
               for s in m.samples if s.name == f"{family}_count")


def summary(checks: list[Check]) -> str:
    """One line of verdicts, for the release history."""
    return "; ".join(c.line() for c in checks)

