"""The hand-off's engine contract driven through vLLM's engine alone, in vLLM's environment
(`.venv-vllm/bin/python -m tests.support.vllm_contract CHECKPOINT STAGING`; run by
tests/e2e/test_vllm_workers.py, which asserts on the JSON line it prints).

One VllmEngine plays both ends (vLLM's engine core is one per process): a prefill sequence
computes the prompt with its on_layer listener, a reservation (receive=True) gets vLLM's
blocks, the K/V moves through both ends' views as a byte stream (as the transport moves
it: the two tables' runs need not match), then commit and decode. Reported per case: the
two digests equal, the tokens equal to a colocated run of the prompt, the prefix hit the
reservation started from; a hand-off's blocks taken out of vLLM's prefix cache again (what
a decode worker does when the router finds two ends' digests differ); then the contract's
failure semantics (an over-large and an
invalid request hold nothing; an aborted reservation and a double free give every block
back) and what is left held.
"""

from __future__ import annotations

import json
import random
import sys

from runtime.engine import InvalidRequest, OutOfBlocks, SamplingParams
from runtime.vllm.engine import VllmEngine, VllmOptions

GREEDY = SamplingParams(ignore_eos=True)
SEEDED = SamplingParams(temperature=0.8, top_p=0.9, seed=11, ignore_eos=True)


def hand_off(e: VllmEngine, prompt: list[int], max_tokens: int, sampling: SamplingParams = GREEDY,
             discard: dict | None = None) -> dict:
    layers_final: set[int] = set()
    src = e.add_request("r", prompt, 1, sampling)
    dst = e.add_request("r", prompt, max_tokens, sampling, receive=True)
    token = None
    while token is None:
        token = e.prefill_chunk(src, on_layer=lambda layer, start, end: layers_final.add(layer)
                                if end >= len(prompt) else None)
    first, blocks = dst.num_cached_tokens // e.block_size, -(-len(prompt) // e.block_size)
    for layer in sorted(layers_final):  # a layer's views are read once it is final
        data = b"".join(bytes(k) + bytes(v) for k, v in e.kv_views(src, layer, first, blocks - first))
        at = 0
        for k, v in e.kv_views(dst, layer, first, blocks - first):
            for view in (k, v):
                view[:] = data[at:at + view.nbytes]
                at += view.nbytes
    digests = e.kv_digest(src), e.kv_digest(dst)
    e.free(src)
    e.commit_import(dst, token)
    keys = e.prefix_keys(dst, first, blocks)  # what the decode worker keeps for a discard
    while not dst.is_finished:
        e.decode_step([dst])
    tokens = list(dst.output_ids)
    e.free(dst)
    e.free(dst)  # idempotent
    if discard is not None:
        pool = e.sched.kv_cache_manager.block_pool
        discard["before"] = bool(keys) and all(pool.blocks[b].block_hash is not None for b, _ in keys)
        e.forget_prefix(keys)
        discard["after"] = any(pool.blocks[b].block_hash is not None for b, _ in keys)
    return {"cached_blocks": first, "layers_final": len(layers_final) == e.num_layers,
            "digests_equal": digests[0] == digests[1],
            "tokens_equal": tokens == e.generate(prompt, max_tokens, sampling)}


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
    report["failures"] = failures(e)
    report["left"] = {"live": len(e.live), "vllm_requests": len(e.sched.requests), "held_blocks": e.held_blocks()}
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":  # vLLM's tensor-parallel ranks are spawned: they import this module
    main()
