"""K/V handed from a prefill engine in one process to a decode engine in another.

Two spawned worker processes, each with its own engine (same preset and seed,
different pools and physical block ids), driven step by step by the test:

    B: reserve (maybe hit a cached prefix)  -> first block to send
    A: add_request, prefill, export_kv(first) -> bytes, abi, kv_digest, first token
    A: decode to the end itself              |  B: import_kv, check kv_digest,
                                             |     commit_import, decode to the end
Both token lists must be equal, and both pools full again afterwards.
"""

from __future__ import annotations

import random

import pytest

from runtime.engine import (
    Engine,
    EngineConfig,
    SamplingParams,
    export_kv,
    import_kv,
)
from tests.support.engine import random_prompt
from tests.support.spawned import spawned

SEED = 7
PROMPT_TOKENS = 150
DECODE_TOKENS = 24
MAX_TOKENS = DECODE_TOKENS + 1  # the first token comes from prefill
SHARED_TOKENS = 64
BLOCK = 16
A_BLOCKS, B_BLOCKS = 48, 64

# ---- worker side (runs in the spawned processes) ---------------------------

_state: dict = {}


def _engine(num_blocks: int) -> Engine:
    cfg = EngineConfig(num_blocks=num_blocks, block_size=BLOCK, chunk_tokens=64,
                       attn_tile_tokens=64, torch_threads=1)
    return Engine.from_preset("tiny", seed=SEED, cfg=cfg)


def _pool(engine: Engine) -> dict:
    return dict(free=engine.num_free_blocks, total=engine.blocks.num_blocks,
                max_ref=max(b.ref_count for b in engine.blocks.blocks))


def b_reserve(prompt: list[int], sampling: SamplingParams, shared_prefix: list[int]) -> dict:
    """Decode side: hold unrelated blocks, maybe cache a prefix, then reserve the request."""
    engine = _engine(B_BLOCKS)
    holder = engine.add_request("holder", random_prompt(random.Random(99), 70), 10,
                                reuse_prefix=False)  # shifts every later physical id
    if shared_prefix:
        other = shared_prefix + random_prompt(random.Random(98), 40)
        engine.generate(other, 2, SamplingParams(ignore_eos=True), request_id="earlier")
    seq = engine.add_request("r", prompt, MAX_TOKENS, sampling)
    _state.update(engine=engine, seq=seq, holder=holder)
    return dict(num_cached_tokens=seq.num_cached_tokens, block_table=list(seq.block_table),
                first_block=seq.num_cached_tokens // engine.block_size)


def b_import_and_decode(kv: bytes, abi_digest: str, kv_digest: str, first_token: int,
                        first_block: int) -> dict:
    """Decode side: import the sent blocks, verify, commit, decode to the end, free."""
    engine, seq, holder = _state.pop("engine"), _state.pop("seq"), _state.pop("holder")
    import_kv(engine, seq, kv, abi_digest, first=first_block)
    got_digest = engine.kv_digest(seq)
    if got_digest != kv_digest:
        raise AssertionError(f"kv_digest after import {got_digest} != prefill's {kv_digest}")
    engine.commit_import(seq, first_token)
    while not seq.is_finished:
        engine.decode_step([seq])
    engine.free(seq)
    engine.free(holder)
    return dict(tokens=list(seq.output_ids), finish=seq.finish_reason.value, pool=_pool(engine))


def a_prefill_and_export(prompt: list[int], sampling: SamplingParams, first_block: int) -> dict:
    """Prefill side: compute the prompt and pack its K/V from `first_block` on."""
    engine = _engine(A_BLOCKS)
    seq = engine.add_request("r", prompt, MAX_TOKENS, sampling)
    first_token = engine.prefill(seq)
    _state.update(engine=engine, seq=seq)
    return dict(kv=export_kv(engine, seq, first=first_block), abi_digest=engine.abi.digest,
                kv_digest=engine.kv_digest(seq), first_token=first_token,
                block_table=list(seq.block_table), block_bytes=engine.cache.block_bytes_per_layer
                * engine.model_cfg.num_hidden_layers)


def a_decode_rest() -> dict:
    """Prefill side: keep decoding locally (the reference continuation), then free."""
    engine, seq = _state.pop("engine"), _state.pop("seq")
    while not seq.is_finished:
        engine.decode_step([seq])
    engine.free(seq)
    return dict(tokens=list(seq.output_ids), finish=seq.finish_reason.value, pool=_pool(engine))


# ---- test side ------------------------------------------------------------------


@pytest.fixture(scope="module")
def workers():
    """Process A (prefill) and process B (decode), each serving this module's functions
    above; fresh engines per call sequence."""
    with spawned(("prefill-A", __name__), ("decode-B", __name__)) as (a, b):
        yield a, b


def _hand_off(workers, prompt, sampling, shared_prefix=()) -> tuple[dict, dict, dict, dict]:
    a, b = workers
    reserved = b.call("b_reserve", prompt=prompt, sampling=sampling,
                      shared_prefix=list(shared_prefix))
    sent = a.call("a_prefill_and_export", prompt=prompt, sampling=sampling,
                  first_block=reserved["first_block"])
    a_id = a.start("a_decode_rest")  # A and B decode at the same time
    b_id = b.start("b_import_and_decode", kv=sent["kv"], abi_digest=sent["abi_digest"],
                   kv_digest=sent["kv_digest"], first_token=sent["first_token"],
                   first_block=reserved["first_block"])
    a_done, b_done = a.result(a_id), b.result(b_id)
    for side in (a_done, b_done):
        pool = side["pool"]
        assert pool["free"] == pool["total"] and pool["max_ref"] == 0, f"leak: {pool}"
    assert len(a_done["tokens"]) == MAX_TOKENS and a_done["finish"] == "length"
    assert a_done["tokens"][0] == sent["first_token"]
    return reserved, sent, a_done, b_done


def _prompt() -> list[int]:
    return random_prompt(random.Random(1), PROMPT_TOKENS)


def test_greedy_continues_identically_in_another_process(workers):
    prompt = _prompt()
    reserved, sent, a_done, b_done = _hand_off(workers, prompt, SamplingParams(ignore_eos=True))
    assert reserved["num_cached_tokens"] == 0
    assert reserved["block_table"][:10] != sent["block_table"][:10]  # other physical blocks
    assert len(sent["kv"]) == 10 * sent["block_bytes"]  # ceil(150 / 16) prompt blocks
    assert b_done["tokens"] == a_done["tokens"]


def test_sampled_continues_identically_in_another_process(workers):
    prompt = _prompt()
    sampling = SamplingParams(temperature=0.7, seed=1234, ignore_eos=True)
    _, _, a_done, b_done = _hand_off(workers, prompt, sampling)
    assert b_done["tokens"] == a_done["tokens"]
    greedy = _engine(A_BLOCKS).generate(prompt, MAX_TOKENS, SamplingParams(ignore_eos=True))
    assert a_done["tokens"] != greedy  # the run really sampled


def test_only_uncached_blocks_are_sent_when_decode_holds_a_prefix(workers):
    prompt = _prompt()
    shared = prompt[:SHARED_TOKENS]
    reserved, sent, a_done, b_done = _hand_off(
        workers, prompt, SamplingParams(ignore_eos=True), shared_prefix=shared)
    assert reserved["num_cached_tokens"] == SHARED_TOKENS
    assert reserved["first_block"] == SHARED_TOKENS // BLOCK
    assert len(sent["kv"]) == (10 - 4) * sent["block_bytes"]
    assert b_done["tokens"] == a_done["tokens"]
