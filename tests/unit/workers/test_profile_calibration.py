"""Worker-side calibration: the fit, a real (tiny) engine run, saved profiles."""

from __future__ import annotations

import pytest

from runtime.directory.cost_profile import CostProfile
from runtime.engine import Engine, EngineConfig
from runtime.worker.profile import ProfileConfig, fit_nonneg, fit_prefill, kv_bytes_per_block, obtain, prefill_features


def test_fit_recovers_exact_coefficients():
    rows = [[1.0, n, n * n / 2] for n in (32, 128, 512, 1024)]
    ys = [2.0 + 0.05 * r[1] + 1e-4 * r[2] for r in rows]
    a, b, c = fit_nonneg(rows, ys)
    assert a == pytest.approx(2.0, rel=1e-6) and b == pytest.approx(0.05, rel=1e-6)
    assert c == pytest.approx(1e-4, rel=1e-6)


def test_fit_never_returns_negative_coefficients():
    # y falls with x: the unconstrained slope is negative, so it is dropped.
    coef = fit_nonneg([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]], [3.0, 2.0, 1.0])
    assert coef[1] == 0.0 and coef[0] == pytest.approx(2.0)


def test_relative_fit_keeps_short_prompts_right_when_a_long_point_is_slow():
    # A neighbour's start slowed the 2048-token run by 30%: an absolute fit
    # prices a 32-token prompt 66% high (the bench's rejected short requests);
    # the relative fit keeps every point within its own error.
    true = lambda n: 3.0 + 1.0 * n + 0.0002 * n * n / 2  # noqa: E731
    ns = (32, 128, 512, 1024, 2048)
    ys = [true(n) * (1.3 if n == 2048 else 1.0) for n in ns]
    rows = [[1.0, n, n * n / 2] for n in ns]
    ratio = lambda coef, n: (coef[0] + coef[1] * n + coef[2] * n * n / 2) / true(n)  # noqa: E731
    assert ratio(fit_nonneg(rows, ys), 32) > 1.5
    rel = fit_nonneg(rows, ys, relative=True)
    assert all(0.9 < ratio(rel, n) < 1.1 for n in (32, 128, 512))


@pytest.fixture(scope="module")
def engine():
    return Engine.from_spec("tiny", EngineConfig(num_blocks=256, block_size=16, chunk_tokens=256, torch_threads=1))


def test_calibration_of_a_real_engine_is_increasing_and_frees_blocks(engine, tmp_path):
    free = engine.num_free_blocks
    path = tmp_path / "profile.json"
    profile = obtain(engine, ProfileConfig(file=str(path), budget_s=2.0))
    assert engine.num_free_blocks == free
    assert profile.source == "calibrated" and path.exists()
    prefill = lambda n: (profile.prefill_base_ms + profile.prefill_ms_per_token * n  # noqa: E731
                         + profile.prefill_ms_per_pair * n * n / 2)
    assert 0 < prefill(32) < prefill(1024)
    assert profile.decode_base_ms + profile.decode_ms_per_seq > 0
    assert profile.kv_bytes_per_block == kv_bytes_per_block(engine) > 0
    # A second start loads the saved file instead of calibrating.
    again = obtain(engine, ProfileConfig(file=str(path)))
    assert again.source == f"file:{path}"
    assert again.prefill_ms_per_token == profile.prefill_ms_per_token


def test_calibration_off_declares_nothing(engine):
    assert obtain(engine, ProfileConfig(calibrate=False)) == CostProfile()


def test_profile_config_from_env():
    cfg = ProfileConfig.from_env({"PD_PROFILE_CALIBRATE": "0", "PD_PROFILE_BUDGET_S": "1.5"})
    assert cfg == ProfileConfig(calibrate=False, budget_s=1.5)
    with pytest.raises(ValueError, match="PD_PROFILE_BUDGET_S"):
        ProfileConfig.from_env({"PD_PROFILE_BUDGET_S": "soon"})


def test_the_decode_points_always_measured_determine_all_three_terms():
    # With only (1, 64) and (4, 64) measured, context grew with batch and the fit put
    # a whole step on context: 191 ms predicted TPOT for a 28 ms idle stream.
    from runtime.worker.profile import DECODE_POINTS, MIN_DECODE_POINTS, decode_features
    rows = [decode_features(b, b * ctx) for b, ctx in DECODE_POINTS[:MIN_DECODE_POINTS]]
    det = (rows[0][0] * (rows[1][1] * rows[2][2] - rows[1][2] * rows[2][1])
           - rows[0][1] * (rows[1][0] * rows[2][2] - rows[1][2] * rows[2][0])
           + rows[0][2] * (rows[1][0] * rows[2][1] - rows[1][1] * rows[2][0]))
    assert abs(det) > 1.0
    d, e, f = 5.0, 2.0, 0.01
    a = fit_nonneg(rows, [d + e * r[1] + f * r[2] for r in rows], relative=True)
    assert a == pytest.approx([d, e, f], rel=1e-6)


def test_two_prefill_points_fit_a_per_token_cost():
    # A tight budget leaves (32, 128) only: base + pair alone would fit them exactly
    # and price prefill at 0 ms per token; the pair term is left out instead.
    rows = [prefill_features(32, 0), prefill_features(128, 0)]
    ys = [3.0 + 0.25 * 32 + 1e-4 * 32 * 16, 3.0 + 0.25 * 128 + 1e-4 * 128 * 64]
    a, b, c = fit_prefill(rows, ys)
    assert c == 0.0
    assert b > 0.2 and a > 0
    for r, y in zip(rows, ys):
        assert a + b * r[1] == pytest.approx(y, rel=0.02)


def test_three_prefill_points_keep_the_pair_term():
    truth = (2.0, 0.1, 2e-4)
    rows = [prefill_features(n, 0) for n in (32, 512, 2048)]
    ys = [truth[0] + truth[1] * r[1] + truth[2] * r[2] for r in rows]
    assert fit_prefill(rows, ys) == pytest.approx(truth, rel=1e-6)


def test_fit_prefill_never_prices_a_token_at_zero():
    """Seen on a loaded machine (the suite with two workers and a busy core): noisy
    calibration points that the pair term alone fits best gave prefill_ms_per_token 0.
    The fit then drops the pair term instead: every prefill token costs something."""
    from runtime.worker.profile import fit_prefill, prefill_features
    news = [64, 128, 256, 512]
    rows = [prefill_features(n, 0) for n in news]
    ys = [1e-5 * n * n / 2 for n in news]  # all quadratic: the full fit puts nothing per token
    base, per_token, per_pair = fit_prefill(rows, ys)
    assert per_token > 0 and per_pair == 0.0


def test_workers_starting_together_calibrate_once_and_the_others_load_it(engine, tmp_path, monkeypatch):
    import threading
    import time

    from runtime.worker import profile as profile_mod

    runs = []

    def slow_calibration(engine, budget_s):
        runs.append(threading.get_ident())
        time.sleep(0.3)  # the others arrive while it runs
        return CostProfile(prefill_ms_per_token=0.5, kv_bytes_per_block=4096, source="calibrated")

    monkeypatch.setattr(profile_mod, "calibrate", slow_calibration)
    cfg = ProfileConfig(file=str(tmp_path / "profile.json"))
    sources = []
    threads = [threading.Thread(target=lambda: sources.append(obtain(engine, cfg).source)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(runs) == 1
    assert sorted(sources) == ["calibrated", f"file:{cfg.file}", f"file:{cfg.file}"]
