"""The design's floor for the hand-off overhead target (<= 5 ms, docs/benchmarks.md, Hand-off),
measured in bench/handoff.py's run: the hops of a disaggregated hand-off with no work in
them, on this machine's cores.

Four skeleton processes (bench/_handoff_floor_node.py, spawned by bench/_spawned.py) and
a redis-server, laid out as the local cluster is, with the libraries pdserve uses
(grpc.aio on loopback, ucxx through pdserve's own runtime, Redis with Lua
compare-and-sets) and none of its work: no spans, no signatures, no checks, no model;
bytes in, bytes out. Each prompt's compute is the same
calibrated GIL-free burst (sha256 over 16 KiB blocks) on a thread of its own, in whichever
process computes it:

    colocated      client -> router -> decode Generate: compute, token 0 -> router -> client
    disaggregated  client -> router -> prefill Prefill (job now; the grant after D's
                   Reserve, on the same call) and decode Reserve (posts the receive);
                   then directory Reserve (a Lua script) and decode DecodeStream;
                   prefill: compute, one UCX message (the prompt's K/V bytes) -> decode:
                   a digest, directory Publish (a Lua compare-and-set) -> token 0 on the
                   DecodeStream -> router -> client; after the last token, directory Release

That is the transaction's shape (reserve, transfer, validate, publish, release) with the
fewest calls: no seal, no Begin. Options add what pdserve's contract or its implementation
adds per hop: `tls` (every call over mutual TLS), `nonce` (the decode consumes the
capability's nonce in Redis through the directory as its stream opens: the contract's
replay and revocation check), `pool` and `read` (the directory's store calls on a thread
pool with a synchronous client, and a record read before each script, as
kv_directory/server.py does), `engine` (the compute is pdserve's own engine on a preset
model instead of the burst: its kernels release the GIL, the Python between them holds it,
as in a worker whose event loop serves the hand-off beside it), `watch` (the router's
record call stays open and the directory answers the publication on it; the decode's
token 0 leaves once validated and the router sends it on at the directory's word). Its overhead
(disaggregated - colocated median TTFT, pairs alternating as in the cluster run) is what
the hops alone cost here, waking one process after another on shared cores. Where it is
above the target, the target is out of reach on this machine at this design's number of
hops, whatever pdserve's handlers do; where it is below, the rest of pdserve's overhead is
pdserve's own work per hop (spans, signatures, checks, its handlers). `python
bench/_handoff_floor.py` alternates the variants in one sitting (JSON lines).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script too

from bench._handoff_floor_node import SERVICE, channel_credentials, tls_files


def overheads(ttft: dict[str, list[float]]) -> tuple[dict[str, float], float, float]:
    """From TTFTs (ms) by mode, pairs in order: the median per mode, the overhead (median
    disaggregated - median colocated) and the median of the pairs' differences."""
    med = {m: statistics.median(ttft[m]) for m in ("colocated", "disaggregated")}
    paired = statistics.median(d - c for d, c in zip(ttft["disaggregated"], ttft["colocated"], strict=True))
    return med, med["disaggregated"] - med["colocated"], paired


def cpu_s(pid: int) -> float:
    """CPU seconds every thread of process `pid` ran so far, from the scheduler's nanosecond
    counters (/proc/PID/task/*/schedstat: psutil's cpu_times tick in 10 ms, too coarse for
    one call's cost); threads that ended meanwhile are not counted."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended while we read
    return total / 1e9


def _records(port: int, expected: int, wait_s: float = 5.0) -> dict[str, int]:
    """The hand-offs' records and nonces in Redis by state (the Release follows the last
    token: waits up to `wait_s` for `expected` records released): what the floor did."""
    with redis.Redis(host="127.0.0.1", port=port) as r:
        deadline = time.monotonic() + wait_s
        while True:
            states = collections.Counter(r.get(k).decode() for k in r.scan_iter("txn:*"))
            if states.get("X", 0) >= expected or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        return {**states, "nonces": sum(1 for _ in r.scan_iter("nonce:*"))}










def measure(requests: int, warmup: int, compute_ms: float, step_ms: float, kv_bytes: int,
            tls: bool = False, pool: bool = False, read: bool = False, nonce: bool = False,
            merged: bool = False, sync: bool = False, engine: str = "", one: bool = False,
            watch: bool = False) -> dict:
    """Start the skeleton, serve warmup + requests alternating pairs, stop it: each TTFT
    per mode, as bench/handoff.py's cluster run takes them. `tls`: every call over mutual
    TLS (pdserve's certificates: runtime/security/pki.py), else plaintext."""
    from bench._spawned import Spawned
    from tooling.cluster.ports import free_port
    from tooling.cluster.redis_proc import find_redis_server

    state = tempfile.mkdtemp(prefix="pdserve-floor-")
    tls_dir = ""
    if tls:
        from runtime.security.pki import Identity, LocalCA
        ca = LocalCA(Path(state) / "tls")
        for role in ("directory", "decode", "prefill", "router", "client"):
            ca.issue(Identity(role, role))
        tls_dir = str(ca.dir)
    rport = free_port()
    redis_server = subprocess.Popen([find_redis_server(), "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", state], stdout=subprocess.DEVNULL)
    nodes = {role: Spawned(f"floor-{role}", "bench._handoff_floor_node:Node", role=role)
             for role in ("directory", "decode", "prefill", "router")}
    try:
        info = {role: n.call("serve", compute_ms=compute_ms, step_ms=step_ms, kv_bytes=kv_bytes,
                             redis_port=rport, tls_dir=tls_dir, pool=pool, read=read,
                             nonce=nonce, merged=merged, sync=sync, engine=engine, one=one, watch=watch)
                for role, n in nodes.items()}
        ports = {role: i["port"] for role, i in info.items()}
        nodes["decode"].call("connect", ports={"directory": ports["directory"]})
        nodes["prefill"].call("connect", ports={}, decode_ucx=info["decode"]["ucx"])
        nodes["router"].call("connect", ports={r: ports[r] for r in ("decode", "prefill", "directory")})
        ttft: dict[str, list[float]] = {"C": [], "D": []}
        target = f"127.0.0.1:{ports['router']}"
        with (grpc.secure_channel(target, channel_credentials(tls_files(tls_dir, "client"))) if tls
              else grpc.insecure_channel(target)) as ch:
            generate = ch.unary_stream(f"/{SERVICE}/Generate")
            ids = itertools.count()

            def one(mode: bytes) -> float:
                t = time.perf_counter()
                stream = generate(mode + struct.pack("<Q", next(ids)) + bytes(64), timeout=30)
                next(stream)
                ms = (time.perf_counter() - t) * 1000
                for _ in stream:
                    pass
                return ms
            for i in range(warmup + requests):
                for mode in (b"C", b"D") if i % 2 else (b"D", b"C"):
                    ms = one(mode)
                    if i >= warmup:
                        ttft[mode.decode()].append(ms)
            pids = {**{role: n.proc.pid for role, n in nodes.items()}, "redis": redis_server.pid}
            cpu = {}
            for mode, name in ((b"C", "colocated"), (b"D", "disaggregated")):  # each mode in a row
                before = {role: cpu_s(pid) for role, pid in pids.items()}
                for _ in range(requests):
                    one(mode)
                cpu[name] = {role: (cpu_s(pid) - before[role]) * 1000 / requests for role, pid in pids.items()}
        return {"colocated": ttft["C"], "disaggregated": ttft["D"], "cpu": cpu,
                "iterations": info["prefill"]["iterations"], "engine": info["prefill"]["engine"],
                "records": _records(rport, warmup + 2 * requests), "decode_calls": nodes["decode"].call("calls"),
                "directory_calls": nodes["directory"].call("calls")}
    finally:
        for n in nodes.values():
            n.close()
        redis_server.terminate()
        redis_server.wait(10)
        shutil.rmtree(Path(state), ignore_errors=True)


def main() -> None:
    """What each of pdserve's design choices adds to the floor, alternating variants in one
    sitting: t = mutual TLS, p = the directory's store calls on a thread pool with a
    synchronous client (as kv_directory/server.py), r = a record read before each script
    (its lookup before a transition), n = the decode's nonce call to the directory as its
    stream opens, m = that call also makes the directory's record, the router making none
    (the two calls merged into one), s = the directory on grpc's thread-pool server with
    synchronous handlers calling Redis inline (no event loop, no executor hop), e = the
    compute is pdserve's engine (--engine preset, a fresh 16-token prompt each) instead of
    the GIL-free burst, o = the decode's Reserve and its DecodeStream as one bidirectional
    call (the reservation its first answer, the router's copy of the capability its second
    request), w = the router's record call held open until the directory has the decode's
    Publish, which it answers on that call, while the decode sends token 0 as soon as it
    validated: token 0 leaves the router on the directory's word, not the decode's (one
    hop fewer after the publication). JSON lines."""
    ap = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",t,tp,tr,tn,tprn", help="comma-separated; '' is the bare floor")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--compute-ms", type=float, default=3.0)
    ap.add_argument("--kv-bytes", type=int, default=8192)
    ap.add_argument("--engine", default="tiny", help="variant e's preset (the cluster's default model)")
    args = ap.parse_args()
    for rnd in range(args.rounds):
        for v in args.variants.split(","):
            r = measure(args.requests, 5, args.compute_ms, 0.3, args.kv_bytes,
                        tls="t" in v, pool="p" in v, read="r" in v, nonce="n" in v,
                        merged="m" in v, sync="s" in v, engine=args.engine if "e" in v else "", one="o" in v,
                        watch="w" in v)
            med, overhead, paired = overheads(r)
            cpu = {m: {k: round(x, 2) for k, x in r["cpu"][m].items()} for m in r["cpu"]}
            print(json.dumps({"bench": "handoff_floor", "round": rnd, "variant": v or "bare", "cpu": cpu,
                              "colocated_ttft_median_ms": round(med["colocated"], 2),
                              "disaggregated_ttft_median_ms": round(med["disaggregated"], 2),
                              "overhead_ms": round(overhead, 2), "overhead_paired_median_ms": round(paired, 2)}),
                  flush=True)


if __name__ == "__main__":
    main()
