"""Predicted vs observed, per request: a bounded in-memory log (Admin.Decisions reads it).

One record per admitted-or-rejected request, created when the route is
decided, completed when the request ends. The oldest records are dropped
first once `capacity` is reached, so memory stays bounded under any load.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict


@dataclasses.dataclass(slots=True)
class DecisionRecord:
    """What the router predicted for a request and what it then saw (pd.v1.DecisionRecord)."""

    request_id: str
    tenant: str
    mode: str
    outcome: str
    """disaggregated | colocated | rejected."""
    prefill_worker_id: str = ""
    decode_worker_id: str = ""
    predicted_ttft_ms: float = 0.0
    predicted_tpot_ms: float = 0.0
    observed_ttft_ms: float = 0.0
    observed_tpot_ms: float = 0.0
    slo_ttft_ms: float = 0.0
    slo_tpot_ms: float = 0.0
    shadow_prefill_worker_id: str = ""
    shadow_decode_worker_id: str = ""
    shadow_predicted_ttft_ms: float = 0.0
    shadow_predicted_tpot_ms: float = 0.0
    prompt_tokens: int = 0
    compute_tokens: int = 0
    transfer_tokens: int = 0
    decision_us: float = 0.0
    reason: str = ""
    finished: bool = False


class DecisionLog:
    """The newest `capacity` records, by request id."""

    def __init__(self, capacity: int = 4096):
        assert capacity > 0
        self._capacity = capacity
        self._records: OrderedDict[str, DecisionRecord] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def add(self, record: DecisionRecord) -> None:
        """Insert (or replace) a record as the newest; drops the oldest past capacity."""
        self._records.pop(record.request_id, None)
        self._records[record.request_id] = record
        while len(self._records) > self._capacity:
            self._records.popitem(last=False)

    def get(self, request_id: str) -> DecisionRecord | None:
        """The record of `request_id`, or None (never recorded, or dropped)."""
        return self._records.get(request_id)

    def observe(self, request_id: str, ttft_ms: float, tpot_ms: float, route: str = "",
                prefill_worker_id: str | None = None, decode_worker_id: str | None = None) -> None:
        """The request completed with these client-visible times (and on this route,
        which differs from the decision's after a retry)."""
        r = self._records.get(request_id)
        if r is None:
            return
        r.observed_ttft_ms, r.observed_tpot_ms, r.finished = ttft_ms, tpot_ms, True
        if route and route != r.outcome:
            r.reason += f"; executed {route} after a retry"
        if prefill_worker_id is not None:
            r.prefill_worker_id = prefill_worker_id
        if decode_worker_id is not None:
            r.decode_worker_id = decode_worker_id

    def finish(self, request_id: str, why: str = "") -> None:
        """The request ended without a completion (failed, cancelled)."""
        r = self._records.get(request_id)
        if r is not None and not r.finished:
            r.finished = True
            if why:
                r.reason += f"; ended: {why}"

    def recent(self, limit: int = 100, request_id: str = "", tenant: str | None = None) -> list[DecisionRecord]:
        """Newest first; only `request_id` when given; only `tenant`'s when given."""
        if request_id:
            r = self._records.get(request_id)
            return [r] if r is not None and tenant in (None, r.tenant) else []
        out = []
        for r in reversed(self._records.values()):
            if len(out) >= limit:
                break
            if tenant in (None, r.tenant):
                out.append(r)
        return out
