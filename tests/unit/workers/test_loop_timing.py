"""EngineLoop's per-job prefill time: the job's own chunks, not its wait.

The router corrects its prefill price from PrefillResult.timings.compute_ms
(router/pricing/cost_model.py); a time that included the prompts ahead in the loop's
FIFO, or the decode steps between chunks, taught it that prefill was two to
three times slower after every burst.
"""

from __future__ import annotations

import threading
import time

from runtime.engine.engine import Engine, EngineConfig
from runtime.worker.loop import EngineLoop, Job


def test_compute_time_excludes_the_prompts_ahead_and_the_decode_steps_between_chunks():
    engine = Engine.from_spec("tiny", EngineConfig(num_blocks=256, block_size=16, chunk_tokens=32, torch_threads=1))
    loop = EngineLoop(engine)
    first_token: dict[str, float] = {}
    done = threading.Event()
    finished = []

    def on_token(seq, token, index):
        first_token.setdefault(seq.request_id, time.perf_counter())

    def on_done(seq, error):
        assert error is None
        finished.append(seq.request_id)
        if len(finished) == 3:
            done.set()

    # A stream decoding beside the prefills (its steps interleave with their chunks).
    decoding = Job(engine.add_request("d", list(range(1, 20)), 40), on_token, on_done)
    prompts = [Job(engine.add_request(rid, [(7 * i + len(rid)) % 400 + 1 for i in range(256)], 1), on_token, on_done,
                   prefill_only=True) for rid in ("a", "b")]
    loop.start()
    try:
        loop.submit_prefill(decoding)
        submitted = time.perf_counter()
        for job in prompts:
            loop.submit_prefill(job)
        assert done.wait(60), "the loop did not finish"
    finally:
        loop.stop()
    a, b = prompts
    waited_b = first_token["b"] - submitted
    assert a.compute_s > 0 and b.compute_s > 0
    # b's first token came after all of a's chunks and all of its own (one thread, FIFO),
    # plus decode steps of "d" between chunks: its own time is a strict part of its wait.
    assert a.compute_s + b.compute_s <= waited_b
    assert b.compute_s < 0.9 * waited_b


def test_the_loop_accounts_each_phase_s_wall_and_cpu_time_and_the_decoded_sequences():
    """EngineLoop.metrics (the worker's pd_engine_loop_* families): runs per phase, the
    sequences summed over decode steps, and wall >= CPU time per phase, both growing with
    the work; a phase that did nothing adds nothing."""
    engine = Engine.from_spec("tiny", EngineConfig(num_blocks=256, block_size=16, chunk_tokens=32, torch_threads=1))
    loop = EngineLoop(engine)
    done = threading.Event()
    finished = []

    def on_done(seq, error):
        finished.append((seq.request_id, error))
        if len(finished) == 2:
            done.set()

    jobs = [Job(engine.add_request(rid, list(range(1, 40)), 12), lambda *a: None, on_done) for rid in ("x", "y")]
    loop.start()
    try:
        for job in jobs:
            loop.submit_prefill(job)
        assert done.wait(60), "the loop did not finish"
        samples = {(name, tuple(sorted(labels.items()))): v for name, labels, v in loop.metrics()}
    finally:
        loop.stop()
    assert all(error is None for _, error in finished)

    def got(phase, what):
        if what == "runs":
            return samples[("pd_engine_loop_runs_total", (("phase", phase),))]
        return samples[("pd_engine_loop_seconds_total", (("clock", what), ("phase", phase)))]

    assert got("decode", "runs") == loop.steps > 0
    # two 12-token requests: 11 decode steps each after token 0, some shared
    assert samples[("pd_engine_loop_decoded_sequences_total", ())] == loop.decoded == 22
    assert got("prefill", "runs") == 4  # two 39-token prompts in 32-token chunks
    for phase in ("prefill", "decode"):  # the two clocks' resolutions differ: 1 ms of slack per run
        assert got(phase, "wall") + 1e-3 * got(phase, "runs") >= got(phase, "cpu") > 0
    assert got("commands", "runs") == 0 and got("commands", "wall") == 0.0
