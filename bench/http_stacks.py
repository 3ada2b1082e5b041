"""HTTP front benchmark: which ASGI server the router's OpenAI-compatible front runs on,
chosen by what it adds to time-to-first-token over the gRPC front.

Target: the HTTP front adds at most 1 ms (`TARGET_ADDED_MS`) to the median TTFT of a
16-token prompt, streaming, over the gRPC front, on this machine.

Run: `.venv/bin/python bench/http_stacks.py` (about 5 minutes on 2 cores; --requests,
--loops, --servers, --apps, --clients narrow it). Results: bench/results/http_stacks.md.

One server process per event loop (--loops: the default asyncio loop, uvloop; grpc.aio
runs under both) hosts, in that ONE loop, as the router would (its gRPC front is grpc.aio
in the loop it serves in):

  grpc       a grpc.aio server on two ports: server TLS (`grpc-tls`) and mutual TLS
             (`grpc-mtls`, what the real gRPC front runs), with two methods: one
             unary-stream generic handler on raw bytes (no proto: the same JSON in and out
             as the HTTP fronts) and pd.v1.Router/Generate (router.proto's events, for the
             SDK below)
  HTTP       POST /v1/completions on every server of --servers, each embedded in the same
             loop and each with every app of --apps, over server TLS:
               uvicorn-httptools  uvicorn.Server(config).serve() as a task (its
                                  capture_signals made a no-op: the host loop owns
                                  SIGTERM), httptools parser
               uvicorn-h11        the same with the pure-Python h11 parser
               hypercorn          hypercorn.asyncio.serve(app, config, shutdown_trigger=...)
               granian            granian.server.embed.Server (marked experimental
                                  upstream): its Rust runtime does I/O, HTTP and TLS on its
                                  own thread and schedules the app on this loop
             apps: `starlette` (a Route, request.json(), StreamingResponse), `raw` (a bare
             ASGI callable that sends the same bytes with no response classes) and
             `starlette-asgi` (Starlette's app and router, that callable as the endpoint)

Every front reads the ~16-token prompt's JSON body (165 bytes), parses it with json, and
streams --events OpenAI completion chunks (built per event with json.dumps): the first at
once, the next ones --gap-ms apart (a stand-in for decode steps: the first event must be
flushed on its own), then, over HTTP, `data: [DONE]` (gRPC ends the stream instead). One
throwaway CA per run (P-256, as runtime/security/pki.py), TLS 1.3 everywhere. The servers'
idle keep-alive is raised to KEEP_ALIVE_S (uvicorn's and hypercorn's default is 5 s).

The client (this process, the default asyncio loop) keeps one persistent connection per
series (loop x front x client) and times each request from the call to the first event in
hand. gRPC: `grpc.aio` (a bare channel: the first message; on both ports) and `pdserve-sdk`
(pdserve's AsyncClient on grpc-mtls: the first TokenEvent, protobuf and all). HTTP, each
client of --clients: `httpx2` (the HTTP client the openai SDK is built on; the bytes up to
the first blank line), `aiohttp` (the same), `raw` (a prebuilt HTTP/1.1 request on an
asyncio TLS stream: the least a client can add, so the rest is the server's) and `openai`
(AsyncOpenAI.completions.create(stream=True), the first parsed chunk: what a user of the
front sees). After --warmup rounds, --requests rounds; in each round every series makes one
request, in a fresh random order (noise and position spread over all of them). With --pin
the server processes run on core 0 and the client on core 1 (sched_setaffinity, before any
thread starts); the default leaves placement to the scheduler (measured: pinning did not
steady anything here, and under another job's load it widened the tails).

Per series: median, p90 and max TTFT, the median of the whole stream. HTTP series:
added_ms = median - the median of grpc-tls by grpc.aio on the same server loop (the same
TLS, a bare client on each side: the fronts' difference), also the median of the per-round
differences (`added_paired_ms`), ratio = median / that median, `met` = added_ms <=
TARGET_ADDED_MS; `added_vs_mtls_ms` against grpc-mtls, and `added_vs_sdk_ms` against
pdserve-sdk (for the `openai` client: what a user sees, SDK against SDK).

Paired, in the same run (--pair-requests x --pair-passes pairs per HTTP series, 0 to
skip): each HTTP series against its baseline alone, in blocks of pairs (which goes first
alternates): the openai SDK against pdserve-sdk, every other client against grpc.aio on
grpc-tls. The interleaved part runs every stack in turn (a gRPC request comes 6 times in
100); here each request follows the other stack's half of the time, so what a gRPC call
leaves behind (measured: a raw HTTP request right after a grpc.aio call took 0.36 ms against
0.18 after another HTTP request) lands on the HTTP side as it would in a router serving both
fronts in one loop. Read the two parts together: where they differ, that is the run's shape.

Server CPU, in the same run (--cpu-requests x --cpu-passes per front, 0 to skip): the CPU
time of every thread of the server process (scheduler nanosecond counters) per request, less
its idle rate over the same time, gRPC by grpc.aio and HTTP by the raw client, in blocks;
ratio against grpc-tls. TTFT on an idle machine is latency; CPU is what a busy router pays.

Compare within one run only: a noisy 2-core machine, and absolute figures that move with
the run's shape (with 11 series instead of 70, grpc.aio's median fell by a quarter, the raw
HTTP client's by a quarter, httpx2's by a sixth).

JSON lines: {"bench": "http_stacks", "metric": "config" | "server" | "ttft" | "best" |
"ttft_paired" | "server_cpu" | "done", ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.metadata
import ipaddress
import json
import os
import random
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

TARGET_ADDED_MS = 1.0
PROMPT = ("The quick brown fox jumps over the lazy dog while seven wizards quietly "
          "hex the bright moon")  # 16 tokens in GPT-2's tokenizer
MODEL = "pdserve-bench"
GRPC_METHOD = "/bench.Completions/Stream"
COMPLETIONS_PATH = "/v1/completions"
DONE = b"data: [DONE]\n\n"
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
LOOPS = ("asyncio", "uvloop")
SERVERS = ("uvicorn-httptools", "uvicorn-h11", "hypercorn", "granian")
APPS = ("starlette", "starlette-asgi", "raw")
CLIENTS = ("httpx2", "aiohttp", "raw", "openai")
GRPC_FRONTS = ("grpc-tls", "grpc-mtls")
KEEP_ALIVE_S = 60  # the servers' idle keep-alive (uvicorn's and hypercorn's default: 5 s; granian: none)
PACKAGES = ("grpcio", "starlette", "uvicorn", "httptools", "h11", "hypercorn", "granian", "uvloop",
            "httpx2", "aiohttp", "openai")


def emit(**row) -> None:
    print(json.dumps({"bench": "http_stacks", **row}), flush=True)


def pin(core: int | None) -> bool:
    """Run this process (and the threads it starts from now on) on `core`; False if it can't."""
    if core is None or core not in os.sched_getaffinity(0):
        return False
    os.sched_setaffinity(0, {core})
    return True


# ---- statistics (pure: tests/unit/bench/test_http_stacks.py) ---------------------------
def p90(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=10, method="inclusive")[8]


def first_event_end(buf: bytes) -> int:
    """Where the first SSE event of a body ends (the index after its blank line), or -1.
    HTTP/1.1 headers end in CRLF CRLF and chunk framing is CRLF, so LF LF is only ever an
    event's end, also in the raw bytes of a chunked response."""
    i = buf.find(b"\n\n")
    return -1 if i < 0 else i + 2


def compare(ttft_ms: list[float], base_ms: list[float]) -> dict:
    """What a front adds over a baseline measured in the same rounds (equal lengths)."""
    med, base = statistics.median(ttft_ms), statistics.median(base_ms)
    return {"added_ms": round(med - base, 3),
            "added_paired_ms": round(statistics.median(a - b for a, b in zip(ttft_ms, base_ms, strict=True)), 3),
            "ratio": round(med / base, 3), "met": med - base <= TARGET_ADDED_MS}


# ---- a throwaway PKI -------------------------------------------------------------------
def _issue(name: str, key, issuer_key, issuer_name, *, ca: bool, san=None, client: bool = False):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name or subject)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if san:
        b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
    if not ca:
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return b.sign(issuer_key or key, hashes.SHA256())


def make_pki(d: Path) -> None:
    """ca.pem; server.pem/.key (localhost, the router's name, 127.0.0.1); client.pem/.key
    (for mutual TLS)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    def write(stem: str, cert, key=None) -> None:
        (d / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        if key is not None:
            (d / f"{stem}.key").write_bytes(key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue("pdserve-bench-ca", ca_key, None, None, ca=True)
    write("ca", ca)
    from pdserve_client import contract

    names = [x509.DNSName("localhost"), x509.DNSName(contract.server_name("router")),  # the SDK checks this one
             x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    for stem, san in (("server", names), ("client", None)):
        key = ec.generate_private_key(ec.SECP256R1())
        write(stem, _issue(f"bench-{stem}", key, ca_key, ca.subject, ca=False, san=san, client=stem == "client"), key)


# ---- what every front streams ----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Stream:
    """The response's shape: `events` chunks, the first at once, then one per `gap_s`."""

    events: int
    gap_s: float

    async def payloads(self, request: dict):
        """The completion chunks' JSON bytes, built per event as a real front would."""
        assert isinstance(request["prompt"], str), "a prompt"
        created = int(time.time())
        for i in range(self.events):
            if i:
                await asyncio.sleep(self.gap_s)
            last = i == self.events - 1
            yield json.dumps({"id": "cmpl-bench", "object": "text_completion", "created": created, "model": MODEL,
                              "choices": [{"text": f" tok{i}", "index": 0, "logprobs": None,
                                           "finish_reason": "length" if last else None}]}).encode()


def sse(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def starlette_app(stream: Stream):
    """Starlette as an OpenAI front would use it: a Route, request.json(), StreamingResponse."""
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def completions(request):
        body = await request.json()

        async def events():
            async for p in stream.payloads(body):
                yield sse(p)
            yield DONE
        return StreamingResponse(events(), media_type="text/event-stream", headers={"cache-control": "no-cache"})

    return Starlette(routes=[Route(COMPLETIONS_PATH, completions, methods=["POST"])])


class RawCompletions:
    """The same response from a bare ASGI callable: what the hot path costs without
    Starlette's request and response classes (and the disconnect listener task that its
    StreamingResponse runs beside the body under ASGI spec < 2.4, i.e. every server here)."""

    def __init__(self, stream: Stream):
        self.stream = stream

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        assert scope["path"] == COMPLETIONS_PATH and scope["method"] == "POST", scope["path"]
        body, more = b"", True
        while more:
            msg = await receive()
            body, more = body + msg.get("body", b""), msg.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        async for p in self.stream.payloads(json.loads(body)):
            await send({"type": "http.response.body", "body": sse(p), "more_body": True})
        await send({"type": "http.response.body", "body": DONE, "more_body": False})


def starlette_asgi_app(stream: Stream):
    """Starlette's app and router with the completions endpoint a bare ASGI callable (a
    Route whose endpoint is no function is called as an ASGI app): Starlette for every other
    route, no response classes on the hot path."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    return Starlette(routes=[Route(COMPLETIONS_PATH, RawCompletions(stream), methods=["POST"])])


def grpc_handler(stream: Stream):
    import grpc

    async def completions(request: bytes, context):
        async for p in stream.payloads(json.loads(request)):
            yield p
    service, method = GRPC_METHOD.strip("/").split("/")
    return grpc.method_handlers_generic_handler(service, {method: grpc.unary_stream_rpc_method_handler(completions)})


def router_handler(stream: Stream):
    """pd.v1.Router/Generate as the SDK expects it (router.proto's grammar: started, the
    tokens, complete), paced like the others: what the real gRPC front sends its users."""
    import grpc

    from pdserve_client.rpc.pd.v1 import common_pb2, router_pb2

    event = router_pb2.GenerateEvent

    async def generate(request, context):
        rid, i = request.request_id, 0
        yield event(request_id=rid, started=event.Started(route=router_pb2.ROUTE_COLOCATED, decode_worker_id="d-0",
                                                            generation=1))
        async for _ in stream.payloads({"prompt": request.prompt_text}):
            yield event(request_id=rid, token=event.Token(token_id=i, text=f" tok{i}", index=i))
            i += 1
        yield event(request_id=rid, complete=event.Complete(finish_reason=common_pb2.FINISH_REASON_LENGTH,
                                                            num_tokens=i, route=router_pb2.ROUTE_COLOCATED, attempts=1))
    handler = grpc.unary_stream_rpc_method_handler(generate, router_pb2.GenerateRequest.FromString,
                                                   router_pb2.GenerateEvent.SerializeToString)
    return grpc.method_handlers_generic_handler("pd.v1.Router", {"Generate": handler})


# ---- the server process: every front in one loop ---------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def start_grpc(pki: Path, stream: Stream) -> tuple[dict[str, int], object]:
    import grpc

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc_handler(stream), router_handler(stream)))
    pair = [((pki / "server.key").read_bytes(), (pki / "server.pem").read_bytes())]
    ca = (pki / "ca.pem").read_bytes()
    ports = {"grpc-tls": server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(pair)),
             "grpc-mtls": server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(
                 pair, root_certificates=ca, require_client_auth=True))}
    await server.start()
    return ports, lambda: server.stop(None)


def start_uvicorn(app, parser: str, port: int, pki: Path):
    import uvicorn

    class Embedded(uvicorn.Server):
        """The host loop owns SIGINT/SIGTERM (uvicorn would take them over with signal.signal)."""

        @contextlib.contextmanager
        def capture_signals(self):
            yield

    config = uvicorn.Config(app, host="127.0.0.1", port=port, http=parser, ws="none", lifespan="off",
                            access_log=False, log_level="warning", ssl_certfile=str(pki / "server.pem"),
                            ssl_keyfile=str(pki / "server.key"), timeout_keep_alive=KEEP_ALIVE_S,
                            timeout_graceful_shutdown=1)
    server = Embedded(config)
    task = asyncio.create_task(server.serve())

    async def stop():
        server.should_exit = True
        await task
    return stop


def start_hypercorn(app, port: int, pki: Path):
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.certfile, config.keyfile = str(pki / "server.pem"), str(pki / "server.key")
    config.accesslog, config.loglevel = None, "WARNING"
    config.keep_alive_timeout, config.keep_alive_max_requests = KEEP_ALIVE_S, 1 << 30
    done = asyncio.Event()
    task = asyncio.create_task(serve(app, config, shutdown_trigger=done.wait))

    async def stop():
        done.set()
        await task
    return stop


def start_granian(app, port: int, pki: Path):
    import logging

    from granian.constants import HTTPModes, Interfaces
    from granian.server.embed import Server

    logging.getLogger("_granian").setLevel(logging.ERROR)  # "Embedded server is experimental!"
    server = Server(app, address="127.0.0.1", port=port, interface=Interfaces.ASGINL, http=HTTPModes.http1,
                    websockets=False, log_enabled=False, runtime_threads=1,
                    ssl_cert=pki / "server.pem", ssl_key=pki / "server.key")
    task = asyncio.create_task(server.serve())

    async def stop():
        server.stop()
        await task
    return stop


async def start_http(servers: list[str], apps: list[str], pki: Path, stream: Stream) -> tuple[dict, list]:
    made = {"starlette": starlette_app, "starlette-asgi": starlette_asgi_app, "raw": RawCompletions}
    ports, stops = {}, []
    for server in servers:
        for app_name in apps:
            port, app = free_port(), made[app_name](stream)
            if server.startswith("uvicorn-"):
                stops.append(start_uvicorn(app, server.removeprefix("uvicorn-"), port, pki))
            elif server == "hypercorn":
                stops.append(start_hypercorn(app, port, pki))
            else:
                assert server == "granian", server
                stops.append(start_granian(app, port, pki))
            ports[f"{server}/{app_name}"] = port
    return ports, stops


async def wait_listening(ports: dict[str, int], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    for name, port in ports.items():
        while True:
            try:
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} is not listening on {port}") from None
                await asyncio.sleep(0.05)


async def serve(args) -> None:
    stream = Stream(args.events, args.gap_ms / 1000)
    grpc_ports, grpc_stop = await start_grpc(args.pki, stream)
    http_ports, stops = await start_http(args.servers, args.apps, args.pki, stream)
    ports = {**grpc_ports, **http_ports}
    await wait_listening(ports)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    loop = type(asyncio.get_running_loop())
    print(json.dumps({"ports": ports, "loop_class": f"{loop.__module__}.{loop.__qualname__}",
                      "threads": len(os.listdir("/proc/self/task"))}), flush=True)
    await stop.wait()
    with contextlib.suppress(TimeoutError):  # a client that kept its connection open
        async with asyncio.timeout(10):
            for s in stops:
                await s()
            await grpc_stop()


def server_main(args) -> None:
    pin(args.server_core)
    if args.loop == "uvloop":
        import uvloop
        uvloop.run(serve(args))
    else:
        asyncio.run(serve(args))


# ---- the client: one persistent connection per series ----------------------------------
def client_ssl(pki: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def request_body() -> bytes:
    return json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 16, "stream": True}).encode()


class GrpcClient:
    """grpc.aio on a persistent channel; the first message is the first event."""

    def __init__(self, port: int, pki: Path, mtls: bool):
        import grpc
        key = (pki / "client.key").read_bytes() if mtls else None
        cert = (pki / "client.pem").read_bytes() if mtls else None
        creds = grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes(), key, cert)
        self.channel = grpc.aio.secure_channel(f"127.0.0.1:{port}", creds)
        self.method = self.channel.unary_stream(GRPC_METHOD)
        self.body = request_body()

    async def once(self) -> tuple[float, float, int]:
        t0, first, n = time.perf_counter(), 0.0, 0
        async for _ in self.method(self.body):
            first, n = first or time.perf_counter(), n + 1
        return first - t0, time.perf_counter() - t0, n + 1  # + the end of the stream as [DONE]

    async def close(self) -> None:
        await self.channel.close()


class Httpx2Client:
    """httpx2 (the openai SDK's HTTP client), one keep-alive connection; the first event is
    the bytes up to the first blank line, unparsed."""

    def __init__(self, port: int, pki: Path):
        import httpx2
        self.client = httpx2.AsyncClient(verify=client_ssl(pki), limits=httpx2.Limits(max_connections=1))
        self.url, self.body = f"https://127.0.0.1:{port}{COMPLETIONS_PATH}", request_body()

    async def once(self) -> tuple[float, float, int]:
        t0, first, buf = time.perf_counter(), 0.0, b""
        async with self.client.stream("POST", self.url, content=self.body,
                                      headers={"content-type": "application/json"}) as r:
            async for chunk in r.aiter_bytes():
                buf += chunk
                if not first and first_event_end(buf) > 0:
                    first = time.perf_counter()
        return first - t0, time.perf_counter() - t0, buf.count(b"data: ")

    async def close(self) -> None:
        await self.client.aclose()


class AiohttpClient:
    """aiohttp, one keep-alive connection; the first event as for httpx2."""

    def __init__(self, port: int, pki: Path):
        import aiohttp
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ssl(pki), limit=1))
        self.url, self.body = f"https://127.0.0.1:{port}{COMPLETIONS_PATH}", request_body()

    async def once(self) -> tuple[float, float, int]:
        t0, first, buf = time.perf_counter(), 0.0, b""
        async with self.session.post(self.url, data=self.body, headers={"content-type": "application/json"}) as r:
            async for chunk in r.content.iter_any():
                buf += chunk
                if not first and first_event_end(buf) > 0:
                    first = time.perf_counter()
        return first - t0, time.perf_counter() - t0, buf.count(b"data: ")

    async def close(self) -> None:
        await self.session.close()


class RawClient:
    """A prebuilt HTTP/1.1 request on an asyncio TLS stream, the response's raw (chunked)
    bytes read to the last chunk: the least a client adds, so the rest is the server's."""

    def __init__(self, port: int, pki: Path):
        body = request_body()
        self.port, self.ctx = port, client_ssl(pki)
        self.request = (f"POST {COMPLETIONS_PATH} HTTP/1.1\r\nhost: 127.0.0.1:{self.port}\r\n"
                        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body
        self.reader = self.writer = None

    async def once(self) -> tuple[float, float, int]:
        if self.writer is None or self.reader.at_eof():  # the first, or the server closed it idle
            self.reader, self.writer = await asyncio.open_connection(
                "127.0.0.1", self.port, ssl=self.ctx, server_hostname="localhost")
        t0, first, buf = time.perf_counter(), 0.0, b""
        self.writer.write(self.request)
        while not (DONE in buf and buf.endswith(b"\r\n0\r\n\r\n")):
            chunk = await self.reader.read(65536)
            if not chunk:
                raise ConnectionError(f"closed after {buf!r}")
            buf += chunk
            if not first and first_event_end(buf) > 0:
                first = time.perf_counter()
        return first - t0, time.perf_counter() - t0, buf.count(b"data: ")

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class OpenAIClient:
    """The openai SDK's streaming completions (on its own httpx2 client, one connection);
    the first event is the first parsed chunk."""

    def __init__(self, port: int, pki: Path):
        import httpx2
        import openai
        http = httpx2.AsyncClient(verify=client_ssl(pki), limits=httpx2.Limits(max_connections=1))
        self.client = openai.AsyncOpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key="bench",
                                         http_client=http, max_retries=0)

    async def once(self) -> tuple[float, float, int]:
        t0, first, n = time.perf_counter(), 0.0, 0
        stream = await self.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, stream=True)
        async for _ in stream:
            first, n = first or time.perf_counter(), n + 1
        return first - t0, time.perf_counter() - t0, n + 1  # the SDK swallows [DONE]

    async def close(self) -> None:
        await self.client.close()


class SdkClient:
    """pdserve's own asyncio SDK (AsyncClient.generate: protobuf, mutual TLS, its channel
    options); the first event is the first TokenEvent it yields."""

    def __init__(self, port: int, pki: Path):
        from pdserve_client.aio import AsyncClient
        from pdserve_client.tls import TlsFiles
        files = TlsFiles.read(pki / "client.pem", pki / "client.key", pki / "ca.pem")
        self.client = AsyncClient(f"127.0.0.1:{port}", tls_files=files)

    async def once(self) -> tuple[float, float, int]:
        t0, first, n = time.perf_counter(), 0.0, 0
        async with self.client.generate(PROMPT, max_tokens=16) as stream:
            async for _ in stream:
                first, n = first or time.perf_counter(), n + 1
        return first - t0, time.perf_counter() - t0, n + 1  # + complete as [DONE]

    async def close(self) -> None:
        await self.client.close()


HTTP_CLIENTS = {"httpx2": Httpx2Client, "aiohttp": AiohttpClient, "raw": RawClient, "openai": OpenAIClient}


@dataclass(slots=True)
class Series:
    """One loop x front x client: its connection and its samples."""

    loop: str
    front: str  # grpc-tls | grpc-mtls | <server>/<app>
    client: str
    conn: object
    ttft_ms: list[float] = field(default_factory=list)
    stream_ms: list[float] = field(default_factory=list)

    async def sample(self, events: int) -> tuple[float, float]:
        """One request: (TTFT ms, whole stream ms), after checking it streamed every event."""
        ttft_s, stream_s, seen = await self.conn.once()
        assert seen == events + 1, f"{self.loop} {self.front} {self.client}: {seen} events, not {events} + [DONE]"
        return ttft_s * 1000, stream_s * 1000

    async def once(self, events: int, keep: bool) -> None:
        ttft_ms, stream_ms = await self.sample(events)
        if keep:
            self.ttft_ms.append(ttft_ms)
            self.stream_ms.append(stream_ms)


def make_series(loop: str, ports: dict[str, int], clients: list[str], pki: Path) -> list[Series]:
    out = [Series(loop, f, "grpc.aio", GrpcClient(ports[f], pki, f == "grpc-mtls")) for f in GRPC_FRONTS]
    out.append(Series(loop, "grpc-mtls", "pdserve-sdk", SdkClient(ports["grpc-mtls"], pki)))
    for front, port in ports.items():
        if front not in GRPC_FRONTS:
            out += [Series(loop, front, c, HTTP_CLIENTS[c](port, pki)) for c in clients]
    return out


def cpu_ns(pid: int) -> int:
    """CPU time of every live thread of `pid` (the scheduler's nanosecond counters)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    return total


async def idle_ns_per_s(pids: dict[str, int], seconds: float = 1.0) -> dict[str, float]:
    """What each server process burns with no request (its fronts' timers, gRPC's poller)."""
    before, t0 = {loop: cpu_ns(pid) for loop, pid in pids.items()}, time.perf_counter()
    await asyncio.sleep(seconds)
    elapsed = time.perf_counter() - t0
    return {loop: (cpu_ns(pid) - before[loop]) / elapsed for loop, pid in pids.items()}


async def server_cpu(args, series: list[Series], pids: dict[str, int]) -> dict[tuple[str, str], float]:
    """Server CPU µs per request of each front (gRPC by grpc.aio, HTTP by the raw client,
    which asks the least of the server), less the process's idle rate over the block:
    --cpu-passes passes, each a block of --cpu-requests requests per front in a fresh order;
    the median block per front."""
    chosen = [s for s in series if s.client in ("grpc.aio", "raw")]
    blocks: dict[tuple[str, str], list[float]] = {(s.loop, s.front): [] for s in chosen}
    rng = random.Random(args.seed + 1)
    for _ in range(args.cpu_passes):
        idle = await idle_ns_per_s(pids)
        rng.shuffle(chosen)
        for s in chosen:
            before, t0 = cpu_ns(pids[s.loop]), time.perf_counter()
            for _ in range(args.cpu_requests):
                await s.once(args.events, keep=False)
            busy_ns = cpu_ns(pids[s.loop]) - before - idle[s.loop] * (time.perf_counter() - t0)
            blocks[s.loop, s.front].append(busy_ns / args.cpu_requests / 1000)
    return {k: statistics.median(v) for k, v in blocks.items()}


async def paired(args, series: list[Series]) -> list[dict]:
    """Each HTTP series against its gRPC baseline alone (the openai SDK against pdserve's
    SDK, every other client against grpc.aio on grpc-tls), in blocks of --pair-requests
    pairs (which goes first alternates; the block's first pair untimed), --pair-passes
    blocks per series in a fresh order: two stacks' code in turn, so both warm, where the
    interleaved part runs every stack in turn."""
    base = {(s.loop, s.client): s for s in series
            if (s.front, s.client) in (("grpc-tls", "grpc.aio"), ("grpc-mtls", "pdserve-sdk"))}
    http = [s for s in series if s.front not in GRPC_FRONTS]
    got: dict[int, tuple[list[float], list[float]]] = {id(s): ([], []) for s in http}
    rng = random.Random(args.seed + 2)
    for _ in range(args.pair_passes):
        rng.shuffle(http)
        for s in http:
            b = base[s.loop, "pdserve-sdk" if s.client == "openai" else "grpc.aio"]
            for i in range(args.pair_requests + 1):
                for x, out in ((s, got[id(s)][0]), (b, got[id(s)][1]))[::1 if i % 2 else -1]:
                    ttft_ms, _ = await x.sample(args.events)
                    if i:
                        out.append(ttft_ms)
    rows = []
    for s in http:
        b = base[s.loop, "pdserve-sdk" if s.client == "openai" else "grpc.aio"]
        mine, theirs = got[id(s)]
        rows.append({"loop": s.loop, "front": s.front, "client": s.client, "baseline": f"{b.front} {b.client}",
                     "pairs": len(mine), "median_ms": round(statistics.median(mine), 3),
                     "p90_ms": round(p90(mine), 3), "baseline_median_ms": round(statistics.median(theirs), 3),
                     **compare(mine, theirs), "target_ms": TARGET_ADDED_MS})
    return rows


async def measure(args, ports_by_loop: dict[str, dict[str, int]], pids: dict[str, int]
                  ) -> tuple[list[Series], list[dict], dict[tuple[str, str], float]]:
    series = [s for loop, ports in ports_by_loop.items() for s in make_series(loop, ports, args.clients, args.pki)]
    rng = random.Random(args.seed)
    try:
        for i in range(args.warmup + args.requests):
            rng.shuffle(series)
            for s in series:
                await s.once(args.events, keep=i >= args.warmup)
        pairs = await paired(args, series) if args.pair_requests else []
        cpu_us = await server_cpu(args, series, pids) if args.cpu_requests else {}
    finally:
        for s in series:
            await s.conn.close()
    return series, pairs, cpu_us


# ---- the run ---------------------------------------------------------------------------
def spawn_server(args, loop: str) -> tuple[subprocess.Popen, dict]:
    cmd = [sys.executable, __file__, "--role", "server", "--loop", loop, "--pki", str(args.pki),
           "--servers", ",".join(args.servers), "--apps", ",".join(args.apps), "--events", str(args.events),
           "--gap-ms", str(args.gap_ms)]
    if args.pin:
        cmd += ["--server-core", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the {loop} server exited ({proc.wait()}) before it listened")
    return proc, json.loads(line)


def ttft_row(s: Series, base: dict[tuple[str, str], Series]) -> dict:
    """One series' figures; an HTTP one against grpc-tls (grpc.aio: same TLS, a bare client),
    grpc-mtls (what the gRPC front runs) and pdserve's SDK on it (what its users see)."""
    row = {"loop": s.loop, "front": s.front, "client": s.client, "requests": len(s.ttft_ms),
           "median_ms": round(statistics.median(s.ttft_ms), 3), "p90_ms": round(p90(s.ttft_ms), 3),
           "max_ms": round(max(s.ttft_ms), 3), "stream_median_ms": round(statistics.median(s.stream_ms), 3)}
    tls = base[s.loop, "grpc.aio"].ttft_ms
    if s.front in GRPC_FRONTS:
        return row if s is base[s.loop, "grpc.aio"] else row | {"added_vs_tls_ms": compare(s.ttft_ms, tls)["added_ms"]}
    return row | compare(s.ttft_ms, tls) | {
        "added_vs_mtls_ms": compare(s.ttft_ms, base[s.loop, "mtls"].ttft_ms)["added_ms"],
        "added_vs_sdk_ms": compare(s.ttft_ms, base[s.loop, "pdserve-sdk"].ttft_ms)["added_ms"],
        "target_ms": TARGET_ADDED_MS}


def report(args, series: list[Series]) -> None:
    base = {}
    for s in series:
        if s.front == "grpc-tls":
            base[s.loop, "grpc.aio"] = s
        elif s.front == "grpc-mtls":
            base[s.loop, "mtls" if s.client == "grpc.aio" else s.client] = s
    rows = []
    for s in sorted(series, key=lambda s: (s.loop, s.front not in GRPC_FRONTS, s.front, s.client)):
        rows.append(ttft_row(s, base))
        emit(metric="ttft", **rows[-1])
    for client in args.clients:
        mine = [r for r in rows if r["client"] == client]
        if mine:
            best = min(mine, key=lambda r: r["added_ms"])
            emit(metric="best", client=client, loop=best["loop"], front=best["front"], added_ms=best["added_ms"],
                 added_vs_sdk_ms=best["added_vs_sdk_ms"], ratio=best["ratio"], met=best["met"],
                 met_by=sorted(f"{r['loop']} {r['front']}" for r in mine if r["met"]))


def report_cpu(cpu_us: dict[tuple[str, str], float]) -> None:
    for (loop, front), us in sorted(cpu_us.items()):
        base = cpu_us[loop, "grpc-tls"]
        emit(metric="server_cpu", loop=loop, front=front, client="grpc.aio" if front in GRPC_FRONTS else "raw",
             cpu_us_per_request=round(us, 1), added_us=round(us - base, 1), ratio=round(us / base, 3))


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


def emit_config(args) -> None:
    versions = {}
    for p in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[p] = importlib.metadata.version(p)
    emit(metric="config", cpu=cpu_model(), cpus=os.cpu_count(), python=sys.version.split()[0],
         loops=args.loops, servers=args.servers, apps=args.apps, clients=args.clients,
         requests=args.requests, warmup=args.warmup, events=args.events, gap_ms=args.gap_ms,
         body_bytes=len(request_body()), tls="TLS 1.3, P-256 certificates, server auth (grpc-mtls: mutual)",
         pinned="servers on core 0, client on core 1" if args.pin else "no", client_loop="asyncio",
         versions=versions, load_avg_1m=os.getloadavg()[0],
         timing="call -> first event in hand, one persistent connection per series")


def run(args) -> None:
    t0 = time.monotonic()
    emit_config(args)
    args.pki = Path(tempfile.mkdtemp(prefix="pdserve-bench-http-"))
    make_pki(args.pki)
    procs = {}
    try:
        ports = {}
        for loop in args.loops:
            procs[loop], hello = spawn_server(args, loop)
            ports[loop] = hello.pop("ports")
            emit(metric="server", loop=loop, **hello, fronts=sorted(ports[loop]))
        if args.pin:
            pin(1)
        series, pairs, cpu_us = asyncio.run(measure(args, ports, {loop: p.pid for loop, p in procs.items()}))
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in args.pki.iterdir():
            f.unlink()
        args.pki.rmdir()
    report(args, series)
    for row in sorted(pairs, key=lambda r: (r["loop"], r["front"], r["client"])):
        emit(metric="ttft_paired", **row)
    report_cpu(cpu_us)
    emit(metric="done", elapsed_s=round(time.monotonic() - t0, 1), load_avg_1m=os.getloadavg()[0])


def main() -> None:
    def names(allowed):
        def parse(s: str) -> list[str]:
            out = [x for x in s.split(",") if x]
            bad = set(out) - set(allowed)
            if bad:
                raise argparse.ArgumentTypeError(f"unknown {sorted(bad)}; known: {','.join(allowed)}")
            return out
        return parse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loops", type=names(LOOPS), default=list(LOOPS), help="server loops")
    ap.add_argument("--servers", type=names(SERVERS), default=list(SERVERS))
    ap.add_argument("--apps", type=names(APPS), default=list(APPS))
    ap.add_argument("--clients", type=names(CLIENTS), default=list(CLIENTS), help="HTTP clients")
    ap.add_argument("--requests", type=int, default=300, help="timed rounds (one request per series each)")
    ap.add_argument("--warmup", type=int, default=20, help="untimed rounds first")
    ap.add_argument("--events", type=int, default=4, help="completion chunks per response")
    ap.add_argument("--gap-ms", type=float, default=1.0, help="between two chunks after the first")
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=False,
                    help="servers on core 0, client on core 1")
    ap.add_argument("--pair-requests", type=int, default=30, help="pairs per block of the paired part (0: skip)")
    ap.add_argument("--pair-passes", type=int, default=3, help="blocks per HTTP series in the paired part")
    ap.add_argument("--cpu-requests", type=int, default=100, help="requests per block of the server CPU part (0: skip)")
    ap.add_argument("--cpu-passes", type=int, default=3, help="blocks per front in the server CPU part")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--role", choices=("bench", "server"), default="bench", help=argparse.SUPPRESS)
    ap.add_argument("--loop", choices=LOOPS, help=argparse.SUPPRESS)
    ap.add_argument("--pki", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--server-core", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    server_main(args) if args.role == "server" else run(args)


if __name__ == "__main__":
    main()
