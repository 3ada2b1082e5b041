"""The OpenAI-compatible front on a real local cluster (router/http; docs/design.md, "The
HTTP front"), driven by the official `openai` package over HTTPS with the cluster's CA
and an API key `pdserve up` made: text in and text out, the same text and logprobs
disaggregated and colocated, a stop string, usage, a cancelled stream, a client's traceparent and
x-request-id, and bad input that gets its status and message and leaks nothing."""

from __future__ import annotations

import contextlib
import json
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time

import httpx2
import openai
import pytest

from pdserve_client import spans as S
from pdserve_ops import trace_view
from router.requests.text import load_tokenizer
from runtime.engine.checkpoint import export_preset
from tests.support.cluster import assert_cluster_clean, client, start_cluster
from tooling.cluster.launcher import REPO_ROOT

MODEL = "tiny"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # One waiter per tenant in the admission queue, and 64 blocks (1,024 tokens) a worker:
    # two long requests fill the decode worker and its queue, so a third is refused 429.
    c = start_cluster(tmp_path_factory.mktemp("openai"), prefill=1, decode=1, num_blocks=64,
                      env={"PD_ROUTER_QUEUE_PER_TENANT": "1"})
    yield c
    c.down()


def _ca(cluster) -> str:
    return str(cluster.tls_dir / "ca.crt")


def _tls(cluster) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=_ca(cluster))


def sdk(cluster, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.http_url, api_key=key or cluster.api_key, max_retries=0, timeout=60,
                         http_client=openai.DefaultHttpxClient(verify=_tls(cluster)))


def _post(cluster, path: str, body: bytes, key: str | None = None, **headers) -> httpx2.Response:
    headers = {"Content-Type": "application/json", **headers}
    if key != "":
        headers["Authorization"] = f"Bearer {key or cluster.api_key}"
    return httpx2.post(cluster.http_url + path, content=body, headers=headers, verify=_tls(cluster), timeout=60)


PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,", "日本語のテキストも大丈夫 ✓",
           "def fibonacci(n):\n    return"]


@pytest.mark.parametrize("temperature, seed", [(0.0, None), (1.0, 1234)])
def test_a_text_prompt_gives_the_same_text_disaggregated_and_colocated(cluster, temperature, seed):
    c = sdk(cluster)
    for prompt in PROMPTS:
        texts, logprobs = {}, {}
        for mode in ("disaggregated", "colocated"):
            raw = c.completions.with_raw_response.create(
                model=MODEL, prompt=prompt, max_tokens=16, temperature=temperature, seed=seed, logprobs=5,
                extra_body={"mode": mode, "ignore_eos": True})
            assert raw.headers["x-pdserve-route"] == mode
            choice = raw.parse().choices[0]
            texts[mode], logprobs[mode] = choice.text.encode(), choice.logprobs.model_dump()
        assert texts["disaggregated"] == texts["colocated"], prompt
        assert logprobs["disaggregated"] == logprobs["colocated"], prompt  # the same floats, every one
    messages = [{"role": "user", "content": PROMPTS[1]}]
    chats = {mode: c.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, seed=seed,
                                             temperature=temperature, extra_body={"mode": mode, "ignore_eos": True})
             for mode in ("disaggregated", "colocated")}
    assert chats["disaggregated"].choices[0].message.content == chats["colocated"].choices[0].message.content
    assert_cluster_clean(cluster)


def test_http_and_grpc_fronts_give_the_same_tokens(cluster):
    """One request path behind both fronts: the text the front returns is the text of the
    tokens the gRPC front gives for the same text prompt."""
    out = sdk(cluster).completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=0,
                                          extra_body={"ignore_eos": True})
    with client(cluster) as grpc_client:
        res = grpc_client.generate_full(PROMPTS[0], max_tokens=12, ignore_eos=True)
    assert out.usage.completion_tokens == len(res.token_ids)
    # Both end as the whole output's decoding does (Complete.text_tail: the bytes of a
    # character no later token completed, which the pieces held back).
    assert out.choices[0].text == res.text == load_tokenizer(MODEL).decode(res.token_ids, skip_special_tokens=True)


def test_streamed_chat_with_usage_and_a_stop_string(cluster):
    c = sdk(cluster)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count to ten."}]
    whole = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0].message.content
    chunks = list(c.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == whole
    assert chunks[-1].usage.completion_tokens == 24 and chunks[-1].usage.prompt_tokens > 0
    stop = next(whole[i:i + 3] for i in range(4, len(whole) - 3) if whole[i:i + 3].strip())
    cut = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True})
    assert cut.choices[0].message.content == whole[:whole.index(stop)]
    assert cut.choices[0].finish_reason == "stop" and cut.usage.completion_tokens < 24
    assert_cluster_clean(cluster)


def test_a_cancelled_stream_gives_every_block_back(cluster):
    stream = sdk(cluster).completions.create(model=MODEL, prompt="x " * 100, max_tokens=400, stream=True,
                                             extra_body={"ignore_eos": True, "mode": "disaggregated"})
    next(iter(stream))
    stream.close()
    assert_cluster_clean(cluster)


def test_traceparent_and_request_id_are_honoured(cluster):
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    request_id = "http-" + secrets.token_hex(6)
    r = _post(cluster, "/completions", json.dumps({"model": MODEL, "prompt": "traced", "max_tokens": 4}).encode(),
              **{"traceparent": f"00-{trace_id}-{span_id}-01", "x-request-id": request_id})
    assert r.status_code == 200 and r.headers["x-request-id"] == request_id and r.json()["id"] == "cmpl-" + request_id
    traces, _ = trace_view.wait_for(cluster.state / S.SPANS_FILE, request_id, wait_s=20,
                                    expect=("pdserve-router",))
    (trace,) = traces
    assert trace.trace_id == trace_id
    (http_span,) = [s for s in trace.spans if s.name == "POST /v1/completions"]
    assert http_span.parent_id == span_id


@pytest.mark.parametrize("body, status, says", [
    (b"{\"model\": \"tiny\", \"prompt\": ", 400, "not valid JSON"),
    (b'{"model": "tiny", "prompt": "x", "max_tokens": "lots"}', 400, "max_tokens"),
    (b'{"model": "tiny", "prompt": "x", "temperature": NaN}', 400, "finite number"),
    (b'{"model": "tiny", "prompt": "x", "n": 3}', 400, "n"),
    (b'{"model": "gpt-4o", "prompt": "x"}', 404, "gpt-4o"),
    (b'{"model": "tiny", "prompt": "x", "tenant": "someone-else"}', 403, "tenant"),
    (json.dumps({"model": "tiny", "prompt": list(range(3, 2100))}).encode(), 413, "prompt is"),
    (json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 4000}).encode(), 400, "max_model_len"),
    (b'{"model": "tiny", "messages": []}', 400, "messages"),
])
def test_bad_input_gets_its_status_and_leaks_nothing(cluster, body, status, says):
    path = "/chat/completions" if b"messages" in body else "/completions"
    r = _post(cluster, path, body)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]["message"], r.text
    assert_cluster_clean(cluster)


def test_a_full_admission_queue_is_429_with_retry_after_and_a_deadline_504(cluster):
    """With the openai package: a request that fills the decode worker streams; a second
    waits in its tenant's queue (one place); a third is refused 429 with Retry-After. A
    request whose deadline passes before it ends is 504; nothing is held after."""
    c = sdk(cluster)
    long = {"model": MODEL, "prompt": [7] * 16, "max_tokens": 1000, "stream": True,
            "extra_body": {"ignore_eos": True, "mode": "colocated"}}
    first = c.completions.create(**long)
    next(iter(first))
    second = threading.Thread(target=lambda: _drain_quietly(c, long), daemon=True)
    second.start()
    deadline = time.monotonic() + 10
    while _queued(cluster) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(openai.RateLimitError) as refused:
        c.completions.create(model=MODEL, prompt=[8] * 16, max_tokens=8, extra_body={"mode": "colocated"})
    assert refused.value.response.headers["retry-after"] == "1" and "queue" in refused.value.message
    first.close()
    second.join(30)
    with pytest.raises(openai.APIStatusError) as late:
        c.completions.create(model=MODEL, prompt=[9] * 16, max_tokens=900,
                             extra_body={"ignore_eos": True, "mode": "colocated", "deadline_ms": 300})
    assert late.value.status_code == 504 and "deadline" in late.value.message
    assert_cluster_clean(cluster)


def _drain_quietly(c: openai.OpenAI, request: dict) -> None:
    with contextlib.suppress(openai.OpenAIError):
        for _ in c.completions.create(**request):
            pass


def _queued(cluster) -> float:
    """Requests waiting in the router's admission queue (its /metrics)."""
    from tests.support.metrics import scrape_process

    return scrape_process(cluster, "router").value("pd_admission_queue_depth")


def test_a_missing_or_wrong_key_is_401(cluster):
    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 2}).encode()
    assert _post(cluster, "/completions", body, key="").status_code == 401
    assert _post(cluster, "/completions", body, key="pds-forged").status_code == 401
    with pytest.raises(openai.AuthenticationError):
        sdk(cluster, key="pds-forged").models.list()


def test_a_100mb_body_is_refused_413_before_it_is_read(cluster):
    host, port = cluster.http_address.split(":")
    ctx = ssl.create_default_context(cafile=_ca(cluster))
    with socket.create_connection((host, int(port)), timeout=30) as raw, \
            ctx.wrap_socket(raw, server_hostname=host) as tls:
        tls.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {cluster.api_key}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {100 << 20}\r\n\r\n".encode())
        tls.sendall(b"{" + b" " * (1 << 20))
        reply = b""
        while b"}}" not in reply:  # the JSON error body ends the reply (it may come in a later record)
            more = tls.recv(65536)
            if not more:
                break
            reply += more
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b"at most" in reply, reply
    assert_cluster_clean(cluster)


def test_models_lists_the_served_model_with_its_cache_abi(cluster):
    models = sdk(cluster).models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].model_extra["cache_abi_digests"] and models[0].model_extra["max_model_len"] > 0
    ready = httpx2.get(cluster.http_url.removesuffix("/v1") + "/ready", verify=_tls(cluster))
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


def test_a_key_created_with_the_cli_works_within_a_second(cluster):
    out = subprocess.run([sys.executable, "-m", "tooling.cli", "api-key", "create", "acme", "--state-dir",
                          str(cluster.state)], capture_output=True, text=True, check=True)
    key = out.stdout.strip()
    assert key.startswith("pds-") and key not in (cluster.state / "api-keys").read_text()
    time.sleep(1.2)
    ok = sdk(cluster, key=key).completions.create(model=MODEL, prompt="x", max_tokens=2,
                                                  extra_body={"tenant": "acme"})
    assert ok.usage.completion_tokens == 2


def test_the_sdk_sees_each_refusal_as_its_own_error_class(cluster):
    """400, 403, 404 and 413 as the openai package raises them: its error classes, the
    field named, the message saying what was wrong; nothing held after."""
    c = sdk(cluster)
    cases = [
        (openai.BadRequestError, dict(model=MODEL, prompt="x", max_tokens=2, n=2), "n"),
        (openai.BadRequestError, dict(model=MODEL, prompt="x", max_tokens=2, logprobs=99), "logprobs"),
        (openai.PermissionDeniedError, dict(model=MODEL, prompt="x", max_tokens=2, extra_body={"tenant": "else"}),
         "tenant"),
        (openai.NotFoundError, dict(model="gpt-4o", prompt="x", max_tokens=2), "model"),
        (openai.APIStatusError, dict(model=MODEL, prompt=list(range(3, 2100)), max_tokens=2), "prompt"),
    ]
    for error, kwargs, param in cases:
        with pytest.raises(error) as raised:
            c.completions.create(**kwargs)
        assert raised.value.body["param"] == param, raised.value.body
    assert raised.value.status_code == 413
    assert_cluster_clean(cluster)


LOADGEN = REPO_ROOT / ".venv-loadgen"


@pytest.mark.skipif(not (LOADGEN / "bin" / "aiperf").exists(),
                    reason="no .venv-loadgen: `make loadgen-env` installs AIPerf (`make test` does)")
def test_an_open_source_load_generator_runs_clean_against_the_front(cluster, tmp_path):
    """AIPerf (bench/loadgen.py), which knows nothing of pdserve, over HTTPS with the
    cluster's CA and key, both endpoints streamed: every request served, its counts the
    server's, and no block left held."""
    tokenizer = export_preset(MODEL, tmp_path / "ckpt")
    out = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "loadgen.py"), "--base-url", cluster.http_url,
                          "--api-key", cluster.api_key, "--ca", _ca(cluster), "--tokenizer", str(tokenizer),
                          "--model", MODEL, "--concurrency", "2", "--requests", "8", "--prompt-tokens", "48",
                          "--output-tokens", "8", "--out", str(tmp_path), "--artifacts", str(tmp_path / "art")],
                         capture_output=True, text=True, timeout=600)
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0 and summary["ok"], (summary, out.stderr[-2000:])
    for endpoint in ("completions", "chat"):
        assert summary[endpoint]["requests"] == 8 and summary[endpoint]["errors"] == 0
        assert summary[endpoint]["output_tokens_per_request"] == 8
    assert_cluster_clean(cluster)


def test_no_decode_worker_is_503_and_not_ready(cluster):
    """Last in this module: its decode worker killed, the front answers 503 with Retry-After
    once the directory drops it, and /ready says why."""
    cluster.signal("decode-0", signal.SIGKILL)
    ready = httpx2.Response(200)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        ready = httpx2.get(cluster.http_url.removesuffix("/v1") + "/ready", verify=_tls(cluster))
        if ready.status_code == 503:
            break
        time.sleep(0.3)
    assert ready.status_code == 503 and "no decode-capable worker" in ready.json()["reason"], ready.text
    with pytest.raises(openai.InternalServerError) as refused:
        sdk(cluster).completions.create(model=MODEL, prompt="x", max_tokens=2)
    assert refused.value.status_code == 503 and refused.value.response.headers["retry-after"] == "1"
