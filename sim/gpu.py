"""Analytic simulator profiles for dense Llama-3 models on H100 and H200 GPUs.

A profile here is arithmetic from the hardware's peak numbers, the model's shape and a
handful of named utilisation factors; nothing is measured and nothing imports torch.
docs/capacity.md, "Analytic GPU profiles", derives every formula, justifies every
constant and compares the results with published measurements of real engines.

Names are ``<gpu>-<model>-tp<n>[@<transport>]``, e.g. ``h100-llama3-8b-tp2`` or
``h200-llama3-70b-tp4@nvlink``:

    gpu        h100 (H100 SXM 80 GB), h200 (H200 SXM 141 GB)
    model      llama3-8b, llama3-70b (bf16 weights and K/V)
    tp         1, 2, 4 or 8 GPUs per worker (tensor parallel); a degree whose weights
               leave no room for one MIN_MODEL_LEN-token sequence is refused (REFUSED
               says why)
    transport  rdma-400g (default), rdma-200g, nvlink, tcp

The step times are a roofline turned into CostProfile's linear form:

    prefill chunk  fixed + max(weights read, n * FLOPs/token) + n * all-reduce bytes
                   + pairs * attention FLOPs/pair              (FLOPs at PREFILL_MFU)
    decode step    fixed + max(weights read, batch * FLOPs/token) + batch * per-seq
                   + context * K/V bytes/token                 (bytes at DECODE_MBU)

Each max() becomes a straight line over the range the engine runs: prefill's is the
best uniform line over 1..MAX_PREFILL_TOKENS (`minimax_line`: within half a weight read
either way), decode's the secant over 1..MAX_DECODE_BATCH (`secant_line`: exact at batch
1 and at the full batch, above the roofline in between by at most its gap at the kink).
`roofline_decode_step_ms` keeps the max() so a test holds the line to that bound.
"""

from __future__ import annotations

import dataclasses
import math

from runtime.directory.cost_profile import CostProfile
from sim.profile import EngineProfile, Overheads, SimProfile, TransferProfile

# --------------------------------------------------------------------------------------
# Utilisation factors and engine limits (docs/capacity.md justifies each value).

PREFILL_MFU = 0.55
"""Fraction of peak dense bf16 FLOP/s a prefill chunk reaches (large GEMMs and flash
attention on H100-class GPUs run at 50-60% of peak inside a serving engine)."""
DECODE_MFU = 0.5
"""Fraction of peak FLOP/s a decode step's GEMMs reach once the batch is large enough
to be compute-bound (M = batch rows is small for a tensor-core tile)."""
DECODE_MBU = 0.75
"""Fraction of peak HBM bandwidth a decode step sustains reading weights and K/V
(chosen with STEP_OVERHEAD_MS and ALLREDUCE_LATENCY_MS against the published vLLM step
times in docs/capacity.md)."""
STEP_OVERHEAD_MS = 1.0
"""Fixed cost of every engine step (prefill chunk or decode step): scheduling, input
preparation, CUDA-graph launch, sampling's fixed part."""
PER_SEQ_OVERHEAD_MS = 0.005
"""Per sequence in a decode step beyond its FLOPs: sampling, block-table and output
bookkeeping (mostly overlapped with the GPU in current engines)."""
ALLREDUCE_LATENCY_MS = 0.015
"""Latency of one tensor-parallel all-reduce over NVLink for a small message; a Llama
layer runs two (after attention and after the MLP)."""
NVLINK_ALLREDUCE_EFFICIENCY = 0.8
"""NCCL bus bandwidth of a large all-reduce as a fraction of NVLink's 450 GB/s one way."""
GPU_MEMORY_UTILIZATION = 0.9
"""Share of each GPU's memory the engine takes (vLLM's default gpu_memory_utilization)."""
ACTIVATION_RESERVE_BYTES_PER_GPU = 3 * 2**30
"""Per GPU, kept out of the K/V pool: activations of a MAX_PREFILL_TOKENS chunk, CUDA
graphs, NCCL buffers, allocator slack."""
BLOCK_SIZE = 16
"""Tokens per K/V block (vLLM's and pdserve's default)."""
MAX_DECODE_BATCH = 256
"""Sequences one decode step runs (vLLM V0's max_num_seqs; V1 defaults to 1024 on
H100-class GPUs, a batch the decode fit below does not cover)."""
MAX_PREFILL_TOKENS = 8192
"""Prompt tokens per prefill chunk: vLLM V1's max_num_batched_tokens for its API server
on GPUs with >= 70 GiB (H100, H200); 2048 is its default on smaller GPUs."""
MAX_MODEL_LEN = 131072
"""Longest sequence Llama-3.1 takes; capped by the pool (`_worker`)."""
MIN_MODEL_LEN = 8192
"""A configuration whose pool holds fewer tokens than this is refused: the Azure code
trace's prompts reach ~8k tokens."""
TP_DEGREES = (1, 2, 4, 8)
BYTES_PER_PARAM = 2
"""bf16 weights; K/V in bf16 too (no FP8 anywhere)."""
DEFAULT_TRANSPORT = "rdma-400g"
"""One 400 Gb/s NIC per GPU is the HGX/DGX H100 and H200 reference design."""
SOURCE = "analytic (docs/capacity.md)"


@dataclasses.dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU's peak numbers."""

    name: str
    label: str
    peak_flops: float
    """Dense bf16 tensor-core FLOP/s (no sparsity)."""
    hbm_bytes_per_s: float
    memory_bytes: int
    """What the driver reports as the device's total memory."""
    nvlink_bytes_per_s: float
    """NVLink 4, one direction, per GPU (900 GB/s bidirectional)."""


GPUS: dict[str, Gpu] = {
    "h100": Gpu("h100", "H100 SXM (80 GB)", 989e12, 3.35e12, 81559 * 2**20, 450e9),
    "h200": Gpu("h200", "H200 SXM (141 GB)", 989e12, 4.8e12, 143771 * 2**20, 450e9),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Model:
    """A dense GQA Llama's shape; parameter and FLOP counts follow from it."""

    name: str
    label: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_matmul_params(self) -> int:
        """q, k, v, o projections and the SwiGLU MLP's three matrices."""
        attention = self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden
        return attention + 3 * self.hidden * self.ffn

    @property
    def matmul_params(self) -> int:
        """Weights every token multiplies through: the layers and the LM head (the input
        embedding is a row lookup, not a matmul)."""
        return self.layers * self.layer_matmul_params + self.vocab * self.hidden

    @property
    def params(self) -> int:
        """All weights: layers, their two RMSNorms, untied embedding and LM head, final norm."""
        return self.layers * (self.layer_matmul_params + 2 * self.hidden) + 2 * self.vocab * self.hidden + self.hidden

    @property
    def weight_bytes(self) -> int:
        return self.params * BYTES_PER_PARAM

    @property
    def flops_per_token(self) -> int:
        """2 FLOPs (multiply, add) per matmul weight."""
        return 2 * self.matmul_params

    @property
    def attention_flops_per_pair(self) -> int:
        """One (query, key) pair in one layer costs 2*q_dim for QK^T and 2*q_dim for the
        weighted sum of V: 4 * layers * q_dim for the whole model."""
        return 4 * self.layers * self.q_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer, bf16."""
        return 2 * self.layers * self.kv_dim * BYTES_PER_PARAM


MODELS: dict[str, Model] = {
    "llama3-8b": Model("llama3-8b", "Llama-3-8B (bf16)", 32, 4096, 32, 8, 128, 14336, 128256),
    "llama3-70b": Model("llama3-70b", "Llama-3-70B (bf16)", 80, 8192, 64, 8, 128, 28672, 128256),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Transport:
    """A K/V transport between two workers; `per_gpu` bandwidth scales with the worker's
    GPUs (each GPU has its own link or NIC and sends its own K/V shard)."""

    name: str
    gb_per_s: float
    """Sustained, 1e9 bytes a second, per GPU when `per_gpu`, else per worker."""
    latency_ms: float
    streamed: bool
    per_gpu: bool


TRANSPORTS: dict[str, Transport] = {
    # NVLink 4: 450 GB/s one way per GPU at 80% for large copies; within one node only.
    "nvlink": Transport("nvlink", 360.0, 0.02, streamed=True, per_gpu=True),
    # One ConnectX NIC per GPU; 90% of line rate for large RDMA writes.
    "rdma-400g": Transport("rdma-400g", 45.0, 0.05, streamed=True, per_gpu=True),
    "rdma-200g": Transport("rdma-200g", 22.5, 0.05, streamed=True, per_gpu=True),
    # Kernel TCP through the host: ~25 Gb/s effective per worker, staged, not streamed.
    "tcp": Transport("tcp", 3.125, 0.5, streamed=False, per_gpu=False),
}

OVERHEADS = Overheads(colocated_ms=1.0, split_ms=2.0, handoff_ms=2.0)
"""Fixed per-request costs in one data centre (docs/capacity.md, "Overheads")."""


# --------------------------------------------------------------------------------------
# The roofline and its linear fit.


@dataclasses.dataclass(frozen=True, slots=True)
class Line:
    """``intercept + slope * x``, within ``max_error`` of the function it replaces."""

    intercept: float
    slope: float
    max_error: float


def minimax_line(floor: float, slope: float, hi: int) -> Line:
    """The best uniform straight line for ``max(floor, slope * x)`` over x in [1, hi].

    The function is convex and piecewise linear, so the best line is parallel to the
    chord from x=1 to x=hi, moved down by half the chord's gap at the kink x=floor/slope;
    its error is that half gap, reached at both ends and at the kink."""
    if slope * 1 >= floor:  # compute-bound everywhere: exact
        return Line(0.0, slope, 0.0)
    if slope * hi <= floor:  # memory-bound everywhere: flat
        return Line(floor, 0.0, 0.0)
    chord_slope = (slope * hi - floor) / (hi - 1)
    gap = floor + chord_slope * (floor / slope - 1) - floor
    return Line(floor - chord_slope - gap / 2, chord_slope, gap / 2)


def secant_line(floor: float, slope: float, hi: int) -> Line:
    """The chord of ``max(floor, slope * x)`` from x=1 to x=hi: exact at both ends, above
    the function in between by at most ``max_error`` (its gap at the kink x=floor/slope),
    never below it."""
    if slope * 1 >= floor:
        return Line(0.0, slope, 0.0)
    if slope * hi <= floor:
        return Line(floor, 0.0, 0.0)
    chord_slope = (slope * hi - floor) / (hi - 1)
    return Line(floor - chord_slope, chord_slope, chord_slope * (floor / slope - 1))


def _ms(seconds: float) -> float:
    return seconds * 1e3


def weights_read_ms(model: Model, gpu: Gpu, tp: int) -> float:
    """One pass over each GPU's share of the matmul weights at DECODE_MBU."""
    return _ms(model.matmul_params * BYTES_PER_PARAM / tp / (gpu.hbm_bytes_per_s * DECODE_MBU))


def _fixed_ms(model: Model, tp: int) -> float:
    """Per step: the engine's overhead and, with TP, 2 all-reduce latencies per layer."""
    return STEP_OVERHEAD_MS + (2 * model.layers * ALLREDUCE_LATENCY_MS if tp > 1 else 0.0)


def _allreduce_ms_per_token(model: Model, gpu: Gpu, tp: int) -> float:
    """A ring all-reduce moves 2(tp-1)/tp of the message per GPU; per token the messages
    are 2 per layer of `hidden` bf16 values."""
    if tp == 1:
        return 0.0
    nbytes = 2 * model.layers * model.hidden * BYTES_PER_PARAM * 2 * (tp - 1) / tp
    return _ms(nbytes / (gpu.nvlink_bytes_per_s * NVLINK_ALLREDUCE_EFFICIENCY))


def _compute_ms_per_token(model: Model, gpu: Gpu, tp: int, mfu: float) -> float:
    return _ms(model.flops_per_token / (tp * gpu.peak_flops * mfu))


def prefill_line(model: Model, gpu: Gpu, tp: int) -> Line:
    """A chunk's weight-or-compute term over 1..MAX_PREFILL_TOKENS new tokens."""
    per_token = _compute_ms_per_token(model, gpu, tp, PREFILL_MFU)
    return minimax_line(weights_read_ms(model, gpu, tp), per_token, MAX_PREFILL_TOKENS)


def decode_line(model: Model, gpu: Gpu, tp: int) -> Line:
    """A step's weight-or-compute term over 1..MAX_DECODE_BATCH sequences: the secant,
    exact at batch 1 (the latency the published points check) and at the full batch (the
    throughput), above the roofline near the kink, where a real step also is (neither
    resource is saturated there)."""
    per_seq = _compute_ms_per_token(model, gpu, tp, DECODE_MFU)
    return secant_line(weights_read_ms(model, gpu, tp), per_seq, MAX_DECODE_BATCH)


def cost_profile(model: Model, gpu: Gpu, tp: int) -> CostProfile:
    """The CostProfile of one worker: `gpu` x `tp`, serving `model`."""
    fixed = _fixed_ms(model, tp)
    allreduce = _allreduce_ms_per_token(model, gpu, tp)
    pre, dec = prefill_line(model, gpu, tp), decode_line(model, gpu, tp)
    kv_bytes_per_gpu = model.kv_bytes_per_token / tp
    return CostProfile(
        prefill_base_ms=fixed + pre.intercept,
        prefill_ms_per_token=pre.slope + allreduce,
        prefill_ms_per_pair=_ms(model.attention_flops_per_pair / (tp * gpu.peak_flops * PREFILL_MFU)),
        decode_base_ms=fixed + dec.intercept,
        decode_ms_per_seq=dec.slope + allreduce + PER_SEQ_OVERHEAD_MS,
        decode_ms_per_context_token=_ms(kv_bytes_per_gpu / (gpu.hbm_bytes_per_s * DECODE_MBU)),
        kv_bytes_per_block=model.kv_bytes_per_token * BLOCK_SIZE,
        source="analytic",
    )


def roofline_decode_step_ms(model: Model, gpu: Gpu, tp: int, batch: int, context: int) -> float:
    """The decode step with the max() kept: `cost_profile`'s decode terms are at most
    ``decode_line(...).max_error`` above it and never below."""
    fixed = _fixed_ms(model, tp)
    per_seq = _allreduce_ms_per_token(model, gpu, tp) + PER_SEQ_OVERHEAD_MS
    bound = max(weights_read_ms(model, gpu, tp), batch * _compute_ms_per_token(model, gpu, tp, DECODE_MFU))
    kv = _ms(model.kv_bytes_per_token / tp / (gpu.hbm_bytes_per_s * DECODE_MBU))
    return fixed + bound + batch * per_seq + context * kv


# --------------------------------------------------------------------------------------
# The pool, and which configurations fit.


def kv_pool_bytes(model: Model, gpu: Gpu, tp: int) -> float:
    """Memory left for K/V on a worker: its share of the GPUs, less weights and the
    per-GPU activation reserve (negative when the weights do not fit)."""
    usable = tp * gpu.memory_bytes * GPU_MEMORY_UTILIZATION
    return usable - model.weight_bytes - tp * ACTIVATION_RESERVE_BYTES_PER_GPU


def refusal(model: Model, gpu: Gpu, tp: int) -> str | None:
    """Why `tp` x `gpu` cannot serve `model`, or None when it can."""
    if model.heads % tp or model.kv_heads % tp:
        return f"{model.heads} query and {model.kv_heads} K/V heads do not split evenly over {tp} GPUs"
    pool = kv_pool_bytes(model, gpu, tp)
    if pool < MIN_MODEL_LEN * model.kv_bytes_per_token:
        budget = tp * gpu.memory_bytes * GPU_MEMORY_UTILIZATION / 1e9
        return (f"{model.weight_bytes / 1e9:.1f} GB of weights in {tp}x {gpu.label} "
                f"({budget:.1f} GB at gpu_memory_utilization {GPU_MEMORY_UTILIZATION}) leave "
                f"{max(pool, 0) / 1e9:.1f} GB of K/V, under one {MIN_MODEL_LEN}-token sequence "
                f"({MIN_MODEL_LEN * model.kv_bytes_per_token / 1e9:.1f} GB)")
    return None


def _worker(model: Model, gpu: Gpu, tp: int) -> EngineProfile:
    cost = cost_profile(model, gpu, tp)
    total_blocks = int(kv_pool_bytes(model, gpu, tp) // cost.kv_bytes_per_block)
    return EngineProfile(cost=cost, block_size=BLOCK_SIZE, total_blocks=total_blocks,
                         max_decode_batch=MAX_DECODE_BATCH, max_prefill_tokens=MAX_PREFILL_TOKENS,
                         gpus=tp, layers=model.layers,
                         max_model_len=min(MAX_MODEL_LEN, total_blocks * BLOCK_SIZE))


def _transfer(transport: Transport, tp: int) -> TransferProfile:
    bandwidth = transport.gb_per_s * (tp if transport.per_gpu else 1)
    return TransferProfile(transport=transport.name, latency_ms=transport.latency_ms,
                           gb_per_s=bandwidth, streamed=transport.streamed)


# --------------------------------------------------------------------------------------
# Names.


def _all_names() -> tuple[dict[str, tuple[Model, Gpu, int]], dict[str, str]]:
    fits: dict[str, tuple[Model, Gpu, int]] = {}
    refused: dict[str, str] = {}
    for gpu in GPUS.values():
        for model in MODELS.values():
            for tp in TP_DEGREES:
                name = f"{gpu.name}-{model.name}-tp{tp}"
                reason = refusal(model, gpu, tp)
                if reason is None:
                    fits[name] = (model, gpu, tp)
                else:
                    refused[name] = reason
    return fits, refused


_CONFIGS, REFUSED = _all_names()
"""REFUSED: every configuration left out, with the reason (e.g. 70B at TP1 on H100)."""
GPU_PROFILE_NAMES: tuple[str, ...] = tuple(_CONFIGS)
"""Every profile name that fits, without a transport suffix."""


def list_profiles() -> list[str]:
    """Every analytic profile name (append ``@<transport>`` for another transport)."""
    return list(GPU_PROFILE_NAMES)


def _split_transport(name: str) -> tuple[str, Transport]:
    base, _, transport = name.strip().lower().partition("@")
    transport = transport or DEFAULT_TRANSPORT
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown transport {transport!r} in {name!r}; known: {', '.join(TRANSPORTS)}")
    return base, TRANSPORTS[transport]


def _build(name: str, model: Model, gpu: Gpu, tp: int, transport: Transport) -> SimProfile:
    return SimProfile(name=name, engine=_worker(model, gpu, tp), transfer=_transfer(transport, tp),
                      overheads=OVERHEADS, hardware=f"{tp}x {gpu.label}", model=model.label, source=SOURCE)


def gpu_profile(name: str) -> SimProfile:
    """The profile called `name` (``h100-llama3-8b-tp2``, optionally ``@rdma-200g``).

    Raises ValueError for an unknown name, naming the known ones, and for a refused
    configuration, saying why."""
    base, transport = _split_transport(name)
    if base in REFUSED:
        raise ValueError(f"{base} is refused: {REFUSED[base]}")
    if base not in _CONFIGS:
        raise ValueError(f"unknown GPU profile {name!r}; known: {', '.join(GPU_PROFILE_NAMES)} "
                         f"(optionally @{'|@'.join(TRANSPORTS)})")
    model, gpu, tp = _CONFIGS[base]
    full = base if transport.name == DEFAULT_TRANSPORT else f"{base}@{transport.name}"
    return _build(full, model, gpu, tp, transport)


def gpu_family(name: str) -> list[SimProfile]:
    """Every TP degree that fits for ``<gpu>-<model>`` (optionally ``@<transport>``),
    smallest first. Raises ValueError for an unknown family."""
    base, transport = _split_transport(name)
    names = [n for n in GPU_PROFILE_NAMES if n.rpartition("-tp")[0] == base]
    if not names:
        families = sorted({n.rpartition("-tp")[0] for n in GPU_PROFILE_NAMES})
        raise ValueError(f"unknown GPU profile family {name!r}; known: {', '.join(families)}")
    suffix = "" if transport.name == DEFAULT_TRANSPORT else f"@{transport.name}"
    return [gpu_profile(n + suffix) for n in names]


def _check_all() -> None:
    """Import-time guard: every profile builds (SimProfile validates itself)."""
    for name in GPU_PROFILE_NAMES:
        profile = gpu_profile(name)
        assert profile.engine.max_model_len >= MIN_MODEL_LEN, name
        assert math.isfinite(profile.engine.decode_step_ms(MAX_DECODE_BATCH, 0)), name


_check_all()
