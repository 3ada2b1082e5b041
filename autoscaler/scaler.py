"""Where the pools are resized: the interface every scaler follows, and an in-memory one.

    sizes()               the loop, before each decision: each pool's size now (the
                          size asked for, not the workers ready: a worker starting counts)
    resize(pool, n)       the loop, for each pool a decision changed; returns once the
                          request is made (Kubernetes) or the change is done (local: the
                          new worker serves, the old one drained and exited). ScalerError
                          when it cannot; the pool is then as it was or partly resized
                          (the next sizes() says which)
    publish(status)       the loop, after each decision: the status record (JSON-ready
                          dict) where `pdctl autoscale status` reads it

Implementations: KubeScaler (autoscaler/kube.py: the Deployments' scale subresource),
LocalScaler (tooling/cluster/autoscale.py: the local launcher), MemoryScaler (below: tests).
"""

from __future__ import annotations

import abc

from .config import POOLS
from .policy import Sizes


class ScalerError(RuntimeError):
    """A pool could not be read or resized; the message says which and why."""


class Scaler(abc.ABC):
    """Reads and resizes the worker pools; publishes the autoscaler's status."""

    pools: tuple[str, ...] = POOLS
    """The pools this scaler can resize (the others stay at 0)."""

    @abc.abstractmethod
    def sizes(self) -> Sizes:
        """Each pool's size now."""

    @abc.abstractmethod
    def resize(self, pool: str, n: int) -> None:
        """Make `pool` `n` workers (see the module docstring)."""

    @abc.abstractmethod
    def publish(self, status: dict) -> None:
        """Store the status record."""


class MemoryScaler(Scaler):
    """Pools that are numbers; records every resize and the last status (tests)."""

    def __init__(self, sizes: Sizes, pools: tuple[str, ...] = POOLS):
        self.current, self.pools = sizes, pools
        self.resizes: list[tuple[str, int]] = []
        self.status: dict | None = None

    def sizes(self) -> Sizes:
        return self.current

    def resize(self, pool: str, n: int) -> None:
        if pool not in self.pools:
            raise ScalerError(f"no {pool} pool here")
        self.resizes.append((pool, n))
        self.current = self.current.with_size(pool, n)

    def publish(self, status: dict) -> None:
        self.status = status
