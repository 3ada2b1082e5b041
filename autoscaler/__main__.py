"""`python -m autoscaler --kube`: the autoscaler's loop in its pod (docs/autoscaler.md).

    --kube             the chart's pool Deployments (PD_AUTOSCALER_NAMESPACE, _DEPLOYMENTS,
                       _STATUS_CONFIGMAP; the routers' /metrics from _METRICS_SERVICE or
                       _METRICS_URLS, scraped with this pod's PD_TLS_* certificate)

On the local cluster the same loop runs from the tooling, which owns the launcher:
`python -m tooling.cluster.autoscale STATE_DIR` (tooling/cluster/autoscale.py).

Every other setting is a PD_AUTOSCALER_* variable (autoscaler/config.py); the flags below
win over them. SIGTERM or Ctrl-C stops the loop between two decisions.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from runtime.common.grpc_server import setup_logging
from runtime.common.settings import SettingsError
from runtime.security.tls import Security

from .config import POOLS, AutoscalerSettings
from .loop import Autoscaler
from .observe import Observer, service_urls
from .policy import Policy, Rules
from .recommend import recommender
from .scaler import Scaler, ScalerError


def parse_args(argv: list[str] | None, local: bool = False) -> argparse.Namespace:
    """The command line (`local`: the local cluster's, tooling/cluster/autoscale.py)."""
    prog = "python -m tooling.cluster.autoscale" if local else "python -m autoscaler"
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    if local:
        ap.add_argument("state_dir", metavar="STATE_DIR", help="the local cluster's state dir (`pdserve up`'s)")
    else:
        ap.add_argument("--kube", action="store_true", required=True, help="scale the chart's pool Deployments")
    ap.add_argument("--interval-s", type=float, help="seconds between decisions (PD_AUTOSCALER_INTERVAL_S)")
    ap.add_argument("--profile", help="the planner's cost profile (PD_AUTOSCALER_PROFILE)")
    ap.add_argument("--slo-ttft-ms", type=float, help="TTFT target, ms (PD_AUTOSCALER_SLO_TTFT_MS)")
    ap.add_argument("--slo-tpot-ms", type=float, help="TPOT target, ms (PD_AUTOSCALER_SLO_TPOT_MS)")
    ap.add_argument("--max-gpus", type=int, help="most GPUs for all pools (PD_AUTOSCALER_MAX_GPUS)")
    ap.add_argument("--once", action="store_true", help="one decision, printed, then exit")
    return ap.parse_args(argv)


def rules_for(settings: AutoscalerSettings, scaler: Scaler) -> Rules:
    """The settings' rules, with the pools the scaler cannot resize held at 0."""
    rules = Rules.of(settings)
    bounds = {p: rules.bounds[p] if p in scaler.pools else (0, 0) for p in POOLS}
    return Rules(rules.up_stable_s, rules.down_stable_s, rules.cooldown_s, rules.max_step, bounds)


def kube_parts(settings: AutoscalerSettings) -> tuple[Scaler, Observer]:
    """The Kubernetes scaler and an observer of the routers, as this pod."""
    from .kube import KubeScaler, api_client

    security = Security.from_env("autoscaler")
    scheme = "https" if security.secure else "http"
    static = [u.strip() for u in settings.metrics_urls.split(",") if u.strip()]

    def urls() -> list[str]:
        return static + (service_urls(settings.metrics_service, scheme) if settings.metrics_service else [])

    scaler = KubeScaler(api_client(), settings.namespace, settings.deployment_names(), settings.status_configmap)
    return scaler, Observer(urls, security.client_ssl(), settings.window_s)


def main(argv: list[str] | None = None) -> int:
    """Run the loop on Kubernetes (see `run`)."""
    return run(parse_args(argv), kube_parts, "kube")


def run(args: argparse.Namespace, parts: Callable[[AutoscalerSettings], tuple[Scaler, Observer]],
        where: str) -> int:
    """Run the loop with the scaler and observer `parts` makes; 2 on bad settings or a missing
    planner, 1 when the pools are unreachable."""
    try:
        settings = AutoscalerSettings.from_env(interval_s=args.interval_s, profile=args.profile,
                                               slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms,
                                               max_gpus=args.max_gpus)
        setup_logging("autoscaler", settings.log_level)
        import sim.plan  # noqa: F401  the planner: fail now, not at the first decision
        scaler, observer = parts(settings)
    except (SettingsError, ValueError, ImportError, FileNotFoundError) as e:
        print(f"autoscaler: {e}", file=sys.stderr)
        return 2
    try:
        scaler.sizes()  # reachable, and allowed: say so at start, not one interval later
    except ScalerError as e:
        print(f"autoscaler: {e}", file=sys.stderr)
        return 1
    auto = Autoscaler(observer, recommender(settings), Policy(rules_for(settings, scaler)), scaler, where,
                      settings.history)
    if args.once:
        print(auto.step().reason)
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        auto.run(settings.interval_s, stop, Path(settings.heartbeat_file) if settings.heartbeat_file else None)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
