"""The OpenAI-compatible front, driven by the official `openai` client: completions and
chat, streamed and not, stop strings, usage, cancellation, and each error status with a
message saying what was wrong (tests/e2e/test_openai_front.py runs it on a real cluster)."""

from __future__ import annotations

import json

import httpx2
import openai
import pytest

from router.requests.text import load_tokenizer
from tests.support.orchestrator import assert_no_leaks

from .conftest import MODEL

TOK = load_tokenizer(MODEL)


def _text_of(prompt: list[int], n: int) -> str:
    from tests.support.orchestrator import model_tokens

    return TOK.decode(model_tokens(prompt, n), skip_special_tokens=True)


def test_a_completion_gives_the_models_text_usage_and_the_route(served):
    raw = served.client().completions.with_raw_response.create(model=MODEL, prompt="Hello there", max_tokens=6,
                                                              extra_body={"mode": "colocated"})
    out = raw.parse()
    prompt = TOK.encode("Hello there").ids
    assert out.choices[0].text == _text_of(prompt, 6)
    assert out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == \
        (len(prompt), 6, len(prompt) + 6)
    assert raw.headers["x-pdserve-route"] == "colocated" and float(raw.headers["x-pdserve-ttft-ms"]) > 0
    assert out.id == "cmpl-" + raw.headers["x-request-id"] and out.model == MODEL
    served.wait_idle()
    assert_no_leaks(served.orch, served.fake)


def test_streamed_pieces_add_up_to_the_whole_answer_and_usage_comes_last(served):
    client = served.client()
    whole = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=8).choices[0].text
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon", max_tokens=8, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == 8
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_renders_the_template_and_streams_deltas(served):
    client = served.client()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=5)
    assert whole.choices[0].message.role == "assistant" and whole.object == "chat.completion"
    assert whole.usage.completion_tokens == 5
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content


def test_a_stop_string_ends_the_text_before_it_and_frees_everything(served):
    client = served.client()
    full = client.completions.create(model=MODEL, prompt="abc", max_tokens=12).choices[0].text
    stop = next(full[i:i + 2] for i in range(2, len(full) - 1) if full[i:i + 2].strip())
    for stream in (False, True):
        if stream:
            text = "".join(c.choices[0].text for c in client.completions.create(
                model=MODEL, prompt="abc", max_tokens=12, stop=[stop], stream=True))
        else:
            out = client.completions.create(model=MODEL, prompt="abc", max_tokens=12, stop=stop)
            text = out.choices[0].text
            assert out.choices[0].finish_reason == "stop"
        assert text == full[:full.index(stop)], (stop, full)
    served.wait_idle()
    assert_no_leaks(served.orch, served.fake)


def test_chat_template_kwargs_cannot_override_the_messages(served):
    err = _status(lambda: served.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
        extra_body={"chat_template_kwargs": {"messages": []}}))
    assert err.status_code == 400 and err.body["param"] == "chat_template_kwargs"
    err = _status(lambda: served.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        max_tokens=2))
    assert err.status_code == 400 and "image_url" in err.body["message"]


def test_echo_puts_the_prompt_first(served):
    out = served.client().completions.create(model=MODEL, prompt="Echo me", max_tokens=3, echo=True)
    assert out.choices[0].text.startswith("Echo me")


def test_a_client_that_leaves_mid_stream_cancels_its_request(served):
    served.fake.token_gap_s = 0.05
    stream = served.client().completions.create(model=MODEL, prompt="long one", max_tokens=200, stream=True)
    next(iter(stream))
    assert served.orch.in_flight == 1
    stream.close()
    served.wait_idle()
    assert_no_leaks(served.orch, served.fake)
    assert served.fake.ops("cancel_decode"), "the decode worker was told to stop"


def _status(fn) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as err:
        fn()
    return err.value


def test_completion_logprobs_come_per_token_with_offsets_streamed_or_whole(served):
    client = served.client()
    whole = client.completions.create(model=MODEL, prompt=[3, 4, 5], max_tokens=5, logprobs=3,
                                      extra_body={"mode": "colocated"})
    lp = whole.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert all(len(top) <= 3 for top in lp.top_logprobs) and lp.text_offset[0] == 0
    assert all(isinstance(v, float) and v <= 0 for v in lp.token_logprobs)
    streamed = [c.choices[0].logprobs for c in client.completions.create(
        model=MODEL, prompt=[3, 4, 5], max_tokens=5, logprobs=3, stream=True, extra_body={"mode": "colocated"})
        if c.choices[0].logprobs]
    assert [v for c in streamed for v in c.token_logprobs] == lp.token_logprobs


def test_chat_logprobs_need_logprobs_true_and_give_tokens_with_bytes(served):
    client = served.client()
    messages = [{"role": "user", "content": "hi"}]
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, logprobs=True,
                                         top_logprobs=2)
    content = out.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) <= 2 for c in content)
    assert all(c.bytes == list(c.token.encode()) for c in content)
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    assert plain.choices[0].logprobs is None
    err = _status(lambda: client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4,
                                                         top_logprobs=2))
    assert err.status_code == 400 and "top_logprobs needs logprobs" in err.body["message"]


@pytest.mark.parametrize("kwargs, param", [
    ({"n": 2}, "n"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"seed": -3}, "seed"),
    ({"logprobs": 21}, "logprobs"),
    ({"stop": [""]}, "stop"),
    ({"extra_body": {"mode": "sideways"}}, "mode"),
    ({"extra_body": {"priority": 10**6}}, "priority"),
    ({"extra_body": {"stream": "yes"}}, "stream"),
    ({"stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
])
def test_a_bad_parameter_is_a_400_naming_it(served, kwargs, param):
    err = _status(lambda: served.client().completions.create(model=MODEL, prompt="x", **{"max_tokens": 2, **kwargs}))
    assert err.status_code == 400 and err.body["param"] == param, err.body
    assert param in err.body["message"]


def test_keys_models_and_tenants_get_their_statuses(served):
    assert _status(lambda: served.client(key="pds-not-a-key").models.list()).status_code == 401
    no_key = httpx2.get(served.url + "/models", verify=served.tls)
    assert no_key.status_code == 401 and "Authorization: Bearer" in no_key.json()["error"]["message"]
    assert [m.id for m in served.client().models.list()] == [MODEL]
    err = _status(lambda: served.client().completions.create(model="gpt-5", prompt="x", max_tokens=2))
    assert err.status_code == 404 and "gpt-5" in err.body["message"] and err.body["param"] == "model"
    err = _status(lambda: served.client().completions.create(model=MODEL, prompt="x", max_tokens=2,
                                                             extra_body={"tenant": "globex"}))
    assert err.status_code == 403
    ok = served.client(key=served.other_key).completions.create(model=MODEL, prompt="x", max_tokens=2,
                                                                 extra_body={"tenant": "globex"})
    assert ok.usage.completion_tokens == 2


@pytest.mark.parametrize("body, status, says", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b'{"prompt": "x", "temperature": NaN}', 400, "temperature: Input should be a finite number"),
    (b'{"prompt": "x", "temperature": 1e999}', 400, "temperature"),
    (json.dumps({"prompt": "x" * (70 << 10)}).encode(), 413, "at most"),
    (b'{"prompt": []}', 400, "prompt"),
    (b'{"prompt": [[1, 2], [3]]}', 400, "one prompt per request"),
    (b'{"prompt": [1, -4]}', 400, "prompt"),
])
def test_bad_bodies_never_500(served, body, status, says):
    r = httpx2.post(served.url + "/completions", content=body, verify=served.tls,
                    headers={"Authorization": f"Bearer {served.key}", "Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert says in r.json()["error"]["message"]
    served.wait_idle()
    assert_no_leaks(served.orch, served.fake)


def test_a_prompt_over_the_models_length_is_413_and_too_many_tokens_400(served):
    client = served.client()
    err = _status(lambda: client.completions.create(model=MODEL, prompt=list(range(3, 300)), max_tokens=2))
    assert err.status_code == 413 and "256" in err.body["message"]
    err = _status(lambda: client.completions.create(model=MODEL, prompt=[5] * 250, max_tokens=100))
    assert err.status_code == 400 and "max_model_len" in err.body["message"]


def test_chat_without_max_tokens_may_fill_the_model(served):
    out = served.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                  extra_body={"ignore_eos": True})
    assert out.usage.prompt_tokens + out.usage.completion_tokens == 256


def test_no_worker_is_503_with_retry_after(tmp_path):
    from tests.support.orchestrator import FakeCluster

    from .conftest import Served

    s = Served(FakeCluster([]), tmp_path)
    try:
        err = _status(lambda: s.client().completions.create(model=MODEL, prompt=[1, 2], max_tokens=2))
        assert err.status_code == 503 and err.response.headers["retry-after"] == "1"
        ready = httpx2.get(s.url.removesuffix("/v1") + "/ready", verify=s.tls)
        assert ready.status_code == 503 and "no decode-capable worker" in ready.json()["reason"]
    finally:
        s.close()


def test_a_deadline_passed_is_504(served):
    served.fake.token_gap_s = 0.2
    err = _status(lambda: served.client().completions.create(model=MODEL, prompt="slow", max_tokens=50,
                                                             extra_body={"deadline_ms": 100}))
    assert err.status_code == 504, err.body
    served.wait_idle()
    assert_no_leaks(served.orch, served.fake)


def test_health_and_ready_need_no_key(served):
    base = served.url.removesuffix("/v1")
    assert httpx2.get(base + "/health", verify=served.tls).json() == {"status": "ok"}
    ready = httpx2.get(base + "/ready", verify=served.tls)
    assert ready.status_code == 200 and ready.json()["decode_workers"] == 2


def test_the_listener_turns_nagle_off_for_every_connection():
    """asyncio disables Nagle only on sockets whose proto is IPPROTO_TCP; the front's own
    socket must say so, or each SSE chunk waits for the client's delayed ACK (~40 ms)."""
    import socket

    from router.http.server import _bind

    sock = _bind("127.0.0.1:0")
    try:
        assert sock.proto == socket.IPPROTO_TCP
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        sock.close()


def test_insecure_the_front_is_plain_http_and_the_body_names_the_tenant(tmp_path):
    """PD_INSECURE: no TLS, no key; the request's own `tenant` decides, as on the gRPC front."""
    from tests.support.orchestrator import two_by_two

    from .conftest import Served

    s = Served(two_by_two(), tmp_path, secure=False)
    try:
        assert s.url.startswith("http://")
        r = httpx2.post(s.url + "/completions", json={"prompt": [1, 2, 3], "max_tokens": 2, "tenant": "zeta",
                                                      "mode": "colocated"})
        assert r.status_code == 200, r.text
        assert s.orch.generations.last_of("zeta", r.headers["x-request-id"]) == 1
        s.wait_idle()
        assert_no_leaks(s.orch, s.fake)
    finally:
        s.close()


def test_every_response_is_counted_by_endpoint_and_status(served):
    def count(endpoint: str, status: str) -> float:
        return served.orch.metrics.registry.get_sample_value(
            "pd_http_responses_total", {"endpoint": endpoint, "status": status}) or 0.0

    served.client().completions.create(model=MODEL, prompt=[1, 2], max_tokens=2)
    _status(lambda: served.client(key="pds-nope").completions.create(model=MODEL, prompt=[1], max_tokens=2))
    nowhere = httpx2.get(served.url.removesuffix("/v1") + "/nowhere", verify=served.tls)
    assert nowhere.json()["error"]["message"] == "GET /nowhere: Not Found"
    wrong = httpx2.get(served.url + "/completions", verify=served.tls)
    assert wrong.status_code == 405 and "Method Not Allowed" in wrong.json()["error"]["message"]
    assert count("/v1/completions", "200") == 1 and count("/v1/completions", "401") == 1
    assert count("other", "404") == 1


def test_a_model_is_retrieved_by_name(served):
    assert served.client().models.retrieve(MODEL).id == MODEL
    assert _status(lambda: served.client().models.retrieve("llama-70b")).status_code == 404


def test_cors_only_for_the_origins_configured(tmp_path):
    """A browser page from an allowed origin gets its preflight and the exposed headers;
    another origin, or a front without origins, gets no CORS header (the browser refuses)."""
    from tests.support.orchestrator import two_by_two

    from .conftest import Served

    s = Served(two_by_two(), tmp_path, cors=("https://app.example",))
    try:
        ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
        ok = httpx2.options(s.url + "/completions", verify=s.tls, headers={"Origin": "https://app.example", **ask})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://app.example"
        other = httpx2.options(s.url + "/completions", verify=s.tls, headers={"Origin": "https://evil.example", **ask})
        assert "access-control-allow-origin" not in other.headers
        r = httpx2.post(s.url + "/completions", verify=s.tls, json={"prompt": [1], "max_tokens": 1},
                        headers={"Origin": "https://app.example", "Authorization": f"Bearer {s.key}"})
        assert r.status_code == 200 and "x-pdserve-route" in r.headers["access-control-expose-headers"]
    finally:
        s.close()


def test_no_cors_headers_without_origins(served):
    r = httpx2.options(served.url + "/completions", verify=served.tls,
                       headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in r.headers
