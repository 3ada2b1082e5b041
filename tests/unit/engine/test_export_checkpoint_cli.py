"""`pdserve export-checkpoint` writes a preset that loads back identically."""

from __future__ import annotations

import json
import subprocess
import sys

from runtime.engine import Engine, SamplingParams
from tests.support import REPO


def test_export_checkpoint_round_trips(tmp_path):
    out = tmp_path / "tiny-ckpt"
    proc = subprocess.run([sys.executable, "-m", "tooling.cli", "export-checkpoint",
                           "--preset", "tiny", "--out", str(out), "--seed", "7"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["num_key_value_heads"] == 2
    loaded = Engine.from_checkpoint(out)
    preset = Engine.from_preset("tiny", seed=7)
    assert loaded.identity == preset.identity
    params = SamplingParams(ignore_eos=True)
    assert loaded.generate([5, 6, 7, 8], 6, params) == preset.generate([5, 6, 7, 8], 6, params)


def test_export_checkpoint_unknown_preset_fails_clearly(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tooling.cli", "export-checkpoint",
                           "--preset", "huge", "--out", str(tmp_path / "x")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "unknown preset 'huge'" in proc.stderr
