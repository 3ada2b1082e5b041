"""The HTTP front's cost: TTFT through the OpenAI-compatible front against the gRPC front
(docs/design.md, "The HTTP front"), on one local cluster.

One cluster (--model, 1 prefill + 1 decode, secure: mutual TLS on gRPC, HTTPS and an API key
on HTTP). Both fronts get the same request, a --prompt-tokens prompt as token ids (the same
ids on both: no tokenizer in the difference), --max-tokens, streaming, colocated (--mode):
gRPC through a pd.v1 Router stub on one channel, HTTP as `POST /v1/completions` with
`stream: true` on one kept-alive httpx2 connection, and the official `openai` client (what
users run; its own parsing counts). After --warmup each, --requests rounds; each round sends
one of each, in an order that rotates; each prompt is fresh (no prefix reuse). Client TTFT:
from the call to the first token (a gRPC Token event; the first SSE chunk with text, or
with its first choice for openai). Medians and p90; added = median(HTTP) - median(gRPC),
also the median of the per-round differences; ratio = HTTP / gRPC; the router's own
TTFT (its Complete event / the `x-pdserve-ttft-ms` header) for both, which places the
difference in front of the router's request path or inside it.

Target: added TTFT at most 1 ms at the median (httpx2), on this machine.

JSON lines: {"bench": "openai_front", "metric": "config" | "ttft" | "ttft_added", ...}.
"""

from __future__ import annotations

import argparse
import json
import random
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx2
import openai

from pdserve_client.rpc.pd.v1 import common_pb2, router_pb2, router_pb2_grpc
from tooling.cluster.launcher import ClusterSpec, LocalCluster

TARGET_ADDED_MS = 1.0


def emit(**row) -> None:
    print(json.dumps({"bench": "openai_front", **row}), flush=True)


class Fronts:
    """The three clients of one cluster, each timing one request to its first token."""

    def __init__(self, cluster: LocalCluster, args):
        self.args = args
        ca = ssl.create_default_context(cafile=str(cluster.tls_dir / "ca.crt"))
        self.channel = cluster.identity("client").channel(cluster.router_address, "router")
        self.stub = router_pb2_grpc.RouterStub(self.channel)
        self.http = httpx2.Client(base_url=cluster.http_url, verify=ca, timeout=60,
                                  headers={"Authorization": f"Bearer {cluster.api_key}"})
        self.sdk = openai.OpenAI(base_url=cluster.http_url, api_key=cluster.api_key, max_retries=0,
                                 http_client=openai.DefaultHttpxClient(verify=ca))
        self.mode = args.mode

    def grpc(self, prompt: list[int]) -> tuple[float, float]:
        req = router_pb2.GenerateRequest(prompt_token_ids=common_pb2.TokenIds(ids=prompt),
                                         max_tokens=self.args.max_tokens,
                                         mode=router_pb2.Mode.Value(f"MODE_{self.mode.upper()}"),
                                         sampling=common_pb2.SamplingParams(ignore_eos=True))
        t0, first = time.perf_counter(), None
        server = 0.0
        for event in self.stub.Generate(req, timeout=60):
            kind = event.WhichOneof("event")
            if kind == "token" and first is None:
                first = time.perf_counter()
            elif kind == "complete":
                server = event.complete.ttft_ms
        return (first - t0) * 1000, server

    def _body(self, prompt: list[int]) -> dict:
        return {"model": self.args.model, "prompt": prompt, "max_tokens": self.args.max_tokens, "stream": True,
                "temperature": 0, "ignore_eos": True, "mode": self.mode}

    def httpx(self, prompt: list[int]) -> tuple[float, float]:
        t0, first = time.perf_counter(), None
        with self.http.stream("POST", "/completions", json=self._body(prompt)) as r:
            r.raise_for_status()
            server = float(r.headers["x-pdserve-ttft-ms"])
            for line in r.iter_lines():
                if first is None and line.startswith("data: {"):
                    first = time.perf_counter()
        return (first - t0) * 1000, server

    def openai(self, prompt: list[int]) -> tuple[float, float]:
        t0, first = time.perf_counter(), None
        body = self._body(prompt)
        extra = {k: body[k] for k in ("ignore_eos", "mode")}
        raw = self.sdk.completions.with_raw_response.create(model=self.args.model, prompt=prompt,
                                                            max_tokens=self.args.max_tokens, stream=True,
                                                            temperature=0, extra_body=extra)
        server = float(raw.headers["x-pdserve-ttft-ms"])
        for chunk in raw.parse():
            if first is None and chunk.choices:
                first = time.perf_counter()
        return (first - t0) * 1000, server

    def close(self) -> None:
        self.channel.close()
        self.http.close()


def _summary(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"median_ms": round(statistics.median(xs), 3), "p90_ms": round(xs[int(0.9 * (len(xs) - 1))], 3),
            "n": len(xs)}


def run(args) -> None:
    state = tempfile.mkdtemp(prefix="pd-bench-front-")
    cluster = LocalCluster(ClusterSpec(prefill=1, decode=1, model=args.model, mode=args.mode, state_dir=state,
                                       traces=False))
    cluster.up()
    try:
        fronts = Fronts(cluster, args)
        names = ("grpc", "httpx", "openai")
        rng = random.Random(7)
        emit(metric="config", model=args.model, prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens,
             mode=args.mode, requests=args.requests, warmup=args.warmup, target_added_ms=TARGET_ADDED_MS)
        times: dict[str, list[float]] = {n: [] for n in names}
        server: dict[str, list[float]] = {n: [] for n in names}
        for i in range(args.warmup + args.requests):
            order = names[i % 3:] + names[:i % 3]
            for name in order:
                prompt = [rng.randrange(3, 500) for _ in range(args.prompt_tokens)]
                client_ms, server_ms = getattr(fronts, name)(prompt)
                if i >= args.warmup:
                    times[name].append(client_ms)
                    server[name].append(server_ms)
        fronts.close()
        for name in names:
            emit(metric="ttft", front=name, **_summary(times[name]),
                 router_ttft_median_ms=round(statistics.median(server[name]), 3))
        base = statistics.median(times["grpc"])
        for name in ("httpx", "openai"):
            added = statistics.median(times[name]) - base
            paired = statistics.median(a - b for a, b in zip(times[name], times["grpc"]))
            emit(metric="ttft_added", front=name, added_ms=round(added, 3), paired_added_ms=round(paired, 3),
                 ratio=round(statistics.median(times[name]) / base, 3),
                 router_added_ms=round(statistics.median(server[name]) - statistics.median(server["grpc"]), 3),
                 target_ms=TARGET_ADDED_MS if name == "httpx" else None,
                 met=(added <= TARGET_ADDED_MS) if name == "httpx" else None)
    finally:
        cluster.down()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--mode", default="colocated", choices=("colocated", "disaggregated"))
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=2)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    run(ap.parse_args())


if __name__ == "__main__":
    main()
