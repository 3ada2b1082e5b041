"""The failure-injection smoke's verdicts over the in-process fake cluster, whose workers
check no capability and keep no transaction state: every probe must fail there, saying
what the system accepted (the real refusals are tests/e2e/test_release.py's)."""

from __future__ import annotations

from router.release.controller import ReleaseController
from router.release.smoke import failure_injection_smoke
from router.requests.orchestrator import Orchestrator
from tests.support.orchestrator import config, run, two_by_two


def smoke(signed: bool):
    fake = two_by_two()

    async def go():
        orch = Orchestrator(fake, fake, config(), mint=(lambda m, r: b"capability:" + m.transfer_id.encode())
                            if signed else None)
        return await failure_injection_smoke(ReleaseController(orch, "router-a", orch.config, "tok"))

    return run(go(), timeout_s=30), fake


def test_without_capabilities_the_smoke_fails_saying_so():
    (passed, detail), fake = smoke(signed=False)
    assert not passed and "capabilities are off" in detail
    assert not fake.ops("reserve", "prefill")  # nothing was driven


def test_workers_that_accept_anything_fail_every_probe():
    (passed, detail), fake = smoke(signed=True)
    assert not passed
    assert "bad_capability FAILED: prefill ran the hand-off on a broken signature" in detail
    assert "stale_completion FAILED: the superseded generation completed its hand-off" in detail
    assert "mid_transfer FAILED: in 5 hand-offs" in detail and "the cut never landed before publication" in detail
    # Every probe was torn down as an attempt is: its transactions aborted, both ends cancelled.
    probes = {c[2] for c in fake.ops("reserve")}
    assert probes == {c[2] for c in fake.ops("cancel_decode")} == {c[2] for c in fake.ops("cancel_prefill")}
    assert not [t for t, s in fake.txns.items() if s == "RESERVED"]
