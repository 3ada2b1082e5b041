"""A calibrated profile from a live cluster (`pdctl profile save`): the cost profile and
capacity each worker measured and registered (Admin.Status), the transfer profile
fitted to bench/transfer.py's lines, and the hand-off's fixed costs.

Workers of one cluster share a model but may differ in measured speed (they calibrate
side by side on a busy host): the saved engine takes each coefficient's median over
the workers, and the smallest pool and batch limits.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from runtime.directory.cost_profile import PROFILE_FIELDS, CostProfile
from sim.profile import EngineProfile, Overheads, SimProfile, TransferProfile

TRANSFER_PATH = "pdserve-ucx"
"""The bench/transfer.py path a calibrated profile prices the hand-off with."""

MIB = 2**20


def engine_from_workers(workers: Sequence[Mapping], layers: int = 1) -> EngineProfile:
    """The median declared profile of `workers` (each a mapping with `profile` and
    `capacity`, as pdserve_client's WorkerStatus has them)."""
    declared = [w for w in workers if w.get("profile") and w["profile"].get("source")]
    if not declared:
        raise ValueError("no worker declared a cost profile (PD_PROFILE_CALIBRATE=0?): nothing to save")
    num = [f for f in PROFILE_FIELDS if f != "source"]
    med = {f: float(statistics.median(float(w["profile"][f]) for w in declared)) for f in num}
    med["kv_bytes_per_block"] = int(med["kv_bytes_per_block"])
    cost = CostProfile(**med, source="calibrated")
    caps = [w["capacity"] for w in declared]
    lowest = lambda k: min(int(c.get(k, 0)) for c in caps)  # noqa: E731
    return EngineProfile(cost, block_size=lowest("block_size"), total_blocks=lowest("total_blocks"),
                         max_decode_batch=lowest("max_decode_batch"),
                         max_prefill_tokens=lowest("max_prefill_tokens") or 256, layers=max(1, layers),
                         max_model_len=lowest("max_model_len"))


def transfer_from_bench(lines: Iterable[str], path: str = TRANSFER_PATH, transport: str = "ucx-shm") -> TransferProfile:
    """latency + bytes / bandwidth, least squares over bench/transfer.py's rows of `path`
    (its JSON lines: size_mib, gbps; each row's time is size / gbps)."""
    sizes, times = [], []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if row.get("bench") == "transfer" and row.get("path") == path and row.get("gbps"):
            nbytes = float(row["size_mib"]) * MIB
            sizes.append(nbytes)
            times.append(nbytes / (float(row["gbps"]) * 1e9) * 1000.0)
    if len(set(sizes)) < 2:
        raise ValueError(f"bench/transfer.py output has {len(set(sizes))} size(s) of path {path!r}: need two to "
                         "fit latency and bandwidth")
    slope, intercept = np.polyfit(np.asarray(sizes), np.asarray(times), 1)
    if slope <= 0:
        raise ValueError(f"the transfer times of {path!r} do not grow with size: no bandwidth to fit")
    return TransferProfile(transport, max(0.0, float(intercept)), 1.0 / (float(slope) * 1e6), streamed=True)


def calibrated(name: str, workers: Sequence[Mapping], transfer: TransferProfile, overheads: Overheads,
               layers: int = 1, model: str = "", source: str = "calibrated") -> SimProfile:
    """The profile `pdctl profile save` writes."""
    return SimProfile(name, engine_from_workers(workers, layers), transfer, overheads, hardware="", model=model,
                      source=source)
