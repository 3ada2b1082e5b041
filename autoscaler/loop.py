"""One autoscaler: observe -> recommend -> decide -> resize -> publish, every interval.

`Autoscaler.step()` is one decision; `run()` repeats it until stopped. A step never
raises for what the cluster does: a router that does not answer, a planner with no
configuration, a Deployment that cannot be scaled are each a hold (or a failed change)
whose reason says so, recorded like every decision in the status record:

    {"format": STATUS_FORMAT, "updated_s": unix time, "scaler": "kube" | "local",
     "current": {pool: n}, "target": {pool: n} | null, "load": ObservedLoad.to_dict() | null,
     "last": Decision.to_dict(), "decisions": [the newest `history` decisions, newest first]}
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from .observe import ObservedLoad, Observer
from .policy import Decision, Policy, Sizes, Target
from .recommend import NoTarget
from .scaler import Scaler, ScalerError

log = logging.getLogger(__name__)

STATUS_FORMAT = "pdserve-autoscaler-status/1"  # Must match STATUS_FORMAT in ops/pdserve_ops/cli_autoscale.py


class Autoscaler:
    """The loop's parts, each injected (the planner's `recommend` included)."""

    def __init__(self, observer: Observer, recommend: Callable[[ObservedLoad], Target], policy: Policy,
                 scaler: Scaler, kind: str, history: int = 20, clock: Callable[[], float] = time.time):
        self.observer, self.recommend, self.policy, self.scaler = observer, recommend, policy, scaler
        self.kind, self.clock = kind, clock
        self.decisions: deque[Decision] = deque(maxlen=history)
        self.load: ObservedLoad | None = None

    def step(self) -> Decision:
        """One decision, carried out and published."""
        now = self.clock()
        try:
            current = self.scaler.sizes()
        except ScalerError as e:
            log.error("pools unreadable: %s", e)
            last = self.decisions[0].new if self.decisions else Sizes()
            return self._record(Decision(now, last, last, None, f"hold: pools unreadable: {e}"))
        target, why = self._target()
        decision = self.policy.decide(now, current, target, why)
        for pool in decision.changed:
            try:
                self.scaler.resize(pool, decision.new.of(pool))
            except ScalerError as e:
                log.error("resize failed: %s", e)
                decision = dataclasses.replace(decision, reason=f"{decision.reason}; FAILED: {e}")
                break
        return self._record(decision)

    def _target(self) -> tuple[Target | None, str]:
        try:
            self.load = self.observer.observe()
        except RuntimeError as e:
            self.load = None
            return None, f"no observed load: {e}"
        try:
            return self.recommend(self.load), ""
        except NoTarget as e:
            return None, f"planner: {e}"

    def _record(self, decision: Decision) -> Decision:
        (log.info if decision.changed else log.debug)("%s", decision.reason)
        self.decisions.appendleft(decision)
        status = {"format": STATUS_FORMAT, "updated_s": decision.at_s, "scaler": self.kind,
                  "current": decision.new.as_dict(),
                  "target": decision.target.as_dict() if decision.target else None,
                  "load": self.load.to_dict() if self.load else None, "last": decision.to_dict(),
                  "decisions": [d.to_dict() for d in self.decisions]}
        try:
            self.scaler.publish(status)
        except (ScalerError, OSError) as e:
            log.error("status not published: %s", e)
        return decision

    def run(self, interval_s: float, stop: threading.Event, heartbeat: Path | None = None) -> None:
        """`step` every `interval_s` until `stop` is set; touch `heartbeat` after each (the probes')."""
        while not stop.is_set():
            started = time.monotonic()
            self.step()
            if heartbeat is not None:
                heartbeat.touch()
            stop.wait(max(0.0, interval_s - (time.monotonic() - started)))
