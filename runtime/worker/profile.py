"""A worker's cost profile: a short calibration run of its own engine at start.

The router prices routes with three functions (router/pricing/cost_model.py); the two
that depend on the worker's hardware and model are measured here, in the worker
process, before it registers:

    prefill_ms(new, reused) = a + b * new + c * new * (reused + new / 2)
    decode_step_ms(batch, ctx) = d + e * batch + f * ctx

Calibration: a warm-up, then prefills of a few prompt lengths (ascending, while
the time budget lasts) and a few decode steps at a few (batch, context) points;
each function is a non-negative least-squares fit over its points, in relative
error (each point weighted 1/y), so the short prompts most requests have are
priced as well as the long ones. Workers start side by side on a shared host
and calibrate while their neighbours load and calibrate too, so every point is
the *minimum* of its repeats (short prompts: PREFILL_REPEATS; decode: of the
single steps): interference only ever adds time. The router corrects what is
left online (router/pricing/cost_model.py). The run uses its own salt, so its blocks
never match a tenant's prefix, and frees everything.

Instead of calibrating, `PD_PROFILE_FILE` names a saved profile (JSON, the
`CostProfile.to_json` format): loaded when it exists, written after a
calibration when it does not. `PD_PROFILE_CALIBRATE=0` skips the run (the worker
declares no profile; the router falls back to its configured defaults).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Sequence as Seq
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock
from pydantic_settings import SettingsConfigDict
from scipy.optimize import nnls

from runtime.common.settings import Settings, env
from runtime.directory.cost_profile import CostProfile
from runtime.engine import Engine, SamplingParams

log = logging.getLogger(__name__)

CALIBRATION_SALT = b"\x00pdserve-calibration"
PREFILL_LENGTHS = (32, 128, 512, 1024, 2048)
PREFILL_REPEATS = 3
"""Runs of each prompt length up to REPEAT_MAX_TOKENS (the point is their minimum)."""
REPEAT_MAX_TOKENS = 128
DECODE_POINTS = ((1, 64), (4, 64), (2, 256), (16, 64))  # (batch, context tokens per sequence)
"""Measured in order while the budget lasts, but at least MIN_DECODE_POINTS: the
first three already separate the base, per-sequence and per-context-token
terms (with only (1, 64) and (4, 64), context grows with batch and the fit is
free to put a step's whole cost on context, pricing a long request's TPOT 7x)."""
MIN_DECODE_POINTS = 3
DECODE_STEPS = 4


class ProfileConfig(Settings):
    """How a worker obtains its cost profile."""

    model_config = SettingsConfigDict(env_ignore_empty=True)

    file: str = env("PD_PROFILE_FILE", "")
    """Saved profile (JSON): loaded if it exists, else written after calibrating; empty = none."""
    calibrate: bool = env("PD_PROFILE_CALIBRATE", True)
    """Run the calibration when no saved profile is loaded."""
    budget_s: float = env("PD_PROFILE_BUDGET_S", 5.0, gt=0)
    """Rough cap on calibration time: longer prompt lengths are skipped once it is spent."""


def kv_bytes_per_block(engine: Engine) -> int:
    """Logical K/V bytes of one block: layers x (K, V) x kv heads x head dim x dtype x block size."""
    abi = engine.abi
    elem = torch.empty((), dtype=getattr(torch, abi.dtype)).element_size()
    return abi.num_layers * 2 * abi.num_kv_heads * abi.head_dim * elem * abi.block_size


def fit_nonneg(rows: Seq[Seq[float]], ys: Seq[float], relative: bool = False) -> list[float]:
    """Least squares y ~ rows @ x with x >= 0 (scipy's NNLS, on columns scaled to unit
    norm: a per-pair term is ~1e6 times a base term); `relative`: minimise relative
    error (row and y scaled by 1/y). Invariant: the result has len(rows[0]) entries,
    all >= 0."""
    a = np.asarray(rows, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    if relative and np.all(y > 0):
        a, y = a / y[:, None], np.ones_like(y)
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    x, _ = nnls(a / norms, y)
    return [float(v) for v in x / norms]


def prefill_features(new: int, reused: int) -> list[float]:
    """Feature row of the prefill model. Must match router/pricing/cost_model.py prefill_ms."""
    return [1.0, float(new), new * (reused + new / 2.0)]


def fit_prefill(rows: Seq[Seq[float]], ys: Seq[float]) -> tuple[float, float, float]:
    """(base, per token, per pair) from prefill points; with fewer points than terms
    the pair term is left out (0): two points fit exactly by base + pair alone would
    price prefill at 0 ms per token (seen with a 2 s calibration budget)."""
    if not rows:
        return 0.0, 0.0, 0.0
    if len(rows) < 3:
        a, b = fit_nonneg([r[:2] for r in rows], ys, relative=True)
        return a, b, 0.0
    a, b, c = fit_nonneg(rows, ys, relative=True)
    i = max(range(len(rows)), key=lambda k: rows[k][1])
    if b * rows[i][1] <= 0.01 * ys[i]:  # noisy points (a loaded machine) let the pair term take
        a, b = fit_nonneg([r[:2] for r in rows], ys, relative=True)  # the per-token cost: refit without
        c = 0.0  # it (a prefill is never free per token)
    return a, b, c


def decode_features(batch: int, context: int) -> list[float]:
    """Feature row of the decode-step model. Must match router/pricing/cost_model.py decode_step_ms."""
    return [1.0, float(batch), float(context)]


def calibrate(engine: Engine, budget_s: float = 5.0) -> CostProfile:
    """Measure and fit this engine's profile; runs on the engine's thread, before
    the worker serves anything. Frees every block it allocates."""
    rng = random.Random(0)
    vocab = engine.vocab_size
    tokens = lambda n: [rng.randrange(vocab) for _ in range(n)]  # noqa: E731
    greedy = SamplingParams(ignore_eos=True)
    start = time.perf_counter()
    _timed_prefill(engine, tokens(32), greedy, "warmup")
    pre_rows, pre_ys = [], []
    for n in PREFILL_LENGTHS:
        if n >= engine.max_model_len or engine.blocks_needed(n, 1) > engine.num_free_blocks:
            break
        if len(pre_rows) >= 2 and time.perf_counter() - start > budget_s / 2:
            break
        pre_rows.append(prefill_features(n, 0))
        repeats = PREFILL_REPEATS if n <= REPEAT_MAX_TOKENS else 1
        pre_ys.append(min(_timed_prefill(engine, tokens(n), greedy, f"p{n}") for _ in range(repeats)))
    dec_rows, dec_ys = [], []
    for batch, ctx in DECODE_POINTS:
        if engine.blocks_needed(ctx, DECODE_STEPS + 2) * batch > engine.num_free_blocks:
            continue
        if len(dec_rows) >= MIN_DECODE_POINTS and time.perf_counter() - start > budget_s:
            break
        step_ms, total_ctx = _timed_decode(engine, [tokens(ctx) for _ in range(batch)], greedy)
        dec_rows.append(decode_features(batch, total_ctx))
        dec_ys.append(step_ms)
    a, b, c = fit_prefill(pre_rows, pre_ys)
    d, e, f = fit_nonneg(dec_rows, dec_ys, relative=True) if dec_rows else (0.0, 0.0, 0.0)
    log.info("calibrated in %.2fs: prefill %s ms, decode %s ms", time.perf_counter() - start,
             [round(y, 2) for y in pre_ys], [round(y, 2) for y in dec_ys])
    return CostProfile(a, b, c, d, e, f, kv_bytes_per_block(engine), "calibrated")


def _timed_prefill(engine: Engine, prompt: list[int], sampling: SamplingParams, tag: str) -> float:
    seq = engine.add_request(f"calibration-{tag}", prompt, 1, sampling, salt=CALIBRATION_SALT + tag.encode(),
                             reuse_prefix=False)
    try:
        t0 = time.perf_counter()
        engine.prefill(seq)
        return (time.perf_counter() - t0) * 1000.0
    finally:
        engine.free(seq)


def _timed_decode(engine: Engine, prompts: list[list[int]], sampling: SamplingParams) -> tuple[float, int]:
    """Fastest of DECODE_STEPS decode steps over len(prompts) sequences (ms), and the batch's mean total context."""
    seqs = [engine.add_request(f"calibration-d{i}", p, DECODE_STEPS + 2, sampling,
                               salt=CALIBRATION_SALT + b"d", reuse_prefix=False) for i, p in enumerate(prompts)]
    try:
        for s in seqs:
            engine.prefill(s)
        engine.decode_step(seqs)  # warm-up step at this batch size
        ctx = sum(s.num_tokens for s in seqs)
        best = float("inf")
        for _ in range(DECODE_STEPS):
            t0 = time.perf_counter()
            engine.decode_step(seqs)
            best = min(best, (time.perf_counter() - t0) * 1000.0)
        return best, ctx + len(seqs) * DECODE_STEPS // 2
    finally:
        for s in seqs:
            engine.free(s)


def obtain(engine: Engine, cfg: ProfileConfig) -> CostProfile:
    """The profile this worker declares: the saved file, a calibration (saved when
    `cfg.file` names a missing file), or none. Call on the engine's thread.

    Workers of one node start together: the file's lock lets one calibrate and save
    while the others wait, then load what it saved (one calibration per node, never
    several side by side disturbing each other's timings)."""
    if not cfg.file:
        return calibrate(engine, cfg.budget_s) if cfg.calibrate else CostProfile()
    path = Path(cfg.file)
    with FileLock(f"{path}.lock"):
        if path.exists():
            profile = CostProfile.from_json(path.read_text())
            return dataclasses.replace(profile, source=f"file:{path}",
                                       kv_bytes_per_block=profile.kv_bytes_per_block or kv_bytes_per_block(engine))
        if not cfg.calibrate:
            return CostProfile()
        profile = calibrate(engine, cfg.budget_s)
        path.write_text(profile.to_json() + "\n")
        return profile


def active_context_tokens(loop) -> int:
    """Tokens the loop's decode batch attends over (the decode cost model's input).

    Reads EngineLoop's decode list (a snapshot copy; the loop thread may change
    it meanwhile, so the figure is as fresh as any heartbeat figure).
    """
    return loop.active_context_tokens
