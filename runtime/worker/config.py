"""Settings of a worker process: what every node has, and what each role adds.

    NodeConfig            every worker: addresses, the engine (EngineConfig's variables),
                          the data-plane transport, files, fault knobs both roles obey
    PrefillSettings       the prefill role: its TTL and how it sends K/V
    DecodeSettings        the decode role: reservations, the receiver, request limits
    PrefillWorkerConfig   = NodeConfig + PrefillSettings   (python -m prefill_worker)
    DecodeWorkerConfig    = NodeConfig + DecodeSettings    (python -m decode_worker)
    WorkerConfig          = NodeConfig + both              (a mixed worker: --serve-prefill)

Each variable is declared once (runtime/common/settings.py); a worker reads the
variables of its own roles only, so a prefill worker ignores PD_RESERVATION_TTL_S.
"""

from __future__ import annotations

from typing import Literal

from pydantic_settings import SettingsConfigDict

from runtime.common.settings import MemberSettings, Settings, env
from runtime.engine import EngineConfig

_WORKER = SettingsConfigDict(env_ignore_empty=True)
"""Workers (and the engine) treat a variable set to '' as unset."""


class NodeConfig(MemberSettings, EngineConfig):
    """What every worker process has, whichever phases it serves."""

    model_config = _WORKER

    listen: str = env("PD_LISTEN", "127.0.0.1:0")
    """gRPC listen address (port 0 picks a free port)."""
    advertise: str = env("PD_ADVERTISE", "")
    """Address the router uses to reach this worker's gRPC server, registered in the
    directory: host:port, or a host (the bound port is added); empty = the bound listen
    address. In Kubernetes: the pod IP (downward API)."""
    data_plane_advertise: str = env("PD_DATA_PLANE_ADVERTISE", "")
    """Host this worker's data plane names in the address it registers (ucx and tcp
    alike; PD_DATA_HOST is what tcp binds, often 0.0.0.0); empty = the bind host (tcp)
    or the host name (ucx). In Kubernetes: the pod IP (downward API)."""
    drain_timeout_s: float = env("PD_DRAIN_TIMEOUT_S", 20.0, ge=0)
    """On SIGTERM the worker reports NOT_SERVING, refuses new hand-offs (Reserve, Prefill,
    Generate: UNAVAILABLE, so the router retries elsewhere) and waits this long at most
    for its in-flight requests to finish; then it aborts what is still unpublished,
    deregisters and exits 0. Keep it a few seconds below the pod's
    terminationGracePeriodSeconds (the stop after it takes up to ~4 s more)."""
    worker_id: str = env("PD_WORKER_ID", "")
    """Stable name of this worker; empty = role-pid."""
    max_batch: int = env("PD_MAX_BATCH", 64, gt=0)
    """Most sequences in one decode step."""
    engine: Literal["pdserve", "vllm"] = env("PD_ENGINE", "pdserve")
    """The engine behind the hand-off: pdserve's own (exact, CPU; the reference) or vLLM's
    (runtime/vllm: any architecture vLLM serves, GPUs; PD_MODEL a checkpoint directory,
    the worker run in the environment `make vllm-env` builds)."""
    vllm_args: str = env("PD_VLLM_ARGS", "")
    """vLLM engine only: a JSON object of more vLLM engine arguments (EngineArgs), e.g.
    {"tensor_parallel_size": 2, "quantization": "fp8"}; pdserve sets the cache's size,
    block size, dtype and connector itself."""
    vllm_host_staging: Literal["auto", "on", "off"] = env("PD_VLLM_HOST_STAGING", "auto")
    """vLLM engine only: how the transport reaches its K/V (runtime/vllm/kv_memory.py). auto:
    in place where the cache is host memory in whole blocks (vLLM-CPU), else through a host
    buffer per handed-off sequence (a GPU's cache); on: always through the buffer."""
    transport: Literal["ucx", "tcp", "inproc"] = env("PD_TRANSPORT", "ucx")
    """Data-plane backend: ucx, tcp or inproc."""
    transfer_timeout_s: float = env("PD_TRANSFER_TIMEOUT_S", 10.0, gt=0)
    """Bound on every wait of the data plane (a chunk's data, a peer's reply)."""
    rpc_timeout_s: float = env("PD_RPC_TIMEOUT_S", 5.0, gt=0)
    """Deadline of calls to the directory and peers."""
    event_log: str = env("PD_EVENT_LOG", "")
    """Append hand-off events (JSON lines) to this file; empty = off (tests)."""
    fault_pause_s: float = env("PD_FAULT_PAUSE_S", 0.0, ge=0)
    """Fault injection: a request whose id contains "@<step>" waits this long at that
    hand-off step (runtime/worker/events.PAUSE_STEPS); 0 = off."""
    fault_row_dependent_kernels: bool = env("PD_FAULT_ROW_DEPENDENT_KERNELS", False)
    """Fault injection: lm_head gives a row other bits in calls of fewer than 4 rows (as a
    BLAS may), so the start-up self-check fails and the worker registers colocated-only."""
    load_report_change: float = env("PD_LOAD_REPORT_CHANGE", 0.125, ge=0, le=1)
    """A heartbeat leaves before its time (a lease third) once free blocks, the decode
    batch or the queued prompt tokens moved by this share of the worker's capacity since
    the last one (runtime/worker/membership.py); 0: every lease third only."""
    load_report_min_interval_s: float = env("PD_LOAD_REPORT_MIN_INTERVAL_S", 0.25, gt=0)
    """How often the load is checked for that, and so the closest two heartbeats come."""


class PrefillSettings(Settings):
    """The prefill role: computes prompts and sends their K/V."""

    model_config = _WORKER

    prefill_ttl_s: float = env("PD_PREFILL_TTL_S", 120.0, gt=0)
    """A prefill (compute, send, commit) still running this long after it was accepted
    is cancelled and its blocks freed, whatever it waits on: the backstop for a caller
    that vanished without its call being cancelled (the router's own deadline is
    shorter; a lost connection is usually noticed sooner by gRPC)."""
    stream_layers: bool = env("PD_STREAM_LAYERS", True)
    """Send each layer's chunks as soon as prefill wrote them (else after the whole prefill).
    Unset, the engine decides (`streams_layers`): on for pdserve's, off for vLLM reading its
    host-memory cache in place (bench/vllm.py, 2 cores, one per worker: 2,048 tokens added
    61 ms to TTFT streamed against 1 ms not, and token 1 came 77 ms later streamed)."""
    stream_min_bytes: int = env("PD_STREAM_MIN_BYTES", 4 << 20, ge=0)
    """Transfers smaller than this go in one piece after prefill. Measured on `small`
    (2 cores): a 100-token prompt (0.9 MiB) had 20–40 ms more TTFT streamed (the
    sends compete with the prefill for CPU and gain ~1 ms of overlap); 2,048 tokens
    (16 MiB) exposed 14–30 ms after compute streamed vs 67–95 ms not."""
    credit_window_bytes: int = env("PD_CREDIT_WINDOW_BYTES", 64 << 20, gt=0)
    """Byte credits in flight per destination (ucx sender)."""
    fault_delay_before_send_s: float = env("PD_FAULT_DELAY_BEFORE_SEND_S", 0.0, ge=0)
    """Fault injection (runtime/transfer/faults.py): a transfer's first chunk waits this long."""
    fault_chunk_delay_s: float = env("PD_FAULT_CHUNK_DELAY_S", 0.0, ge=0)
    """Fault injection: prefill sleeps this long before every chunk but the first."""
    fault_corrupt_chunk: int = env("PD_FAULT_CORRUPT_CHUNK", -1)
    """Fault injection: the chunk with this index goes out with a wrong checksum."""
    fault_replay_chunk: int = env("PD_FAULT_REPLAY_CHUNK", -1)
    """Fault injection: the chunk with this index is sent twice."""


class DecodeSettings(Settings):
    """The decode role: reserves blocks, receives K/V, decodes."""

    model_config = _WORKER

    serve_prefill: bool = env("PD_SERVE_PREFILL", False)
    """Also serve pd.v1.Prefill from the same engine, so the router can use this worker
    for either phase of a split route, or for both (directory role mixed)."""
    reservation_ttl_s: float = env("PD_RESERVATION_TTL_S", 30.0, gt=0)
    """An unpublished reservation is reclaimed after this long; so is a published
    sequence no DecodeStream has claimed this long after publication."""
    max_tokens_limit: int = env("PD_MAX_TOKENS_LIMIT", 4096, gt=0)
    """Largest max_tokens accepted."""
    max_chunk_blocks: int = env("PD_MAX_CHUNK_BLOCKS", 64, gt=0)
    """Most blocks in one transfer chunk (per layer): the destination plans the expected
    chunks at Reserve (one prefill chunk's blocks each, capped by this)."""
    data_host: str = env("PD_DATA_HOST", "127.0.0.1")
    """Host the data-plane receiver binds."""


class PrefillWorkerConfig(NodeConfig, PrefillSettings):
    """A prefill worker (`python -m prefill_worker`)."""

    model_config = _WORKER


class DecodeWorkerConfig(NodeConfig, DecodeSettings):
    """A decode worker (`python -m decode_worker`)."""

    model_config = _WORKER


class WorkerConfig(PrefillWorkerConfig, DecodeWorkerConfig):
    """A worker serving both phases (a decode worker with --serve-prefill); also what
    in-process tests build, since it fits either role's worker."""

    model_config = _WORKER


ROLE_CONFIGS: dict[frozenset[str], type[NodeConfig]] = {
    frozenset({"prefill"}): PrefillWorkerConfig,
    frozenset({"decode"}): DecodeWorkerConfig,
    frozenset({"prefill", "decode"}): WorkerConfig,
}
"""The settings class of a node serving these roles."""
