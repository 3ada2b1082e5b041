"""The hand-off's engine contract driven through vLLM's engine alone, in vLLM's environment
(`.venv-vllm/bin/python -m tests.support.vllm_contract CHECKPOINT STAGING`; run by
tests/e2e/test_vllm_workers.py, which asserts on the JSON line it prints).

One VllmEngine plays both ends (vLLM's engine core is one per process) of the hand-off
tests/support/handoff_harness.py drives through the contract's calls. Reported per case: the
two digests equal, the tokens equal to a colocated run of the prompt, the prefix hit the
reservation started from; a hand-off's blocks taken out of vLLM's prefix cache again (what
a decode worker does when the router finds two ends' digests differ); then the contract's
failure semantics (an over-large and an
invalid request hold nothing; an aborted reservation and a double free give every block
back), a hand-off's log-probabilities (vLLM's raw_logprobs) and what is left held.
"""

from __future__ import annotations

import json
import random
import sys

from runtime.engine import InvalidRequest, OutOfBlocks, SamplingParams
from runtime.vllm.engine import VllmEngine, VllmOptions
from tests.support import handoff_harness as harness

GREEDY = SamplingParams(ignore_eos=True)
SEEDED = SamplingParams(temperature=0.8, top_p=0.9, seed=11, ignore_eos=True)
LOGPROBS = SamplingParams(ignore_eos=True, logprobs=3)


def hand_off(e: VllmEngine, prompt: list[int], max_tokens: int, sampling: SamplingParams = GREEDY,
             discard: dict | None = None) -> dict:
    done = harness.hand_off(e, e, prompt, max_tokens, sampling)
    if discard is not None:  # the hand-off's blocks out of vLLM's prefix cache again
        pool = e.sched.kv_cache_manager.block_pool
        discard["before"] = bool(done.prefix_keys) and all(pool.blocks[b].block_hash is not None
                                                           for b, _ in done.prefix_keys)
        e.forget_prefix(done.prefix_keys)
        discard["after"] = any(pool.blocks[b].block_hash is not None for b, _ in done.prefix_keys)
    return {"cached_blocks": done.first_block, "layers_final": done.layers_final,
            "digests_equal": done.p_digest == done.d_digest,
            "tokens_equal": done.tokens == e.generate(prompt, max_tokens, sampling)}


def logprobs(e: VllmEngine, prompt: list[int], max_tokens: int) -> dict:
    """A hand-off asking log-probabilities: token 0's are the prefill's (the decode imported
    it), every later token's the decode's, each with 3 alternatives, and their largest
    distance to a colocated run's (vLLM-CPU is not batch-invariant: measured, not promised)."""
    done = harness.hand_off(e, e, prompt, max_tokens, LOGPROBS)
    seq = e.add_request("colocated", prompt, max_tokens, LOGPROBS)
    e.prefill(seq)
    while not seq.is_finished:
        e.decode_step([seq])
    e.free(seq)
    split = [done.first_logprobs, *done.logprobs[1:]]
    return {"token_0_imported": done.logprobs[0] is None, "tokens_equal": done.tokens == seq.output_ids,
            "every_token": all(lp is not None and len(lp.top) == 3 for lp in split + seq.output_logprobs),
            "max_diff": max(abs(a.logprob - b.logprob) for a, b in zip(split, seq.output_logprobs))}


def failures(e: VllmEngine) -> dict:
    free = e.num_free_blocks
    out = {}
    big = e.add_request("big", [5] * (e.block_size * (e.num_blocks - 12)), 4, GREEDY, receive=True)
    held, left = e.held_blocks(), e.num_free_blocks
    try:
        e.add_request("too big", [6] * (e.block_size * 12), 4, GREEDY, receive=True)
    except OutOfBlocks:
        out["out_of_blocks_holds_nothing"] = e.num_free_blocks == left and e.held_blocks() == held
    e.free(big)
    try:
        e.add_request("bad", [1, 10**9], 4, GREEDY)
    except InvalidRequest as exc:
        out["invalid_says_why"] = "outside the vocabulary" in str(exc)
    waiting = e.add_request("aborted", [7] * 300, 4, GREEDY, receive=True)  # vLLM waits for its K/V
    out["reservation_holds_blocks"] = len(e.held_blocks()) >= 3
    e.free(waiting)
    e.free(waiting)
    out["abort_frees_every_block"] = not e.held_blocks() and e.num_free_blocks == free
    return out


def main() -> None:
    model, staging = sys.argv[1], sys.argv[2]
    tp = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    e = VllmEngine(model, VllmOptions(num_blocks=40, chunk_tokens=256, staging=staging,
                                      extra={"tensor_parallel_size": tp} if tp > 1 else {}))
    rng = random.Random(4)
    report: dict = {"staged": e.kv.staged, "engine": e.abi.engine, "batch_invariant": e.abi.batch_invariant}
    prompts = {"300": [rng.randrange(3, 32000) for _ in range(300)],
               "129": [rng.randrange(3, 32000) for _ in range(129)]}
    prompts["300 with a 2-block prefix hit"] = prompts["300"][:256] + [rng.randrange(3, 32000) for _ in range(44)]
    for name, prompt in prompts.items():
        report[name] = hand_off(e, prompt, 12)
    report["discard"] = {}
    hand_off(e, [rng.randrange(3, 32000) for _ in range(300)], 4, discard=report["discard"])
    if tp == 1:
        report["200 seeded"] = hand_off(e, [rng.randrange(3, 32000) for _ in range(200)], 12, SEEDED)
    try:
        e.add_request("seeded, chunked", [9] * 300, 4, SEEDED)
        report["seeded_chunked_refused"] = False
    except InvalidRequest as exc:
        report["seeded_chunked_refused"] = "seed" in str(exc)
    report["logprobs"] = logprobs(e, [rng.randrange(3, 32000) for _ in range(100)], 6)
    report["failures"] = failures(e)
    report["left"] = {"live": len(e.live), "vllm_requests": len(e.sched.requests), "held_blocks": e.held_blocks()}
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":  # vLLM's tensor-parallel ranks are spawned: they import this module
    main()
