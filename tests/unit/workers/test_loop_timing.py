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
