"""The autoscaler on the local cluster (tooling/cluster/launcher.py): a worker process per
worker, the loop of autoscaler/ driving it.

    python -m tooling.cluster.autoscale .pdserve --profile PROFILE --slo-ttft-ms T --slo-tpot-ms P


Up: `LocalCluster.add_worker(role)` starts one more worker on the lowest free index and
returns once it serves (registered with the directory, so the router sees it at its next
snapshot). Down: the newest worker of the pool gets SIGTERM and is waited for; it drains
(runtime/worker/node.py: new work refused UNAVAILABLE so the router places it elsewhere,
requests in flight finish, blocks given back, deregistered) and exits, then the launcher
forgets it. The status record is `<state dir>/autoscaler.json` (private, like the rest of
the state dir), which `pdctl autoscale status` reads.
"""

from __future__ import annotations

import json
import logging
import sys

from autoscaler.__main__ import parse_args, run
from autoscaler.config import POOLS, AutoscalerSettings
from autoscaler.observe import Observer
from autoscaler.policy import Sizes
from autoscaler.scaler import Scaler, ScalerError
from runtime.common.private_files import private_write
from tooling.cluster.launcher import LocalCluster

log = logging.getLogger(__name__)

STATUS_FILE = "autoscaler.json"  # Must match STATUS_FILE in ops/pdserve_ops/cli_autoscale.py
"""The status record's name in the state dir."""


class LocalScaler(Scaler):
    """Resizes a LocalCluster's worker pools; `drain_timeout_s` bounds a worker's drain
    before it is killed (keep it above the workers' PD_DRAIN_TIMEOUT_S)."""

    pools = POOLS

    def __init__(self, cluster: LocalCluster, drain_timeout_s: float = 60.0, start_timeout_s: float = 120.0):
        self.cluster = cluster
        self.drain_timeout_s, self.start_timeout_s = drain_timeout_s, start_timeout_s

    def sizes(self) -> Sizes:
        alive = self.cluster.alive()
        return Sizes(*(sum(alive.get(n, False) for n in self.cluster.workers(p)) for p in POOLS))

    def resize(self, pool: str, n: int) -> None:
        assert pool in POOLS and n >= 0, (pool, n)
        try:
            while len(names := self.cluster.workers(pool)) < n:
                log.info("%s: starting worker %d of %d", pool, len(names) + 1, n)
                self.cluster.add_worker(pool, self.start_timeout_s)
            while len(names := self.cluster.workers(pool)) > n:
                log.info("%s: draining %s (%d -> %d)", pool, names[-1], len(names), n)
                self.cluster.remove_worker(names[-1], self.drain_timeout_s)
        except (OSError, RuntimeError, TimeoutError) as e:
            raise ScalerError(f"{pool} -> {n}: {e}") from e

    def publish(self, status: dict) -> None:
        private_write(self.cluster.state / STATUS_FILE, json.dumps(status, indent=1))


def local_parts(settings: AutoscalerSettings, state_dir: str) -> tuple[Scaler, Observer]:
    """The local scaler and an observer of the cluster's router(s), as its monitor."""
    cluster = LocalCluster.load(state_dir)

    def urls() -> list[str]:
        return [p.metrics_url for n, p in cluster.procs.items() if cluster.roles.get(n) == "router" and p.metrics_url]

    return LocalScaler(cluster), Observer(urls, cluster.identity("monitor").client_ssl(), settings.window_s)


def main(argv: list[str] | None = None) -> int:
    """`python -m tooling.cluster.autoscale STATE_DIR ...`: the loop on a local cluster."""
    args = parse_args(argv, local=True)
    return run(args, lambda settings: local_parts(settings, args.state_dir), "local")


if __name__ == "__main__":
    sys.exit(main())
