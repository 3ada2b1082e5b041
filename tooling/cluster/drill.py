"""The local cluster (`pdserve up`) as a drill's cluster: its state dir's certificates, its
router, and its decode worker processes, which the decode roll-back stops and starts
again one at a time (tooling/cluster/launcher.py does the process work).

It lives in the server package (the client distribution starts no process and imports
nothing of the server) and reaches `pdctl drill --cluster local` through the entry point
`pdserve.drill_clusters` (pyproject.toml): a client-only install has no local drill.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from pdserve_client import contract, tls
from pdserve_client.client import Client
from pdserve_client.release import ReleaseView
from pdserve_ops.drill.cluster import DrillCluster, DrillError, Registered
from tooling.cluster.launcher import LocalCluster

RELEASE_FILE = "release.json"
"""Where `record_release` writes the release, in the state dir."""
STOP_S = 30.0
"""A decode worker's graceful stop at most: its drain (PD_DRAIN_TIMEOUT_S, 20 s by default)
and its shutdown; then it is killed."""
DECODE_ROLES = ("decode", "mixed")


class LocalDrillCluster(DrillCluster):
    """A running local cluster, found by its state dir (`pdserve up`'s `.pdserve`)."""

    def __init__(self, state_dir: str = contract.LOCAL_STATE_DIR, router: str | None = None):
        """`router` overrides the address the state dir records."""
        self.state = Path(state_dir).resolve()
        try:
            self._cluster = LocalCluster.load(str(self.state))
        except FileNotFoundError:
            raise DrillError(f"no local cluster in {self.state}: no cluster.json there "
                             "(start one with `pdserve up`, or name its state dir with --state-dir)") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise DrillError(f"{self.state / 'cluster.json'} is not a cluster the launcher wrote: {exc}") from None
        self._router = router or self._cluster.router_address
        self.name = f"local ({self.state})"

    def client(self, identity: str = "client", timeout_s: float = 60.0) -> Client:
        """An SDK client of the router presenting the state dir's `identity` certificate
        (none for a cluster started insecure: then $PD_INSECURE=1 must say so too)."""
        files = self._cluster.client_files(identity)
        if files is None and not tls.insecure():
            raise DrillError(f"the cluster in {self.state} runs without TLS (`pdserve up --insecure`): "
                             f"set {contract.INSECURE_ENV}=1 to drill it")
        return Client(self._router, timeout_s=timeout_s, tls_files=files)

    def record_release(self, view: ReleaseView) -> None:
        """Write the release to `release.json` in the state dir (replaced whole: a reader
        never sees half of it)."""
        path = self.state / RELEASE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(view.to_dict(), indent=2) + "\n")
        os.replace(tmp, path)

    def decode_workers(self) -> list[str]:
        """The names of the decode (and mixed) worker processes the state dir records."""
        return [name for name in self._cluster.procs if self._cluster.roles.get(name) in DECODE_ROLES]

    def roll_back_decode(self, timeout_s: float) -> list[Registered]:
        """Stop each decode worker (SIGTERM: it drains its in-flight work and deregisters),
        start it again with the same command line, and wait until it registered at a new
        epoch before the next one, so the others serve meanwhile.

        Safety invariant: the next worker stops only once this one is listed with a live
        lease, so with two or more decode workers one always serves."""
        deadline = time.monotonic() + timeout_s
        before = {w.worker_id: w.epoch for w in self.registered()}
        replaced = []
        for name in self.decode_workers():
            left = deadline - time.monotonic()
            if left <= 0:
                raise DrillError(f"decode roll-back out of time ({timeout_s:g} s) before {name}")
            self._replace(name, left)
            replaced += self.wait_registered(before, [name], max(0.0, deadline - time.monotonic()))
        return replaced

    def _replace(self, name: str, budget_s: float) -> None:
        c = self._cluster
        try:
            c.stop(name, timeout_s=min(STOP_S, budget_s))
        except BaseException:
            # Interrupted mid-stop (Ctrl-C): the worker has its SIGTERM and drains. Let it
            # end (another SIGTERM only repeats the request) and start it again: a drill
            # never leaves a decode worker down.
            c.stop(name, timeout_s=STOP_S)
            c.restart(name, timeout_s=max(1.0, budget_s))
            raise
        try:
            c.restart(name, timeout_s=max(1.0, budget_s))
        except (RuntimeError, TimeoutError) as exc:
            raise DrillError(f"{name} did not start again: {exc} (log: {c.procs[name].log})") from None
