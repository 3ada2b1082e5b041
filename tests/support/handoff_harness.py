"""One hand-off driven through the engine contract's calls alone (runtime/worker/engine_contract.py),
for any engine: tests/unit/engine/test_contract.py (pdserve's, two engines) and
tests/support/vllm_contract.py (vLLM's, one engine playing both ends). No pytest here: the
latter runs in vLLM's environment.

P computes the prompt with its on_layer listener, D reserves, each layer's K/V moves once
final through both ends' views as one byte stream (as the transport moves it: the two
tables' runs of blocks need not match), D admits and decodes, both free (D twice)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class HandOff:
    tokens: list[int]
    p_digest: str
    d_digest: str
    first_block: int
    """D's prefix hit, in blocks: the transfer starts there."""
    layers_final: bool
    """on_layer reported every layer's K/V final for the whole prompt."""
    prefix_keys: list
    """What D's prefix cache took from the hand-off (engine.prefix_keys after the commit)."""
    logprobs: list
    """D's output_logprobs (SamplingParams.logprobs asked): None for token 0, P's."""
    first_logprobs: object = None
    """P's token 0's log-probabilities (P's seq.logprobs_of(0))."""


def hand_off(p, d, prompt: list[int], max_tokens: int, sampling) -> HandOff:
    layers_final: set[int] = set()
    src = p.add_request("r", prompt, 1, sampling)
    dst = d.add_request("r", prompt, max_tokens, sampling, receive=True)
    token = None
    while token is None:
        token = p.prefill_chunk(src, on_layer=lambda layer, start, end: layers_final.add(layer)
                                if end >= len(prompt) else None)
    first, blocks = dst.num_cached_tokens // d.block_size, -(-len(prompt) // d.block_size)
    for layer in sorted(layers_final):  # a layer's views are read once it is final
        data = b"".join(bytes(view) for run in p.kv_views(src, layer, first, blocks - first) for view in run)
        at = 0
        for run in d.kv_views(dst, layer, first, blocks - first):
            for view in run:
                view[:] = data[at:at + view.nbytes]
                at += view.nbytes
    digests = p.kv_digest(src), d.kv_digest(dst)
    first_logprobs = src.logprobs_of(0)
    p.free(src)
    d.commit_import(dst, token)
    keys = d.prefix_keys(dst, first, blocks)
    while not dst.is_finished:
        d.decode_step([dst])
    tokens, logprobs = list(dst.output_ids), list(dst.output_logprobs)
    d.free(dst)
    d.free(dst)  # idempotent
    return HandOff(tokens, *digests, first, len(layers_final) == p.num_layers, keys, logprobs, first_logprobs)
