"""What one simulated cluster costs: the engine's step times and pool, the K/V
transfer between two workers, the hand-off's fixed costs.

A `SimProfile` is a file a user keeps (`pdctl profile save` writes one from a live
cluster; sim/gpu.py builds the analytic GPU ones): JSON with three objects,

    engine     EngineProfile: the CostProfile the workers publish (prefill and decode
               step times, router/pricing/cost_model.py's functions), and the pool and
               batch limits the engine runs with (capacity per worker)
    transfer   TransferProfile: bytes -> exposed time over one transport
    overheads  Overheads: the fixed costs around the compute (RPC hops, the directory's
               round trips, the hand-off's control plane)

Times are milliseconds, sizes bytes and tokens. A profile describes one *worker*,
which may span several GPUs (`gpus`, tensor parallelism).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from router.pricing import formula
from runtime.directory.cost_profile import CostProfile

FORMAT = "pdserve-sim-profile/1"
"""The `format` field of a saved profile; a file without it is refused."""


@dataclasses.dataclass(frozen=True, slots=True)
class EngineProfile:
    """One worker's step times (the CostProfile it publishes) and its limits."""

    cost: CostProfile
    block_size: int
    total_blocks: int
    """K/V blocks in the worker's pool (its real capacity)."""
    max_decode_batch: int
    """Sequences one decode step runs; more are rotated through (the engine loop)."""
    max_prefill_tokens: int
    """Prompt tokens one prefill chunk computes (chunked prefill)."""
    gpus: int = 1
    """GPUs one worker spans (tensor parallel degree x pipeline stages)."""
    layers: int = 1
    """Model layers: a streamed transfer sends each layer's K/V as prefill writes it."""
    max_model_len: int = 0
    """Longest sequence (prompt + output) the worker takes; 0: no limit known."""

    def __post_init__(self) -> None:
        for name in ("block_size", "total_blocks", "max_decode_batch", "max_prefill_tokens", "gpus", "layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineProfile.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.cost.kv_bytes_per_block <= 0:
            raise ValueError("EngineProfile.cost.kv_bytes_per_block must be > 0 (the hand-off moves blocks)")

    def prefill_ms(self, new: int, reused: int) -> float:
        """The forward pass over `new` prompt tokens after `reused` cached ones (one chunk)."""
        c = self.cost
        return formula.prefill_ms(c.prefill_base_ms, c.prefill_ms_per_token, c.prefill_ms_per_pair, new, reused, 1.0)

    def decode_step_ms(self, batch: int, context: int) -> float:
        """One decode step over `batch` sequences attending over `context` tokens in all."""
        c = self.cost
        return c.decode_base_ms + c.decode_ms_per_seq * batch + c.decode_ms_per_context_token * context


@dataclasses.dataclass(frozen=True, slots=True)
class TransferProfile:
    """K/V transfer between two workers over one transport: ``latency_ms + bytes /
    (gb_per_s * 1e6)`` ms for the whole set; streamed, each layer's share leaves as
    prefill writes it, so only what the prefill could not hide is exposed (at least
    one layer's share: the last layer is written when the prefill ends)."""

    transport: str
    """e.g. ucx-shm, nvlink, rdma-400g, tcp."""
    latency_ms: float
    gb_per_s: float
    """Sustained bandwidth, 1e9 bytes a second."""
    streamed: bool = True

    def __post_init__(self) -> None:
        if not (math.isfinite(self.latency_ms) and self.latency_ms >= 0):
            raise ValueError(f"TransferProfile.latency_ms must be finite and >= 0, got {self.latency_ms!r}")
        if not (math.isfinite(self.gb_per_s) and self.gb_per_s > 0):
            raise ValueError(f"TransferProfile.gb_per_s must be finite and > 0, got {self.gb_per_s!r}")

    def total_ms(self, nbytes: int) -> float:
        """The whole set's transfer time, alone."""
        return self.latency_ms + nbytes / (self.gb_per_s * 1e6) if nbytes > 0 else 0.0

    def exposed_ms(self, nbytes: int, prefill_ms: float, layers: int) -> float:
        """What the transfer adds after the prefill's last chunk: the whole of it when not
        streamed, else its part past the prefill (layer i leaves when layer i is written,
        so the link runs behind the compute) and never less than the last layer's share."""
        total = self.total_ms(nbytes)
        if not self.streamed or layers <= 1 or nbytes <= 0:
            return total
        last = self.latency_ms + nbytes / layers / (self.gb_per_s * 1e6)
        return max(last, total - prefill_ms * (layers - 1) / layers)


@dataclasses.dataclass(frozen=True, slots=True)
class Overheads:
    """Fixed costs around the compute, per request (ms)."""

    colocated_ms: float = 1.0
    """A colocated route's TTFT beyond queue and prefill: the router's and worker's RPC hops."""
    split_ms: float = 2.0
    """A split route's TTFT beyond P's queue and prefill (its token 0 leaves from P)."""
    handoff_ms: float = 2.0
    """After P's last chunk, before D admits: Reserve, COMMIT, validate, publish (the
    directory's round trips and the control plane, bench/handoff.py), beyond the exposed
    transfer."""
    admit_ms: float = 0.0
    """D's engine loop per admitted hand-off (the K/V's import and checks run between two
    iterations): a stall of D's decode batch."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"Overheads.{f.name} must be finite and >= 0, got {v!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class HostProfile:
    """Processes that share CPU cores (the local cluster: every service on one machine).

    Every worker's compute holds one core while it runs; the serving path costs CPU on the
    same cores, `token_cpu_ms` per streamed token (the worker's send, the router's relay,
    the client's receive) and `request_cpu_ms` per request (admission, the decision, the
    directory's calls). When the demand exceeds `cores`, every worker's steps stretch by
    demand / cores (processor sharing, taken at each step's start). A GPU cluster's
    workers own their hosts: no HostProfile."""

    cores: float
    token_cpu_ms: float = 0.0
    request_cpu_ms: float = 0.0
    split_cpu_ms: float = 0.0
    """A split request's CPU beyond a colocated one's: the hand-off's transaction (reserve,
    commit, validate, publish through the directory and Redis) and its transfer."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.cores) and self.cores > 0):
            raise ValueError(f"HostProfile.cores must be > 0, got {self.cores!r}")
        for name in ("token_cpu_ms", "request_cpu_ms", "split_cpu_ms"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"HostProfile.{name} must be finite and >= 0, got {v!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class SimProfile:
    """A worker kind, the transport between two workers and the fixed costs."""

    name: str
    engine: EngineProfile
    transfer: TransferProfile
    overheads: Overheads = Overheads()
    hardware: str = ""
    """e.g. "1x H100 SXM (80 GB)"; "" for a calibrated local profile."""
    model: str = ""
    source: str = ""
    """How it was made: "calibrated <cluster> <date>", "analytic (docs/capacity.md)"."""
    host: HostProfile | None = None
    """The cores the cluster's processes share; None: each worker owns its compute."""

    @property
    def gpus(self) -> int:
        return self.engine.gpus

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["format"] = FORMAT
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SimProfile:
        if d.get("format") != FORMAT:
            raise ValueError(f"not a pdserve simulator profile (format {d.get('format')!r}, expected {FORMAT!r})")
        try:
            e = dict(d["engine"])
            e["cost"] = CostProfile(**e["cost"])
            return cls(name=d["name"], engine=EngineProfile(**e), transfer=TransferProfile(**d["transfer"]),
                       overheads=Overheads(**d.get("overheads", {})), hardware=d.get("hardware", ""),
                       model=d.get("model", ""), source=d.get("source", ""),
                       host=HostProfile(**d["host"]) if d.get("host") else None)
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed simulator profile: {e}") from e

    @classmethod
    def load(cls, path: str | Path) -> SimProfile:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON: {e}") from e

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())
