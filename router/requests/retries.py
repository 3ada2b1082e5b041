"""One request's retry bookkeeping across its attempts, for the orchestrator's policy
(router/requests/orchestrator.py `_attempts`): what was tried, whom to avoid, how many
attempts and disaggregated attempts are left, and the attempts that do not count
(a worker that had no room after all; a request id that ran before)."""

from __future__ import annotations

import dataclasses
from collections import Counter

from router.requests.attempt import Attempt, AttemptFailed
from router.types import Route, RouterError, StatusCode


@dataclasses.dataclass
class Retries:
    disaggregated_left: int
    """Disaggregated attempts still allowed (then colocated)."""
    generation: int
    """The last generation used (or found used) for this request id."""
    number: int = 0
    """Attempts made (counted ones)."""
    avoid: Counter[str] = dataclasses.field(default_factory=Counter)
    """This request's failures per worker: 1 per suspicion, 2 when certain."""
    tried: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    """(P, D) pairs never to choose again."""
    unreachable: dict[str, int] = dataclasses.field(default_factory=dict)
    """Worker id -> epoch whose own call failed UNAVAILABLE in this request."""
    codes: list[StatusCode] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)
    requeues: int = 0
    behind_hops: int = 0
    wait_until: float | None = None
    """Until when the request waits for unreachable workers to be replaced (set on first wait)."""

    def dispatch(self, att: Attempt) -> None:
        """`att` is about to run: count it."""
        self.number += 1
        att.number = self.number
        self.generation = att.generation
        if att.route is Route.DISAGGREGATED:
            self.disaggregated_left -= 1
            self.tried.add((att.prefill.worker_id, att.decode.worker_id))

    def uncount(self, att: Attempt) -> None:
        """`att` ended without anybody failing: it does not count, its pair may be tried again."""
        self.number -= 1
        if att.route is Route.DISAGGREGATED:
            self.disaggregated_left += 1
            self.tried.discard((att.prefill.worker_id, att.decode.worker_id))

    def failed(self, att: Attempt, exc: AttemptFailed) -> None:
        """`att` failed: remember why and whom to avoid."""
        self.failures.append(f"{att.describe()}: {exc}")
        self.codes.append(exc.code)
        self.avoid.update(exc.suspects)
        if exc.culprit is not None:
            self.avoid[exc.culprit.worker_id] += 1
            if exc.code is StatusCode.UNAVAILABLE:
                self.unreachable[exc.culprit.worker_id] = exc.culprit.epoch

    def into_unreachable(self, att: Attempt) -> bool:
        """True when `att` would run on a worker (at the same epoch) that failed to answer."""
        return any(w is not None and self.unreachable.get(w.worker_id) == w.epoch
                   for w in (att.prefill, att.decode))

    def exhausted(self) -> RouterError:
        """The request's error once no attempt is left (or no worker can take it)."""
        if not self.failures:
            return RouterError(StatusCode.UNAVAILABLE, "no live worker can take this request")
        code = StatusCode.RESOURCE_EXHAUSTED if all(c is StatusCode.RESOURCE_EXHAUSTED for c in self.codes) \
            else StatusCode.UNAVAILABLE
        return RouterError(code, f"all {len(self.failures)} attempts failed: {'; '.join(self.failures)}")
