"""A worker's cost profile as the directory stores it (pd.v1.CostProfile).

Workers measure it at start (runtime/worker/profile.py) and send it once at
registration; the directory stores it opaquely with the worker record and the
router evaluates it (router/pricing/cost_model.py).
"""

from __future__ import annotations

import dataclasses
import json
import math


@dataclasses.dataclass(frozen=True, slots=True)
class CostProfile:
    """A worker's measured cost model (pd.v1.CostProfile; field for field, by name).

    ``prefill_ms(new, reused) = prefill_base_ms + prefill_ms_per_token * new
    + prefill_ms_per_pair * new * (reused + new / 2)``;
    ``decode_step_ms(batch, ctx) = decode_base_ms + decode_ms_per_seq * batch
    + decode_ms_per_context_token * ctx``. The directory only stores it; the
    router evaluates it. An all-zero profile means "none declared".
    """

    prefill_base_ms: float = 0.0
    prefill_ms_per_token: float = 0.0
    prefill_ms_per_pair: float = 0.0
    decode_base_ms: float = 0.0
    decode_ms_per_seq: float = 0.0
    decode_ms_per_context_token: float = 0.0
    kv_bytes_per_block: int = 0
    source: str = ""
    """``calibrated``, ``file:<path>`` or ``default``; empty when none was declared."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name != "source" and not (math.isfinite(v) and v >= 0):
                raise ValueError(f"CostProfile.{f.name} must be finite and >= 0, got {v!r}")

    @property
    def declared(self) -> bool:
        """True when the worker sent a profile."""
        return bool(self.source)

    def to_json(self) -> str:
        """Compact JSON (the Redis hash field and the saved-profile file format)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CostProfile:
        """Inverse of ``to_json``; unknown keys are ignored, missing ones default."""
        data = json.loads(text) if text else {}
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


PROFILE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(CostProfile))
