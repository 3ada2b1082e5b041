"""Configuration shared by the prefill and decode workers (one frozen dataclass)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pdserve_client import contract
from services.common.config import env_overrides
from services.engine import EngineConfig


@dataclass(frozen=True)
class WorkerConfig:
    """Settings of one worker process."""

    listen: str = "127.0.0.1:0"
    """gRPC listen address (port 0 picks a free port)."""
    advertise: str = ""
    """Address others use to reach this worker; empty = the bound listen address."""
    directory_addr: str = contract.DEFAULT_DIRECTORY_ADDRESS
    """Directory service address (PD_DIRECTORY_ADDR, as the router reads it)."""
    worker_id: str = ""
    """Stable name of this worker; empty = role-pid."""
    model: str = "tiny"
    """Preset name (tiny, small, name@seed) or checkpoint directory."""
    serve_prefill: bool = False
    """Decode worker only: also serve pd.v1.Prefill from the same engine, so the router can
    use this worker for either phase of a split route, or for both (directory role mixed)."""
    num_blocks: int = EngineConfig.num_blocks
    """K/V blocks in the pool (the engine's default: one default, one variable)."""
    block_size: int = EngineConfig.block_size
    """Tokens per block."""
    chunk_tokens: int = EngineConfig.chunk_tokens
    """Prefill chunk size."""
    max_batch: int = 64
    """Most sequences in one decode step."""
    max_tokens_limit: int = 4096
    """Largest max_tokens accepted."""
    transport: str = "ucx"
    """Data-plane backend: ucx, tcp or inproc."""
    data_host: str = "127.0.0.1"
    """Host the data-plane receiver binds."""
    max_chunk_blocks: int = 64
    """Most blocks in one transfer chunk (per layer)."""
    stream_layers: bool = True
    """Send each layer's chunks as soon as prefill wrote them (else after the whole prefill)."""
    stream_min_bytes: int = 4 << 20
    """Transfers smaller than this go in one piece after prefill. Measured on `small`
    (2 cores): a 100-token prompt (0.9 MiB) had 20–40 ms more TTFT streamed (the
    sends compete with the prefill for CPU and gain ~1 ms of overlap); 2,048 tokens
    (16 MiB) exposed 14–30 ms after compute streamed vs 67–95 ms not."""
    credit_window_bytes: int = 64 << 20
    """Byte credits in flight per destination (ucx sender)."""
    transfer_timeout_s: float = 10.0
    """Bound on every wait of the data plane (a chunk's data, a peer's reply)."""
    metrics_file: str = ""
    """Rewrite this file every second with Prometheus-text metrics ("{worker}" is replaced
    by the worker id); empty = off."""
    event_log: str = ""
    """Append hand-off events (JSON lines) to this file; empty = off (tests)."""
    reservation_ttl_s: float = 30.0
    """An unpublished reservation is reclaimed after this long; so is a published
    sequence no DecodeStream has claimed this long after publication."""
    prefill_ttl_s: float = 120.0
    """A prefill (compute, send, commit) still running this long after it was accepted
    is cancelled and its blocks freed, whatever it waits on: the backstop for a caller
    that vanished without its call being cancelled (the router's own deadline is
    shorter; a lost connection is usually noticed sooner by gRPC)."""
    rpc_timeout_s: float = 5.0
    """Deadline of calls to the directory and peers."""
    torch_threads: int = EngineConfig.torch_threads
    """Intra-op threads of this worker's engine."""
    fault_delay_before_send_s: float = 0.0
    """Fault injection (services/transfer/faults.py): a transfer's first chunk waits this long."""
    fault_chunk_delay_s: float = 0.0
    """Fault injection: prefill sleeps this long before every chunk but the first."""
    fault_pause_s: float = 0.0
    """Fault injection: a request whose id contains "@<step>" waits this long at that
    hand-off step (services/worker/events.PAUSE_STEPS); 0 = off."""
    fault_corrupt_chunk: int = -1
    """Fault injection: the chunk with this index goes out with a wrong checksum."""
    fault_replay_chunk: int = -1
    """Fault injection: the chunk with this index is sent twice."""
    fault_row_dependent_kernels: bool = False
    """Fault injection: lm_head gives a row other bits in calls of fewer than 4 rows (as a
    BLAS may), so the start-up self-check fails and the worker registers colocated-only."""

    def __post_init__(self):
        if self.transport not in ("tcp", "inproc", "ucx"):
            raise ValueError(f"transport {self.transport!r} not in tcp, inproc, ucx")
        if self.reservation_ttl_s <= 0 or self.prefill_ttl_s <= 0 or self.max_chunk_blocks <= 0:
            raise ValueError("reservation_ttl_s, prefill_ttl_s and max_chunk_blocks must be positive")
        if self.credit_window_bytes <= 0 or self.transfer_timeout_s <= 0:
            raise ValueError("credit_window_bytes and transfer_timeout_s must be positive")

    def engine_config(self) -> EngineConfig:
        """The engine settings these worker settings imply."""
        return EngineConfig.from_env(num_blocks=self.num_blocks, block_size=self.block_size,
                                     chunk_tokens=self.chunk_tokens,
                                     torch_threads=self.torch_threads)

    @classmethod
    def from_env(cls, **overrides) -> WorkerConfig:
        """Defaults, then PD_<FIELD> environment variables, then keyword overrides."""
        table = {"PD_" + f.name.upper(): f.name for f in dataclasses.fields(cls)}
        kw = env_overrides(cls, table, skip_empty=True)
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kw)
