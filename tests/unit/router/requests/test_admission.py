"""Router admission as pure functions: normalization and cluster-dependent checks."""

from __future__ import annotations

import pytest

from router.config import RouterConfig
from router.requests.admission import admit, check_cluster
from router.requests.output import OutputLog
from router.requests.text import Detokenizer, load_tokenizer
from router.types import FinishReason, GenerateParams, Mode, Route, RouterError, Sampling, StatusCode
from runtime.directory.records import ClusterSnapshot, WorkerCapacity, WorkerRecord, WorkerRole

CFG = RouterConfig(default_deadline_ms=5000)


def params(**kw) -> GenerateParams:
    kw.setdefault("prompt_token_ids", (1, 2, 3))
    kw.setdefault("max_tokens", 4)
    return GenerateParams(**kw)


def test_defaults_fill_request_id_tenant_deadline_and_route():
    a = admit(params(), CFG, Route.DISAGGREGATED)
    assert len(a.request_id) == 32 and a.tenant == "default" and a.deadline_s == 5.0
    assert a.route is Route.DISAGGREGATED and a.prompt == (1, 2, 3)
    b = admit(params(request_id="x", tenant="t", deadline_ms=250, mode=Mode.COLOCATED), CFG, Route.DISAGGREGATED)
    assert (b.request_id, b.tenant, b.deadline_s, b.route) == ("x", "t", 0.25, Route.COLOCATED)
    assert admit(params(), RouterConfig(default_deadline_ms=0), Route.COLOCATED).deadline_s is None


def test_only_sampled_requests_without_a_seed_get_one():
    assert admit(params(), CFG, Route.COLOCATED).sampling.seed is None  # greedy: nothing to pin
    pinned = admit(params(sampling=Sampling(temperature=1.0)), CFG, Route.COLOCATED, seed_source=lambda: 42)
    assert pinned.sampling.seed == 42
    kept = admit(params(sampling=Sampling(temperature=1.0, seed=7)), CFG, Route.COLOCATED, seed_source=lambda: 42)
    assert kept.sampling.seed == 7


def test_request_id_length_is_bounded_in_bytes():
    with pytest.raises(RouterError, match="request_id is 257 bytes in UTF-8; at most 256"):
        admit(params(request_id="x" * 257), CFG, Route.COLOCATED)
    with pytest.raises(RouterError, match="request_id is 260 bytes"):
        admit(params(request_id="\u00e9" * 130), CFG, Route.COLOCATED)  # 130 two-byte characters
    assert admit(params(request_id="\u00e9" * 128), CFG, Route.COLOCATED).request_id == "\u00e9" * 128


def test_a_resumed_request_replays_what_was_given_and_its_budget_shrinks():
    a = admit(params(max_tokens=10, sampling=Sampling(temperature=1.0, seed=3, first_step=1)), CFG, Route.COLOCATED)
    r = a.replaying([7, 8])
    assert (r.prompt, r.max_tokens, r.sampling.first_step, r.sampling.seed) == ((1, 2, 3, 7, 8), 8, 3, 3)
    assert a.replaying([]) is a
    assert len(r.prompt) + r.max_tokens == len(a.prompt) + a.max_tokens  # the same room
    with pytest.raises(RouterError, match="sampling.first_step 3 replays the whole prompt of 3 tokens"):
        admit(params(sampling=Sampling(first_step=3)), CFG, Route.COLOCATED)


def test_the_next_attempt_resumes_after_all_but_the_last_token_given():
    log = OutputLog(0.0, clock=lambda: 1.0)
    assert log.resume_point() == 0
    log.offer(0, 11, 1)
    assert log.resume_point() == 0  # one given: start over (and check it)
    for i, t in enumerate((12, 13), start=1):
        log.offer(i, t, 1)
    assert log.resume_point() == 2


def decode(vocab: int, max_len: int, blocks: int = 100, role: WorkerRole = WorkerRole.DECODE,
           name: str = "d") -> WorkerRecord:
    return WorkerRecord(name, role, "a:1", capacity=WorkerCapacity(total_blocks=blocks, block_size=4, vocab_size=vocab,
                                                                   max_model_len=max_len))


def test_cluster_checks_use_the_most_permissive_declared_limit():
    req = admit(params(prompt_token_ids=(900,), max_tokens=100), CFG, Route.COLOCATED)
    check_cluster(req, ClusterSnapshot((decode(512, 128, name="a"), decode(1024, 256, name="b"))))
    with pytest.raises(RouterError) as err:
        check_cluster(req, ClusterSnapshot((decode(512, 128),)))
    assert err.value.code is StatusCode.INVALID_ARGUMENT and "vocab_size is 512" in err.value.message
    check_cluster(req, ClusterSnapshot((decode(0, 0),)))  # nothing declared: the worker decides


def test_cluster_without_decode_capable_workers_is_unavailable():
    req = admit(params(), CFG, Route.COLOCATED)
    with pytest.raises(RouterError) as err:
        check_cluster(req, ClusterSnapshot((decode(512, 128, role=WorkerRole.PREFILL),)))
    assert err.value.code is StatusCode.UNAVAILABLE and "no decode-capable worker" in err.value.message


def test_detokenizer_holds_back_cut_characters(tmp_path):
    from tokenizers import Tokenizer, decoders, models

    # Byte-level vocabulary: "é" is two tokens (0xC3 0xA9) that only decode together.
    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab, [], byte_fallback=True))
    tok.decoder = decoders.ByteFallback()
    tok.save(str(tmp_path / "tokenizer.json"))
    detok = Detokenizer(load_tokenizer(str(tmp_path)))
    pieces = [detok.add(t) for t in (0x61, 0xC3, 0xA9, 0x62)]
    assert pieces == ["a", "", "é", "b"]
    assert Detokenizer(None).add(5) == ""


def test_a_tokenizer_for_presets_and_checkpoints_with_tokenizer_json_only(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a checkpoint directory without tokenizer.json
    assert load_tokenizer(str(tmp_path)) is None and load_tokenizer("") is None
    assert load_tokenizer("no-such-preset") is None  # the workers judge the model; the router only tokenizes
    assert load_tokenizer("tiny").get_vocab_size() == 512 and load_tokenizer("tiny@7") is load_tokenizer("tiny")
    with pytest.raises(ValueError, match="neither a checkpoint directory nor a preset"):
        load_tokenizer(str(tmp_path / "config.json"))


def test_output_log_times_tokens_and_checks_replays():
    now = [10.0]
    log = OutputLog(10.0, clock=lambda: now[0])
    now[0] = 10.1
    assert log.offer(0, 7, 1).time_since_start_ms == pytest.approx(100.0)
    now[0] = 10.3
    log.offer(1, 8, 1)
    assert log.offer(0, 7, 2) is None  # a retry replaying what the client has
    with pytest.raises(RouterError, match="divergence at index 1"):
        log.offer(1, 9, 2)
    with pytest.raises(RouterError, match="finished after 1 tokens"):
        log.check_finished(1, 2)
    now[0] = 10.5
    done = log.completed(FinishReason.STOP, Route.COLOCATED, 2)
    assert (done.ttft_ms, done.tpot_ms, done.num_tokens) == (pytest.approx(100.0), pytest.approx(400.0), 2)


def test_priority_is_bounded_and_kept():
    from pdserve_client import contract
    from router.config import RouterConfig
    from router.requests.admission import admit
    from router.types import GenerateParams, RouterError, StatusCode

    base = dict(prompt_token_ids=(1, 2, 3), max_tokens=2)
    assert admit(GenerateParams(priority=7, **base), RouterConfig(), "colocated").priority == 7
    for bad in (contract.MAX_PRIORITY + 1, -contract.MAX_PRIORITY - 1):
        try:
            admit(GenerateParams(priority=bad, **base), RouterConfig(), "colocated")
        except RouterError as exc:
            assert exc.code is StatusCode.INVALID_ARGUMENT and "priority must be in [-1000, 1000]" in exc.message
        else:
            raise AssertionError(f"priority {bad} admitted")
