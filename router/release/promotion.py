"""Promotion gates (docs/design.md, The release), measured on the live cluster when a promotion is asked.

    -> SHADOW   the frozen manifest still describes what runs; disaggregated tokens equal
                colocated ones on a fixed prompt set; colocated fallback serves; the
                failure-injection smoke (router/release/smoke.py: a forged capability, a
                stale completion, a hand-off cut mid-way — each refused or cleaned up)
    -> CANARY   the SHADOW gates again (what runs may have changed since)
    -> ACTIVE   the SHADOW gates, and the canary's own record (router/release/canary.py):
                enough disaggregated samples, TTFT and TPOT attainment each at least
                colocated's, no stale publication, no unsigned hand-off, bounded transfer
                failures
    -> PINNED   (from ROLLED_BACK) none measured: the machine requires the rollback
                complete, and the write freezes a new manifest

A gate that cannot be measured (no pair to hand off between, no SLO target, too few
samples) fails, saying so: a promotion is never let through on a gate not evaluated.
"""

from __future__ import annotations

from router.release.canary import canary_record
from router.release.gates import Check
from router.release.manifest import drift, freeze
from router.release.probes import TENANT, RollbackBlocked, colocated_probe, probe_id
from router.release.smoke import failure_injection_smoke
from router.types import Completed, GenerateParams, Mode, RouterError, TokenOut
from runtime.release.machine import Release

EXACTNESS_PROMPTS = ((5, 9, 2, 6, 5, 3, 5, 8, 9, 7), tuple(range(11, 60)), (2, 7, 1, 8, 2, 8) * 9)
"""The exactness smoke's fixed prompts (token ids every vocabulary has): short, one block
and more, repeated pattern."""
EXACTNESS_TOKENS = 8


async def promotion_gates(ctl, target: Release) -> list[Check]:
    """The gates of a promotion to `target`, measured now."""
    if target is Release.PINNED:
        return []
    checks = [await manifest_verified(ctl), await fallback_healthy(ctl), await exactness_smoke(ctl)]
    passed, detail = await failure_injection_smoke(ctl)
    checks.append(Check("failure_injection_smoke", passed, detail))
    if target is Release.ACTIVE:
        checks += canary_record(ctl, ctl.canary)
    return checks


async def manifest_verified(ctl) -> Check:
    """The frozen manifest's identities are what the live workers and router declare."""
    frozen = ctl.record.manifest
    if frozen is None:
        return Check("manifest_verified", False, "no deployment manifest was frozen")
    differ = drift(frozen, freeze(await ctl.orch.view.get(max_age_s=0.0), ctl))
    return Check("manifest_verified", not differ,
                 f"the live cluster is not the frozen {frozen.digest[:16]}'s: {'; '.join(differ)} (frozen for "
                 "another deployment: a rollback, then a promotion to PINNED, freezes this one)" if differ
                 else f"live cluster matches the frozen manifest {frozen.digest[:16]}")


async def fallback_healthy(ctl) -> Check:
    try:
        ttft_ms = await colocated_probe(ctl)
    except RollbackBlocked as exc:
        return Check("colocated_fallback_healthy", False, str(exc))
    return Check("colocated_fallback_healthy", True, f"a colocated request served, TTFT {ttft_ms:.1f} ms")


async def exactness_smoke(ctl) -> Check:
    """Each fixed prompt, greedy, disaggregated and colocated: the tokens must be equal."""
    mismatches, runs = [], 0
    for prompt in EXACTNESS_PROMPTS:
        try:
            dis, route = await _tokens(ctl, prompt, Mode.DISAGGREGATED)
            col, _ = await _tokens(ctl, prompt, Mode.COLOCATED)
        except RouterError as exc:
            return Check("exactness_smoke", False, f"a smoke request failed: {exc.code.name}: {exc.message}")
        if route != "DISAGGREGATED":
            return Check("exactness_smoke", False, f"the disaggregated smoke request ran {route.lower()}: "
                                                   "no prefill/decode pair took it")
        runs += 1
        if dis != col:
            first = next(i for i, (a, b) in enumerate(zip(dis, col)) if a != b) if dis[:1] else 0
            mismatches.append(f"prompt {runs}: first differs at token {first}")
    return Check("exactness_smoke", not mismatches,
                 "; ".join(mismatches) or f"{runs} prompts x {EXACTNESS_TOKENS} tokens identical", len(mismatches), 0)


async def _tokens(ctl, prompt: tuple[int, ...], mode: Mode) -> tuple[list[int], str]:
    params = GenerateParams(request_id=probe_id("release-smoke"), tenant=TENANT,
                            prompt_token_ids=prompt, max_tokens=EXACTNESS_TOKENS, mode=mode, deadline_ms=60_000)
    run = await ctl.orch.submit(params)
    events = [e async for e in run.stream()]
    done = events[-1]
    assert isinstance(done, Completed)
    return [e.token_id for e in events if isinstance(e, TokenOut)], done.route.name
