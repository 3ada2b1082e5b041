"""What a drill needs from the cluster it runs against (one interface, three
implementations: tooling/cluster/drill.py (server package), kube.py, fake.py).

A drill drives the release through the router's Admin service (the SDK), sends load
through the router, and does what only the deployment can do: record the release where
the deployment keeps it, and replace the decode workers with their previous revision.
Safety invariant: a replaced worker is routed to again only once the directory lists it
with a live lease (a new epoch), not when its pod or process merely reports ready —
a pod Ready before it registered is a window with no routable worker.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass

from pdserve_client.client import Client
from pdserve_client.release import ReleaseView


@dataclass(frozen=True, slots=True)
class Registered:
    """A worker as the directory lists it: id and the epoch of its live lease."""

    worker_id: str
    epoch: int
    role: str


class DrillError(RuntimeError):
    """The drill cannot go on (the message says what the cluster did not do)."""


class DrillCluster(abc.ABC):
    """A cluster a drill runs against."""

    name: str = "cluster"
    """What the report calls it: local, kubernetes (context/namespace), fake."""

    @abc.abstractmethod
    def client(self, identity: str = "client", timeout_s: float = 60.0) -> Client:
        """An SDK client of the cluster's router presenting `identity` ("client" for load,
        "operator" for release changes). The caller closes it."""

    @abc.abstractmethod
    def record_release(self, view: ReleaseView) -> None:
        """Write what the release now is where the deployment keeps it (Kubernetes: the
        release ConfigMap's data; local: a file in the state dir; fake: memory), so that a
        later deploy starts from it."""

    @abc.abstractmethod
    def roll_back_decode(self, timeout_s: float) -> list[Registered]:
        """Replace every decode worker with its previous revision, one at a time (the
        others keep serving), and return the replacements once `wait_registered` saw
        each of them. Kubernetes: the decode Deployment's previous ReplicaSet template;
        local: stop (drain) and start each decode worker process again."""

    def registered(self) -> list[Registered]:
        """The workers the directory lists now (Admin.Status)."""
        with self.client("client", timeout_s=10) as sdk:
            status = sdk.status()
        return [Registered(w.worker_id, w.epoch, w.role) for w in status.workers]

    def wait_registered(self, before: dict[str, int], worker_ids: list[str], timeout_s: float) -> list[Registered]:
        """Until each of `worker_ids` is listed with a live lease at an epoch above the one
        in `before` (a new incarnation registered); DrillError past `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            now = {w.worker_id: w for w in self.registered()}
            fresh = [now[w] for w in worker_ids if w in now and now[w].epoch > before.get(w, 0)]
            if len(fresh) == len(worker_ids):
                return fresh
            if time.monotonic() > deadline:
                missing = sorted(set(worker_ids) - {w.worker_id for w in fresh})
                raise DrillError(f"{', '.join(missing)} not registered with a new lease within {timeout_s:g} s")
            time.sleep(0.2)

    def close(self) -> None:
        """Release what the implementation holds (API clients, port-forwards)."""
