"""GenerateOptions: the one list of Generate's options, its validation, and the two ways
both clients take it (options= and keywords) against the fake router (conftest.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest

from pdserve_client import AsyncClient, GenerateOptions, InvalidArgumentError, PdError, TokenLogprobs
from pdserve_client.options import OPTION_NAMES, resolve_options
from pdserve_client.rpc.pd.v1 import common_pb2, router_pb2
from pdserve_ops.cli import build_parser
from tests.support.sdk import complete, started, token

Event = router_pb2.GenerateEvent


@pytest.mark.parametrize("fields,name,rule", [
    (dict(max_tokens=0), "max_tokens", "an integer in [1, 4294967295]"),
    (dict(max_tokens=2**32), "max_tokens", "an integer in [1, 4294967295]"),
    (dict(max_tokens=True), "max_tokens", "an integer"),
    (dict(max_tokens=4.0), "max_tokens", "an integer"),
    (dict(temperature=-0.1), "temperature", "a finite number >= 0"),
    (dict(temperature=math.nan), "temperature", "a finite number >= 0"),
    (dict(temperature="0.7"), "temperature", "a finite number >= 0"),
    (dict(top_k=-1), "top_k", "an integer in [0, 4294967295]"),
    (dict(top_p=0.0), "top_p", "a number in (0, 1]"),
    (dict(top_p=1.5), "top_p", "a number in (0, 1]"),
    (dict(seed=-1), "seed", "an integer in [0, 18446744073709551615]"),
    (dict(seed=2**64), "seed", "an integer in [0, 18446744073709551615]"),
    (dict(stop_token_ids=[2, -13]), "stop_token_ids", "a sequence of token ids, integers in [0, 4294967295]"),
    (dict(stop_token_ids=[2, 13.0]), "stop_token_ids", "a sequence of token ids"),
    (dict(stop_token_ids="2,13"), "stop_token_ids", "a sequence of token ids"),
    (dict(stop_token_ids=7), "stop_token_ids", "a sequence of token ids"),
    (dict(ignore_eos=1), "ignore_eos", "True or False"),
    (dict(first_step=-1), "first_step", "an integer in [0, 4294967295]"),
    (dict(logprobs=21), "logprobs", "an integer in [0, 20]"),
    (dict(logprobs=True), "logprobs", "an integer in [0, 20]"),
    (dict(mode="sideways"), "mode", "None or one of disaggregated, colocated, auto, shadow, canary"),
    (dict(tenant=None), "tenant", "a string"),
    (dict(slo_ttft_ms=-5), "slo_ttft_ms", "None or a finite number >= 0"),
    (dict(slo_tpot_ms=math.inf), "slo_tpot_ms", "None or a finite number >= 0"),
    (dict(request_id=""), "request_id", "None or a non-empty string"),
    (dict(deadline_s=0), "deadline_s", "None or a number in (0, 4294967]"),
    (dict(deadline_s=5e6), "deadline_s", "None or a number in (0, 4294967]"),
])
def test_each_bad_field_is_refused_by_name_rule_and_value(fields, name, rule):
    with pytest.raises(ValueError) as info:
        GenerateOptions(**{"max_tokens": 4, **fields})
    message = str(info.value)
    assert message.startswith(f"INVALID_ARGUMENT: {name} must be {rule}"), message
    assert message.endswith(f"got {fields[name]!r}"), message
    # The SDK's own error type too: code INVALID_ARGUMENT, not retryable.
    assert isinstance(info.value, PdError) and isinstance(info.value, InvalidArgumentError)
    assert (info.value.code, info.value.grpc_code, info.value.retryable) == ("INVALID_ARGUMENT",) * 2 + (False,)


def test_defaults_normalisation_and_immutability():
    options = GenerateOptions(max_tokens=8, stop_token_ids=[2, 13], mode="Colocated")
    assert options.stop_token_ids == (2, 13) and options.mode == "colocated"
    assert GenerateOptions(max_tokens=8, stop_token_ids=(t for t in [7])).stop_token_ids == (7,)
    assert (options.temperature, options.top_k, options.top_p, options.seed) == (0.0, 0, 1.0, None)
    assert (options.tenant, options.deadline_s, options.grpc_timeout_s) == ("", None, None)
    assert GenerateOptions(max_tokens=1, deadline_s=2.5).grpc_timeout_s == 3.5  # the router's error arrives first
    assert hash(options) == hash(GenerateOptions(max_tokens=8, stop_token_ids=(2, 13), mode="colocated"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.max_tokens = 9
    with pytest.raises(TypeError):
        GenerateOptions(8)  # keyword only: a bare number is too easy to misread
    with pytest.raises(TypeError):
        GenerateOptions()


def test_resolve_options_lays_keywords_over_options():
    base = GenerateOptions(max_tokens=8, seed=1, tenant="acme")
    assert resolve_options(base, {}) is base
    assert resolve_options(base, {"seed": 2}) == dataclasses.replace(base, seed=2)
    assert resolve_options(None, {"max_tokens": 3}) == GenerateOptions(max_tokens=3)
    with pytest.raises(InvalidArgumentError, match="top_p must be"):
        resolve_options(base, {"top_p": 0})  # an override is validated like a field
    with pytest.raises(TypeError, match="max_token"):
        resolve_options(None, {"max_token": 3})
    with pytest.raises(TypeError, match="needs max_tokens"):
        resolve_options(None, {"seed": 3})
    with pytest.raises(TypeError, match="GenerateOptions, got dict"):
        resolve_options({"max_tokens": 3}, {})


def test_options_and_keywords_encode_the_same_request(fake, client):
    fake.script = [started(), complete(0)]
    options = GenerateOptions(max_tokens=9, temperature=0.7, top_k=40, top_p=0.9, seed=0, stop_token_ids=[2, 13],
                              ignore_eos=True, mode="colocated", tenant="acme", slo_ttft_ms=250, slo_tpot_ms=30,
                              request_id="req-1", deadline_s=1.5)
    client.generate_full(prompt_ids=[3, 4, 5], options=options)
    client.generate_full(prompt_ids=[3, 4, 5], **dataclasses.asdict(options))
    client.generate_full(prompt_ids=[3, 4, 5], options=options, seed=7, request_id="req-2")
    by_options, by_keywords, overridden = fake.requests
    assert by_options == by_keywords
    assert (by_options.max_tokens, by_options.mode, by_options.deadline_ms) == (9, router_pb2.MODE_COLOCATED, 1500)
    assert (overridden.sampling.seed, overridden.request_id, overridden.tenant) == (7, "req-2", "acme")


def test_bad_options_fail_before_anything_is_sent(fake, client):
    with pytest.raises(TypeError, match="temprature"):
        client.generate(prompt="x", max_tokens=4, temprature=0.5)
    with pytest.raises(ValueError, match="top_p must be"):
        client.generate(prompt="x", options=GenerateOptions(max_tokens=4), top_p=2.0)
    assert fake.requests == []


def test_async_client_takes_options(fake, addr):
    fake.script = [started(), complete(0)]

    async def run():
        async with AsyncClient(addr, timeout_s=5) as c:
            await c.generate_full(prompt="x", options=GenerateOptions(max_tokens=5, tenant="t", seed=3))
            with pytest.raises(InvalidArgumentError, match="mode must be"):
                c.generate(prompt="x", max_tokens=5, mode="sideways")

    asyncio.run(run())
    (request,) = fake.requests
    assert (request.max_tokens, request.tenant, request.sampling.seed) == (5, "t", 3)


def test_pdctl_has_a_flag_for_every_option():
    args = build_parser().parse_args(["generate", "--prompt", "x", "--max-tokens", "2"])
    assert OPTION_NAMES <= set(vars(args)), OPTION_NAMES - set(vars(args))
    assert GenerateOptions(**{name: getattr(args, name) for name in OPTION_NAMES}) == GenerateOptions(max_tokens=2)


def test_logprobs_go_out_in_the_sampling_and_come_back_on_each_token(fake, client):
    lp = common_pb2.TokenLogprobs(logprob=-0.5, top_token_ids=[7, 3], top_logprobs=[-0.25, -0.5])
    fake.script = [started(), Event(token=Event.Token(index=0, token_id=3, logprobs=lp)), token(1, 9), complete(2)]
    events = list(client.generate(prompt_ids=[1, 2], max_tokens=2, logprobs=2))
    assert events[0].logprobs == TokenLogprobs(-0.5, ((7, -0.25), (3, -0.5))) and events[1].logprobs is None
    client.generate_full(prompt_ids=[1, 2], max_tokens=2)
    asked, unasked = fake.requests
    assert asked.sampling.HasField("logprobs") and asked.sampling.logprobs == 2
    assert not unasked.sampling.HasField("logprobs")
