"""Process scaffolding shared by `python -m prefill_worker` and `python -m decode_worker`."""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from pdserve_client import contract
from runtime.common.settings import SettingsError
from runtime.directory.records import WorkerCapacity
from runtime.engine import Engine, selfcheck
from runtime.engine.selfcheck import SelfCheck

from .config import ROLE_CONFIGS, DecodeWorkerConfig, NodeConfig, PrefillWorkerConfig
from .loop import EngineLoop
from .memory import tune_malloc

log = logging.getLogger(__name__)


def parse_config(role: str, argv: list[str] | None = None) -> tuple[NodeConfig, list[str]]:
    """Command-line flags over the environment -> (the settings of the node, its roles):
    a decode worker with --serve-prefill (PD_SERVE_PREFILL) serves both phases.

    Every worker takes the same flags (the launcher passes them all); a flag for a
    setting the node's roles do not have (--reservation-ttl-s on a prefill worker) is
    ignored, as its variable is."""
    ap = argparse.ArgumentParser(prog=f"python -m {role}_worker")
    ap.add_argument("--listen")
    ap.add_argument("--advertise")
    ap.add_argument("--directory", help=f"directory service host:port (${contract.DIRECTORY_ADDRESS_ENV})")
    ap.add_argument("--worker-id")
    ap.add_argument("--model")
    ap.add_argument("--num-blocks", type=int)
    ap.add_argument("--block-size", type=int)
    ap.add_argument("--chunk-tokens", type=int)
    ap.add_argument("--transport")
    ap.add_argument("--reservation-ttl-s", type=float, help="decode role only")
    ap.add_argument("--torch-threads", type=int)
    if role == "decode":
        ap.add_argument("--serve-prefill", action="store_true", default=None,
                        help="also serve pd.v1.Prefill (directory role mixed)")
    ap.add_argument("--log-level", help="logging level (PD_LOG_LEVEL, default INFO)")
    ap.add_argument("--metrics-listen", help="/metrics host:port (PD_METRICS_LISTEN, default off)")
    args = ap.parse_args(argv)
    flags = dict(listen=args.listen, advertise=args.advertise, directory_addr=args.directory,
                 worker_id=args.worker_id, model=args.model, num_blocks=args.num_blocks,
                 block_size=args.block_size, chunk_tokens=args.chunk_tokens, transport=args.transport,
                 reservation_ttl_s=args.reservation_ttl_s, torch_threads=args.torch_threads,
                 serve_prefill=getattr(args, "serve_prefill", None), log_level=args.log_level,
                 metrics_listen=args.metrics_listen)
    try:
        return node_config(role, flags)
    except SettingsError as exc:  # one line, not a traceback
        print(f"{role}_worker: bad configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def node_config(role: str, flags: dict[str, Any]) -> tuple[NodeConfig, list[str]]:
    """The settings of a `role` node (flags over the environment) and the roles it serves."""
    def load(cls: type[NodeConfig]) -> NodeConfig:
        return cls.from_env(**{k: v for k, v in flags.items() if k in cls.model_fields})

    roles = [role]
    if role == "decode" and load(DecodeWorkerConfig).serve_prefill:
        roles.append("prefill")
    cfg = load(ROLE_CONFIGS[frozenset(roles)])
    if not cfg.worker_id:
        cfg = cfg.replace(worker_id=f"{role}-{os.getpid()}")
    return cfg, roles


def build_engine_loop(cfg: NodeConfig) -> tuple[EngineLoop, SelfCheck]:
    """The engine over cfg.model, on its own thread (not started), and the verdict of its
    start-up self-check. A worker whose check failed gets a cache ABI of its own
    (selfcheck.py): register it with the check's reason as colocated-only."""
    tune_malloc()  # before the engine allocates: see memory.py
    if cfg.engine == "vllm":
        return build_vllm_loop(cfg)
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    engine = Engine.from_spec(cfg.model, cfg.engine_config())
    if cfg.fault_row_dependent_kernels:
        selfcheck.make_rows_depend_on_count(engine)
    check = selfcheck.run(engine)
    if check.passed:
        log.info("kernel self-check passed in %.0f ms (%s)", check.elapsed_ms, engine.abi.kernels)
    else:
        selfcheck.mark_colocated_only(engine, cfg.worker_id)
        log.error("kernel self-check FAILED: %s; serving colocated requests only, no K/V hand-off",
                  check.reason)
    log.info("model %s abi %s blocks %d", engine.name, engine.abi.digest, cfg.num_blocks)
    return EngineLoop(engine, max_batch=cfg.max_batch, name=f"engine-{cfg.worker_id}"), check


def build_vllm_loop(cfg: NodeConfig) -> tuple[EngineLoop, SelfCheck]:
    """vLLM's engine core behind the contract (runtime/vllm). pdserve's kernel self-check
    is about pdserve's kernels: vLLM's numerics are named in its cache ABI instead.

    Threads: vLLM-CPU sizes its attention's work for OpenMP's thread count, which each
    thread reads from OMP_NUM_THREADS; the engine runs on the loop's thread, not the one
    that built it, so the count comes from the environment (PD_TORCH_THREADS, when that
    variable is unset), before OpenMP starts."""
    if cfg.torch_threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(cfg.torch_threads))
    try:
        from runtime.vllm.engine import VllmEngine, VllmOptions
    except ImportError as exc:
        raise SettingsError(f"PD_ENGINE=vllm, but vLLM does not import here ({exc}): run the worker "
                            "with the environment `make vllm-env` builds (.venv-vllm/bin/python)") from exc
    try:
        extra = json.loads(cfg.vllm_args or "{}")
    except ValueError as exc:
        raise SettingsError(f"PD_VLLM_ARGS is not a JSON object: {exc}") from exc
    if int(extra.get("pipeline_parallel_size", 1)) > 1 or int(extra.get("data_parallel_size", 1)) > 1:
        raise SettingsError("PD_VLLM_ARGS: pipeline and data parallelism inside a worker are not built behind "
                            "pdserve's hand-off (tensor parallelism is; more workers are data parallelism)")
    engine = VllmEngine(vllm_checkpoint(cfg.model), VllmOptions(
        block_size=cfg.block_size, num_blocks=cfg.num_blocks, max_model_len=cfg.max_model_len,
        chunk_tokens=cfg.chunk_tokens, max_batch=cfg.max_batch, dtype=cfg.dtype,
        staging=cfg.vllm_host_staging, extra=extra))
    log.info("model %s abi %s (%s, batch-invariant %s) blocks %d", engine.name, engine.abi.digest,
             engine.abi.engine, engine.abi.batch_invariant, engine.num_blocks)
    check = SelfCheck(True, "", 0.0)
    return EngineLoop(engine, max_batch=cfg.max_batch, name=f"engine-{cfg.worker_id}"), check


def vllm_checkpoint(model: str) -> str:
    """The checkpoint directory vLLM loads: `model` itself, or a preset exported once into
    the temporary directory (a trial cluster on the embedded default)."""
    from filelock import FileLock

    from runtime.engine.checkpoint import export_preset
    from runtime.engine.presets import PRESETS

    name, _, seed = model.partition("@")
    if name not in PRESETS:
        return model
    out = Path(tempfile.gettempdir()) / "pdserve-checkpoints" / model
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{out}.lock"):
        if not (out / "config.json").exists():
            export_preset(name, out, int(seed or 0))
    return str(out)


def build_sender(cfg: PrefillWorkerConfig, security=None):
    """The data-plane sender of cfg.transport, with the worker's timeouts and credit window
    (the tcp one speaks mutual TLS when `security` is secure)."""
    from runtime.transfer.factory import make_sender
    from runtime.transfer.faults import FaultySender, SenderFaults
    opts: dict = {"io_timeout_s": cfg.transfer_timeout_s, "advertise": cfg.data_plane_advertise}
    if cfg.transport == "ucx":
        opts["window_bytes"] = cfg.credit_window_bytes
    if cfg.transport == "tcp" and security is not None:
        opts["ssl_context"] = security.client_ssl()
    sender = make_sender(cfg.transport, **({} if cfg.transport == "inproc" else opts))
    faults = SenderFaults(cfg.fault_delay_before_send_s, cfg.fault_chunk_delay_s, cfg.fault_corrupt_chunk,
                          cfg.fault_replay_chunk)
    if faults.any:
        log.warning("data-plane faults injected (fault suite): %s", faults)
        return FaultySender(sender, faults)
    return sender


def build_receiver(cfg: DecodeWorkerConfig, security=None):
    """The data-plane receiver of cfg.transport (bound to cfg.data_host for tcp; mutual
    TLS there when `security` is secure), naming cfg.data_plane_advertise in its address."""
    from runtime.transfer.factory import make_receiver
    opts: dict = {} if cfg.transport == "inproc" else {"idle_timeout_s": cfg.transfer_timeout_s,
                                                        "advertise": cfg.data_plane_advertise}
    if cfg.transport == "tcp" and security is not None:
        opts["ssl_context"] = security.server_ssl()
    return make_receiver(cfg.transport, host=cfg.data_host, name=cfg.worker_id, **opts)


def capacity(cfg: NodeConfig, loop: EngineLoop) -> WorkerCapacity:
    """What this worker can hold, for registration."""
    e = loop.engine
    return WorkerCapacity(
        total_blocks=e.num_blocks, max_decode_batch=cfg.max_batch,
        max_prefill_tokens=cfg.chunk_tokens, block_size=e.block_size,
        vocab_size=e.vocab_size, max_model_len=e.max_model_len)


def advertised(cfg: NodeConfig, port: int) -> str:
    """The address to register: cfg.advertise (a host alone gets the bound port: PD_ADVERTISE
    set to the pod IP), or the listen host with the bound port."""
    if cfg.advertise:
        return cfg.advertise if _has_port(cfg.advertise) else f"{_bracketed(cfg.advertise)}:{port}"
    host = cfg.listen.rpartition(":")[0] or "127.0.0.1"
    return f"{'127.0.0.1' if host in ('0.0.0.0', '[::]') else host}:{port}"


def _has_port(address: str) -> bool:
    if address.startswith("["):
        return "]:" in address
    if ":" in address and _is_ipv6(address):
        return False
    return address.rpartition(":")[2].isdigit()


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def _bracketed(host: str) -> str:
    return f"[{host}]" if _is_ipv6(host) else host


def block_counts(engine, reserved: int = 0) -> dict[str, int]:
    """LoadReport's block fields. Every held block is counted: what is neither free
    nor reserved is held by running work (active), so free + reserved + active ==
    total by construction and a worker at rest with active > 0 has leaked."""
    total, free = engine.num_blocks, engine.num_free_blocks
    return {"free_blocks": free, "reserved_blocks": reserved, "total_blocks": total,
            "active_blocks": max(0, total - free - reserved), "cached_blocks": engine.num_cached_blocks}


def run_process(run) -> None:
    """Entry point body: `asyncio.run(run(argv))`, quiet on Ctrl-C."""
    import asyncio
    import sys

    try:
        asyncio.run(run(sys.argv[1:]))
    except KeyboardInterrupt:
        pass
    except SettingsError as exc:  # one line, not a traceback
        print(f"bad configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
