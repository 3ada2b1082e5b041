"""The compiled builds of the router's per-request modules (router/native.py):
present after `make`, loaded only for the source they were built from, and
deciding exactly as the Python source does."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from array import array
from pathlib import Path

import pytest

from router import native
from router.pricing.formula import colocated_keys, decode_keys, handoff_ms, prefill_keys, smallest
from router.pricing.routes import colocated_key
from tests.support import REPO as ROOT
from tests.support.random_tables import random_request, random_table

_DECISIONS = r"""
import hashlib
from router import native
from router.pricing.decision import decide
from router.pricing.reference import reference_decide
from tests.support.random_tables import random_params, random_request, random_table

digest = hashlib.sha256()
for seed in range(40):
    rng, block_size, workers, model, rows = random_table(seed)
    for _ in range(20):
        req = random_request(rng, workers, block_size)
        params = random_params(rng)
        for d in (decide(model, rows, req, params), reference_decide(model, rows.rows, req, params)):
            digest.update(repr(d).encode())
print(sorted(native.status().items()))
print(digest.hexdigest())
"""


def _run(enabled: bool) -> list[str]:
    env = dict(os.environ, PD_ROUTER_NATIVE="1" if enabled else "0",
               PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", _DECISIONS], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_per_request_modules_run_as_configured():
    """After `make`, every per-request module runs compiled; with PD_ROUTER_NATIVE=0 (the
    configuration a machine without a C compiler runs) every one runs its source."""
    status = native.status()
    if native.enabled():
        missing = [m for m, c in status.items() if not c]
        assert not missing, (f"{missing} run from source: no build for their current source "
                             f"(`make native` or `python -m router.native_build` builds them)")
    else:
        compiled = [m for m, c in status.items() if c]
        assert not compiled, f"PD_ROUTER_NATIVE=0, yet {compiled} run compiled"


def test_compiled_decisions_equal_the_python_source():
    on, off = _run(True), _run(False)
    assert all(c for _, c in eval(on[0])), on[0]  # our own subprocess's repr of (str, bool) pairs
    assert not any(c for _, c in eval(off[0])), off[0]
    assert on[1] == off[1], "a compiled module decides differently from its Python source"


def test_a_build_loads_only_for_the_source_it_was_built_from(tmp_path):
    module = "router.pricing.cost_table"
    built = native.build_path(module)
    assert built is not None and built.is_file(), "no build of router/pricing/cost_table.py (run `make native`)"
    # A copy of the package root holding the same source, the shared declarations and its build: found.
    (tmp_path / "router" / "_native").mkdir(parents=True)
    (tmp_path / "router" / "pricing").mkdir()
    src = tmp_path / "router" / "pricing" / "cost_table.py"
    shutil.copy(native.source_of(module), src)
    for name in native.SHARED:
        shutil.copy(native.ROOT / name, tmp_path / name)
    shutil.copy(built, tmp_path / "router" / "_native" / built.name)
    finder = native.Finder((module,), root=tmp_path)
    spec = finder.find_spec(module)
    assert spec is not None and Path(spec.origin) == tmp_path / "router" / "_native" / built.name
    assert finder.find_spec("router.pricing.decision") is None  # not one of this finder's modules
    # The source edited: its old build is not the build of this source, so the source loads.
    src.write_text(src.read_text() + "\n# edited\n")
    assert finder.find_spec(module) is None
    tag = hashlib.sha256(src.read_bytes() + native.shared_bytes(tmp_path) + native._SUFFIX.encode()).hexdigest()[:16]
    assert native.build_path(module, tmp_path).name == f"{module}.{tag}{native._SUFFIX}"
    # The source as built, but the formula's declarations edited: every build is stale.
    src.write_text(native.source_of(module).read_text())
    assert finder.find_spec(module) is not None
    pxd = tmp_path / native.SHARED[-1]
    pxd.write_text(pxd.read_text() + "\n# edited\n")
    assert finder.find_spec(module) is None


def test_builds_can_be_turned_off(monkeypatch):
    for value, on in (("0", False), ("off", False), ("false", False), ("1", True), ("", True)):
        monkeypatch.setenv(native.ENV, value)
        assert native.enabled() is on


@pytest.mark.parametrize("seed", range(20))
def test_kernel_keys_are_the_references_doubles(seed):
    """router/pricing/formula.py's column loops give, bit for bit, the doubles reference_candidates
    computes per row (router/pricing/reference.py) from the same terms: TPOT with the request
    (WorkerCosts.tpot_with), queue + prefill (WorkerCosts.queued_prefill_ms), the transfer
    bound (handoff_ms), and the colocated key of every row (routes.colocated_key: the
    colocated route's own TTFT and TPOT, planned-only streams included). The decisions can
    hide a last-bit difference in a pruning key; these cannot."""
    rng, block_size, workers, model, table = random_table(seed)
    np_, nd = len(table.p_rows), len(table.d_rows)
    tp_at, dms_at, key_at = table.tp_at, table.dms_at, table.key_at  # the scratch segments [p_ms | tp | d_ms | key]
    for _ in range(10):
        req = random_request(rng, workers, block_size)
        n, m = req.prompt_tokens, req.max_tokens
        gaps, ctx = max(1, m - 1), n + m // 2
        s = array("d", [0.0]) * (np_ + 3 * nd)
        mpb, moved = rng.uniform(1e-7, 1e-5), rng.randrange(0, 200)
        decode_keys(table.a_d, nd, ctx, gaps, moved, mpb, True, s, tp_at)
        assert list(s[tp_at:dms_at]) == [r.tpot_with(n, m) for r in table.d_rows]
        assert list(s[dms_at:key_at]) == [r.admission_ms + moved * r.kv_bytes_per_block * mpb for r in table.d_rows]
        assert list(s[dms_at:key_at]) == [handoff_ms(r.admission_ms, moved, r.kv_bytes_per_block, mpb)
                                          for r in table.d_rows]
        hit = rng.randrange(0, max(1, req.usable_blocks + 1))  # some prefix reused
        reused = hit * block_size
        prefill_keys(table.a_p, np_, n - reused, reused, s)
        assert list(s[:np_]) == [r.queue_ms + r.pre_base + r.pre_tok * (n - reused)
                                 + r.pre_pair * (n - reused) * (reused + (n - reused) / 2.0) for r in table.p_rows]
        overhead = rng.uniform(0, 50)
        ttft_ref, tpot_ref = rng.uniform(1, 5000), rng.uniform(1e-3, 200)
        colocated_keys(table.a_d, nd, table._d_scale_at(n - reused), n - reused, reused, ctx, gaps, overhead,
                       ttft_ref, tpot_ref, s, key_at)
        assert list(s[key_at:]) == [colocated_key(r, req, overhead, hit, ttft_ref, tpot_ref) for r in table.d_rows]
        spans = [(0, np_), (tp_at, nd), (key_at, nd)]
        assert smallest(s, spans, 4) == [sorted(range(ln), key=lambda i, o=off: s[o + i])[:4] for off, ln in spans]
