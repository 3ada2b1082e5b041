"""Directory benchmark: the hand-off's store calls inline on the event loop against on the
thread pool (kv_directory/store_calls.py), in one run.

Two `python -m kv_directory` processes on one private redis-server, each under its own
key prefix and mutual TLS (a throwaway CA): `inline` with the default
PD_STORE_INLINE_BUDGET_S, `pool` with 0 (every call on its thread pool, as before).
Each registers a prefill p0 and a decode d0 (a DirectoryClient per certificate, as in a
cluster). Then --handoffs hand-offs, alternating between the two, each the calls a
disaggregated request makes, in its order and as the process that makes it:

  Reserve       the router records the manifest (one layer, one block)
  ConsumeNonce  the decode consumes the capability's nonce (named by the record)
  Begin         the prefill declares its K/V digest and chunks (a Begin stands in for the
                seal a real Publish relays: the bench holds no worker seal keys)
  Publish       the decode's validate-and-publish, with the chunks it received
  Release       the decode, when the sequence ends

Each call's wall time is taken at the client; each directory's CPU time (every thread's,
from /proc: bench/_handoff_floor.py `cpu_s`) is read around the whole run of its
hand-offs. JSON lines: {"bench": "directory", "metric": "config" | "call" | "cpu" |
"inline_calls", ...};
every "call" row has both modes' median and p90 wall ms and ratio = inline / pool
median; "cpu" gives each mode's directory CPU ms per hand-off and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._handoff_floor import cpu_s  # noqa: E402
from pdserve_client import contract  # noqa: E402
from pdserve_client.rpc.pd.v1 import manifest_pb2  # noqa: E402
from pdserve_client.tls import TlsFiles  # noqa: E402
from runtime.directory.client import DirectoryClient  # noqa: E402
from runtime.directory.records import WorkerCapacity, WorkerInfo, WorkerRole  # noqa: E402
from runtime.security.pki import Identity, LocalCA  # noqa: E402
from runtime.security.tls import Security  # noqa: E402
from tooling.cluster.ports import free_port  # noqa: E402
from tooling.cluster.redis_proc import start_redis  # noqa: E402

MODES = ("inline", "pool")
CALLS = ("Reserve", "ConsumeNonce", "Begin", "Publish", "Release")
KV = "ab" * 16
CHUNKS = [manifest_pb2.ChunkSpec(layer=0, block_start=0, block_count=1, num_bytes=8192, checksum="c0")]
CAP = WorkerCapacity(total_blocks=64, max_decode_batch=8, max_prefill_tokens=2048, block_size=16,
                     vocab_size=32000, max_model_len=4096)


def emit(**row) -> None:
    print(json.dumps({"bench": "directory", **row}), flush=True)


class Directory:
    """One directory process and a client per identity that calls it."""

    def __init__(self, mode: str, redis_url: str, ca: LocalCA, metrics: bool) -> None:
        self.mode, self.address = mode, f"127.0.0.1:{free_port()}"
        self.metrics_listen = f"127.0.0.1:{free_port()}" if metrics else ""
        env = {**os.environ, contract.TLS_CERT_ENV: str(ca.dir / "directory.crt"),
               contract.TLS_KEY_ENV: str(ca.dir / "directory.key"),
               contract.TLS_CA_ENV: str(ca.dir / contract.TLS_CA_FILE),
               "PD_DIRECTORY_KEY_PREFIX": "{bench-" + uuid.uuid4().hex[:8] + "}", "PD_LOG_LEVEL": "WARNING",
               "PD_METRICS_LISTEN": self.metrics_listen,
               "PD_LEASE_TTL_S": "86400"}  # the bench's workers send no heartbeats: leases outlast any run
        if mode == "pool":
            env["PD_STORE_INLINE_BUDGET_S"] = "0"
        self.proc = subprocess.Popen([sys.executable, "-m", "kv_directory", "--listen", self.address,
                                      "--redis-url", redis_url], cwd=ROOT, env=env, stdin=subprocess.DEVNULL)
        self.clients = {name: DirectoryClient(self.address, 10.0, identity(ca, name))
                        for name in ("router", "p0", "d0")}
        self.epochs: dict[str, int] = {}
        self.wall: dict[str, list[float]] = {c: [] for c in CALLS}

    async def start(self) -> None:
        deadline = time.monotonic() + 30
        for name, role in (("p0", WorkerRole.PREFILL), ("d0", WorkerRole.DECODE)):
            while True:
                try:
                    reg = await self.clients[name].register_worker(
                        WorkerInfo(name, role, f"{name}:1", f"{name}:2", "abi", CAP))
                    break
                except Exception:  # not serving yet
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise
                    await asyncio.sleep(0.1)
            self.epochs[name] = reg.epoch

    async def handoff(self, i: int, timed: bool) -> None:
        rid, tid = f"r{i}", f"r{i}/1"
        p, d = ("p0", self.epochs["p0"]), ("d0", self.epochs["d0"])
        manifest = manifest_pb2.HandoffManifest(
            request_id=rid, tenant="bench", generation=1, transfer_id=tid, block_size=16,
            token_interval=manifest_pb2.TokenInterval(start=0, end=16), reservation_id=f"res-{i}",
            expected_chunks=CHUNKS, source_worker_id="p0", source_epoch=p[1], destination_worker_id="d0",
            destination_epoch=d[1], checksum_algorithm="xxh3_64", cache_abi_digest="abi")
        router, pc, dc = self.clients["router"], self.clients["p0"], self.clients["d0"]
        steps = (
            ("Reserve", lambda: router.reserve(manifest)),
            ("ConsumeNonce", lambda: dc.consume_nonce(os.urandom(16).hex(), int(time.time() * 1000) + 30_000, tid)),
            ("Begin", lambda: pc.begin(rid, tid, 1, *p, kv_digest=KV, chunks=CHUNKS)),
            ("Publish", lambda: dc.publish(rid, tid, 1, *d, kv_digest=KV, chunks=CHUNKS)),
            ("Release", lambda: dc.release(rid, tid, 1, *d)),
        )
        for name, step in steps:
            started = time.perf_counter()
            answer = await step()
            took = (time.perf_counter() - started) * 1000
            if answer is not True and not getattr(answer, "ok", False):
                raise RuntimeError(f"{self.mode} {name} of {tid}: {answer}")
            if timed:
                self.wall[name].append(took)

    async def close(self) -> None:
        for c in self.clients.values():
            await c.close()
        self.proc.terminate()
        self.proc.wait(timeout=10)


def identity(ca: LocalCA, name: str) -> Security:
    """The Security of the certificate `ca` issued as `name`."""
    return Security.of(TlsFiles.read(ca.dir / f"{name}.crt", ca.dir / f"{name}.key", ca.dir / contract.TLS_CA_FILE))


def inline_counts(d: Directory, ca: LocalCA) -> dict[str, float]:
    """The inline directory's pd_directory_store_inline_calls_total, by outcome."""
    url = f"https://{d.metrics_listen}/metrics"
    with urllib.request.urlopen(url, context=identity(ca, "operator").client_ssl(), timeout=10) as reply:
        text = reply.read().decode()
    return {s.labels["outcome"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "pd_directory_store_inline_calls_total"}


async def run(args) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="pdserve-bench-directory-"))
    ca = LocalCA(tmp)
    for role, name in (("directory", "directory"), ("router", "router"), ("prefill", "p0"), ("decode", "d0"),
                       ("operator", "operator")):
        ca.issue(Identity(role, name), name)
    redis = start_redis()
    dirs = {m: Directory(m, redis.url, ca, metrics=m == "inline") for m in MODES}
    try:
        for d in dirs.values():
            await d.start()
        for i in range(args.warmup):
            for d in dirs.values():
                await d.handoff(i, timed=False)
        start = {m: cpu_s(d.proc.pid) for m, d in dirs.items()}  # each serves only its own hand-offs
        for i in range(args.warmup, args.warmup + args.handoffs):
            for m in MODES if i % 2 else MODES[::-1]:
                await dirs[m].handoff(i, timed=True)
        per = {m: (cpu_s(d.proc.pid) - start[m]) * 1000 / args.handoffs for m, d in dirs.items()}
        for name in CALLS:
            med = {m: statistics.median(dirs[m].wall[name]) for m in MODES}
            p90 = {m: statistics.quantiles(dirs[m].wall[name], n=10)[-1] for m in MODES}
            emit(metric="call", call=name, inline_median_ms=round(med["inline"], 3),
                 pool_median_ms=round(med["pool"], 3), inline_p90_ms=round(p90["inline"], 3),
                 pool_p90_ms=round(p90["pool"], 3),
                 ratio=round(med["inline"] / med["pool"], 3), handoffs=args.handoffs)
        emit(metric="cpu", inline_ms_per_handoff=round(per["inline"], 3), pool_ms_per_handoff=round(per["pool"], 3),
             ratio=round(per["inline"] / per["pool"], 3) if per["pool"] else None, handoffs=args.handoffs)
        emit(metric="inline_calls", **inline_counts(dirs["inline"], ca))
    finally:
        for d in dirs.values():
            await d.close()
        redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--handoffs", type=int, default=400, help="timed hand-offs per mode")
    p.add_argument("--warmup", type=int, default=20)
    args = p.parse_args()
    emit(metric="config", handoffs=args.handoffs, warmup=args.warmup, cpus=os.cpu_count())
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
