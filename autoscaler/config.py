"""The autoscaler's settings: PD_AUTOSCALER_* (runtime/common/settings.py), one field each.

The chart (helm/pdserve, `autoscaler:`) sets them on the autoscaler's pod; `python -m
autoscaler` reads them and lets its flags win. The targets (SLOs, profile, GPU budget)
go to the planner; the rest is the policy's (autoscaler/policy.py) and the loop's.
"""

from __future__ import annotations

from pydantic import model_validator

from runtime.common.settings import ServiceSettings, env

POOLS = ("prefill", "decode", "mixed")
"""The worker pools, in the order every table and record lists them."""


class AutoscalerSettings(ServiceSettings):
    """The targets, the policy's rules and where the load and the pools are."""

    slo_ttft_ms: float = env("PD_AUTOSCALER_SLO_TTFT_MS", 1000.0, gt=0)
    """Time-to-first-token target the planner's configuration must meet, ms."""
    slo_tpot_ms: float = env("PD_AUTOSCALER_SLO_TPOT_MS", 100.0, gt=0)
    """Time-per-output-token target the planner's configuration must meet, ms."""
    profile: str = env("PD_AUTOSCALER_PROFILE", "")
    """The planner's cost profile: a name sim.plan.load_profile knows or a file path."""
    max_gpus: int = env("PD_AUTOSCALER_MAX_GPUS", 8, ge=1)
    """Most GPUs the planner may give the pools together."""

    interval_s: float = env("PD_AUTOSCALER_INTERVAL_S", 15.0, gt=0)
    """Seconds between two decisions (observe, recommend, decide, scale)."""
    window_s: float = env("PD_AUTOSCALER_WINDOW_S", 120.0, gt=0)
    """The observed load is the routers' counters' increase over this many seconds."""
    up_stable_s: float = env("PD_AUTOSCALER_UP_STABLE_S", 30.0, ge=0)
    """A pool grows once every recommendation for this long asked for more."""
    down_stable_s: float = env("PD_AUTOSCALER_DOWN_STABLE_S", 300.0, ge=0)
    """A pool shrinks once every recommendation for this long asked for less (hysteresis)."""
    cooldown_s: float = env("PD_AUTOSCALER_COOLDOWN_S", 60.0, ge=0)
    """No change for this long after any change."""
    max_step: int = env("PD_AUTOSCALER_MAX_STEP", 1, ge=1)
    """Most workers added or removed per pool in one decision."""

    min_prefill: int = env("PD_AUTOSCALER_MIN_PREFILL", 1, ge=0)
    """Fewest prefill workers."""
    max_prefill: int = env("PD_AUTOSCALER_MAX_PREFILL", 4, ge=0)
    """Most prefill workers."""
    min_decode: int = env("PD_AUTOSCALER_MIN_DECODE", 1, ge=0)
    """Fewest decode workers."""
    max_decode: int = env("PD_AUTOSCALER_MAX_DECODE", 4, ge=0)
    """Most decode workers."""
    min_mixed: int = env("PD_AUTOSCALER_MIN_MIXED", 0, ge=0)
    """Fewest mixed workers."""
    max_mixed: int = env("PD_AUTOSCALER_MAX_MIXED", 0, ge=0)
    """Most mixed workers (0: the pool is never grown)."""
    history: int = env("PD_AUTOSCALER_HISTORY", 20, ge=1)
    """Decisions kept in the status record (`pdctl autoscale status`)."""
    heartbeat_file: str = env("PD_AUTOSCALER_HEARTBEAT_FILE", "")
    """Touched after every decision (the chart's probes: `python -m autoscaler.health`); empty: none."""

    metrics_urls: str = env("PD_AUTOSCALER_METRICS_URLS", "")
    """Comma-separated /metrics URLs of the routers (the local loop finds them in cluster.json)."""
    metrics_service: str = env("PD_AUTOSCALER_METRICS_SERVICE", "")
    """host:port of a headless Service whose addresses are the routers' /metrics (the chart's
    <fullname>-router-metrics); resolved at every scrape, so new router pods are seen."""
    namespace: str = env("PD_AUTOSCALER_NAMESPACE", "")
    """Kubernetes: the release's namespace (the chart sets it from the pod's)."""
    deployments: str = env("PD_AUTOSCALER_DEPLOYMENTS", "")
    """Kubernetes: pool=Deployment pairs, comma-separated (prefill=pd-pdserve-prefill,...)."""
    status_configmap: str = env("PD_AUTOSCALER_STATUS_CONFIGMAP", "")
    """Kubernetes: the ConfigMap the status record is written to (the chart renders it)."""

    @model_validator(mode="after")
    def _bounds(self):
        for pool in POOLS:
            low, high = self.bounds(pool)
            if low > high:
                raise ValueError(f"min_{pool}={low} is above max_{pool}={high}")
        return self

    def bounds(self, pool: str) -> tuple[int, int]:
        """(fewest, most) workers of `pool`."""
        return getattr(self, f"min_{pool}"), getattr(self, f"max_{pool}")

    def deployment_names(self) -> dict[str, str]:
        """{pool: Deployment name} from `deployments`."""
        pairs = [p.split("=", 1) for p in self.deployments.split(",") if p.strip()]
        bad = [p for p in pairs if len(p) != 2 or p[0].strip() not in POOLS or not p[1].strip()]
        if bad:
            raise ValueError(f"PD_AUTOSCALER_DEPLOYMENTS: expected pool=name pairs (pools {', '.join(POOLS)}), "
                             f"got {self.deployments!r}")
        return {k.strip(): v.strip() for k, v in pairs}
