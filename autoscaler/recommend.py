"""The planner's target for an observed load: sim.plan's least-GPU configuration that
meets the SLOs (sim/ is the cluster simulator and placement planner).

    least_gpus(workload, slo_ttft_ms, slo_tpot_ms, profile, max_gpus) -> Configuration | None
    Workload.from_lengths(rate_rps, prompt_tokens, output_tokens, seed)

The workload is the observed rate with lengths drawn from the observed histograms
(`SAMPLES` of each, seeded: one load gives one workload). The planner is imported when
first asked, so the policy, the scalers and their tests need none of it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from .config import AutoscalerSettings
from .observe import ObservedLoad
from .policy import Target

SAMPLES = 1000
"""Lengths drawn from each observed histogram for the planner's workload."""
_PROFILES: dict[str, object] = {}
"""Loaded cost profiles, by name or path."""


class NoTarget(RuntimeError):
    """The planner has no configuration for this load; the message says why."""


def planner_recommend(load: ObservedLoad, settings: AutoscalerSettings) -> Target:
    """The planner's sizes for `load` under the settings' targets (NoTarget when none fits)."""
    plan = importlib.import_module("sim.plan")  # the planner, imported when first asked
    workload_of = importlib.import_module("sim.workload").Workload.from_lengths
    if load.requests <= 0:
        lo = {p: settings.bounds(p)[0] for p in ("prefill", "decode", "mixed")}
        return Target(lo["prefill"], lo["decode"], lo["mixed"],
                      f"no request completed in the last {load.window_s:.0f} s: the pools' minimums")
    workload = workload_of(load.rate_rps, load.prompt_tokens.sample(SAMPLES, seed=1),
                           load.output_tokens.sample(SAMPLES, seed=2), seed=0)
    if settings.profile not in _PROFILES:  # a file read once, not at every decision
        _PROFILES[settings.profile] = plan.load_profile(settings.profile)
    config = plan.least_gpus(workload, settings.slo_ttft_ms, settings.slo_tpot_ms, _PROFILES[settings.profile],
                             settings.max_gpus, bounds={p: settings.bounds(p) for p in ("prefill", "decode", "mixed")})
    targets = f"TTFT {settings.slo_ttft_ms:g} ms, TPOT {settings.slo_tpot_ms:g} ms"
    if config is None:
        raise NoTarget(f"no configuration of at most {settings.max_gpus} GPUs meets {targets} for {load.describe()}")
    return Target(config.prefill, config.decode, config.mixed,
                  f"prefill {config.prefill}, decode {config.decode}, mixed {config.mixed} for {load.describe()} "
                  f"meets {targets} (goodput {config.goodput_rps:.2f} rps, {config.goodput_per_gpu:.2f} rps/GPU): "
                  f"{config.why}")


def recommender(settings: AutoscalerSettings) -> Callable[[ObservedLoad], Target]:
    """`planner_recommend` with the settings bound (what the loop calls)."""
    return lambda load: planner_recommend(load, settings)
