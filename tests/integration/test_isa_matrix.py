"""Exactness on more than the host's instruction set, each setting in its own processes.

MKL honours MKL_ENABLE_INSTRUCTIONS and oneDNN ONEDNN_MAX_CPU_ISA (as on an older
CPU); ATen honours ATEN_CPU_CAPABILITY; the exact kernels honour PD_KERNEL_ISA
(`portable` is the std::fma path aarch64 runs). Under each setting:

* the invariance tests and an end-to-end exactness test pass (pytest in a child
  process, the local cluster's processes inheriting the setting), and
* the K/V bytes, logits and tokens of fixed prompts, and 3,000 of the sampler's draws,
  are the same bits as under every other setting, and so is the cache ABI digest: the numerics do not depend
  on the CPU, which is why the ABI names no instruction set (abi.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SETTINGS = {
    "host": {},
    "mkl-onednn-avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "portable-aten-default": {"PD_KERNEL_ISA": "portable", "ATEN_CPU_CAPABILITY": "default"},
}

INVARIANCE_TESTS = ["tests/unit/engine/test_ops.py", "tests/unit/engine/test_exactness.py",
                    "tests/unit/engine/test_selfcheck.py"]
E2E_TEST = "tests/e2e/test_e2e_exactness.py::test_disaggregated_equals_colocated_with_exact_handoff[ucx]"

_FINGERPRINT = r"""
import hashlib, json, random
import torch
from runtime.engine import Engine, EngineConfig, SamplingParams
from runtime import kernels
from runtime.engine.ops import ISA, KERNEL
rng = random.Random(7)
path = {v: k for k, v in kernels.ISAS.items()}[ISA]
out = {"kernel_path": (KERNEL.isa() if path == "auto" else path) if KERNEL else "torch",
       "aten": torch.backends.cpu.get_cpu_capability()}
for tile in (64, 128):
    engine = Engine.from_preset("tiny", cfg=EngineConfig(num_blocks=256, attn_tile_tokens=tile, chunk_tokens=37))
    h = hashlib.sha256(engine.abi.digest.encode())
    seqs = [engine.add_request(f"r{i}", [rng.randrange(512) for _ in range(n)], 9,
                               SamplingParams(temperature=0.9 if i % 2 else 0.0, top_p=0.9, seed=i,
                                              ignore_eos=True))
            for i, n in enumerate((5, 130, 300))]
    for s in seqs:
        engine.prefill(s)
        h.update(engine.kv_digest(s).encode())
    while not all(s.is_finished for s in seqs):
        engine.decode_step([s for s in seqs if not s.is_finished])
        h.update(engine.last_logits.numpy().tobytes())
    h.update(json.dumps([s.output_ids for s in seqs]).encode())
    out[f"tile{tile}"] = h.hexdigest()
# The sampler's draws (the softmax, top-p's cumsum and the inverse-CDF pick must not
# follow MKL's or ATen's code path), 3,000 times.
from runtime.engine.sampler import SamplingParams as P, sample_one
import numpy as np  # numpy's normals (scalar C) are the same on every CPU; torch.randn's need not be
logits = torch.from_numpy(np.random.default_rng(11).standard_normal((3000, 512), dtype=np.float32))
draws = [sample_one(logits[i], P(temperature=0.8, top_p=0.95 if i % 2 else 1.0, seed=i), i % 7)
         for i in range(3000)]
out["draws"] = hashlib.sha256(json.dumps(draws).encode()).hexdigest()
print(json.dumps(out))
"""


def _env(setting: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **SETTINGS[setting])
    for var in ("MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "PD_KERNEL_ISA", "ATEN_CPU_CAPABILITY"):
        if var not in SETTINGS[setting]:
            env.pop(var, None)  # each setting is exactly what it names
    return env


def _pytest(setting: str, tests: list[str], **env: str) -> None:
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                         cwd=ROOT, env={**_env(setting), **env}, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{setting}:\n{out.stdout[-4000:]}\n{out.stderr[-2000:]}"


@pytest.mark.parametrize("setting", ["mkl-onednn-avx2", "portable-aten-default"])
def test_invariance_tests_pass(setting):
    _pytest(setting, INVARIANCE_TESTS)


@pytest.mark.slow
def test_end_to_end_exactness_with_mkl_and_onednn_limited_to_avx2():
    _pytest("mkl-onednn-avx2", [E2E_TEST], PD_TEST_EXACTNESS_REQUESTS="60")


def test_bits_are_the_same_under_every_setting():
    prints = {}
    for setting in SETTINGS:
        out = subprocess.run([sys.executable, "-c", _FINGERPRINT], cwd=ROOT, env=_env(setting),
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"{setting}: {out.stderr[-2000:]}"
        prints[setting] = json.loads(out.stdout.strip().splitlines()[-1])
    # Each setting took the path it names.
    assert prints["portable-aten-default"]["kernel_path"] == "portable"
    assert prints["portable-aten-default"]["aten"] == "DEFAULT"
    assert prints["host"]["kernel_path"] != "torch"
    for key in ("tile64", "tile128", "draws"):
        assert len({p[key] for p in prints.values()}) == 1, {s: (p["kernel_path"], p["aten"], p[key])
                                                             for s, p in prints.items()}
