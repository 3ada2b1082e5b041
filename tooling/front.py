"""The local cluster's OpenAI-compatible front, as `pdserve` shows it: its base URL, a
curl line and an `openai` snippet that run as printed, and the demo's text request."""

from __future__ import annotations

import json
import shlex
import ssl
import sys
import time

from tooling.cluster.launcher import API_KEY_FILE, LocalCluster
from tooling.cluster.progress import shown_path

DEMO_MESSAGES = [{"role": "system", "content": "You are a seeded test model: expect noise."},
                 {"role": "user", "content": "Say hello in three languages."}]


def front_line(cluster: LocalCluster) -> str:
    """Where the front listens, beside the router's gRPC address."""
    if not cluster.http_url:
        return f"router: gRPC {cluster.router_address} (no HTTP front)"
    return f"router: gRPC {cluster.router_address} · OpenAI-compatible API {cluster.http_url}"


def _credentials(cluster: LocalCluster) -> tuple[str, str]:
    """(API key file, CA file) as paths shown from here ('' each when insecure)."""
    if cluster.spec.insecure:
        return "", ""
    return shown_path(cluster.state / API_KEY_FILE), shown_path(cluster.tls_dir / "ca.crt")


def curl_line(cluster: LocalCluster) -> str:
    """A streamed chat completion with curl, as a shell runs it from here."""
    key, ca = _credentials(cluster)
    body = json.dumps({"model": cluster.spec.model, "messages": [{"role": "user", "content": "Hello"}],
                       "max_tokens": 12, "stream": True})
    auth = f' --cacert {shlex.quote(ca)} -H "Authorization: Bearer $(cat {shlex.quote(key)})"' if key else ""
    return (f"curl -sN{auth} {cluster.http_url}/chat/completions -H 'Content-Type: application/json' "
            f"-d {shlex.quote(body)}")


def openai_snippet(cluster: LocalCluster) -> str:
    """The same with the official `openai` package, a complete program."""
    key, ca = _credentials(cluster)
    python = shown_path(sys.executable)
    api_key = f"open({key!r}).read().strip()" if key else '"none"'
    http = (f",\n    http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile={ca!r}))"
            if ca else "")
    return (f"{python} - <<'EOF'\nimport openai, ssl\n"
            f"client = openai.OpenAI(base_url={cluster.http_url!r}, api_key={api_key}{http})\n"
            f"out = client.completions.create(model={cluster.spec.model!r}, prompt=\"Once upon a time\", "
            f"max_tokens=12)\nprint(repr(out.choices[0].text), out.usage)\nEOF")


def demo_chat(cluster: LocalCluster, max_tokens: int) -> list[str]:
    """One streamed chat completion through the front with the `openai` package: its text
    as it arrives, then its TTFT and TPOT measured here, at the client."""
    import openai

    key, ca = _credentials(cluster)
    client = openai.OpenAI(base_url=cluster.http_url, api_key=open(key).read().strip() if key else "none",
                           http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=ca))
                           if ca else None, max_retries=0)
    start, times, pieces = time.perf_counter(), [], []
    stream = client.chat.completions.create(model=cluster.spec.model, messages=DEMO_MESSAGES, max_tokens=max_tokens,
                                            stream=True, stream_options={"include_usage": True}, seed=0)
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
        if chunk.choices and chunk.choices[0].delta.content:
            times.append(time.perf_counter())
            pieces.append(chunk.choices[0].delta.content)
    ttft = (times[0] - start) * 1000 if times else 0.0
    tpot = (times[-1] - times[0]) * 1000 / (len(times) - 1) if len(times) > 1 else 0.0
    tokens = usage.completion_tokens if usage else len(times)
    return [f"[http chat    ] {''.join(pieces)!r}",
            f"{'':16}TTFT {ttft:7.1f} ms   TPOT {tpot:6.2f} ms   {tokens} tokens (at the client, over HTTPS)"]


def how_to_call(cluster: LocalCluster) -> str:
    """The demo's lines on the front: curl and openai, as printed they run."""
    return (f"OpenAI-compatible API at {cluster.http_url}; with curl:\n  {curl_line(cluster)}\n"
            f"with the openai package:\n{openai_snippet(cluster)}")
