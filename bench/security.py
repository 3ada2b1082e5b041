"""Security benchmark: what mutual TLS and transfer capabilities cost (docs/design.md, Security).

Part 1, micro (in this process): the router's `Signer.mint` and a worker's
`Verifier.authorize` of a one-block capability (a 16-token prompt), µs per call,
median of --micro-batches batches of --micro-calls calls.

Part 2, bandwidth: one 64 MiB chunk set (bench/transfer.py's synthetic cache and
chunk plan) pushed between two spawned processes (bench/_security_peers.py), per
variant of the data plane:

  tcp           TcpSender/TcpReceiver, plaintext, no credential (PD_INSECURE=1)
  tcp-tls       the same stream under mutual TLS (decode-0 / prefill-0 certificates)
  tcp-tls+cap   TLS and a capability presented (AUTH) and checked before the chunks:
                what a secure cluster runs
  ucx           UcxSender/UcxReceiver, no credential
  ucx+cap       a capability presented and checked; the bytes carry no TLS

Variants take turns within each repeat (noise hits all of them); the first round
is a warm-up. Each transfer lands in a zeroed receiver cache and must match the
sender's digest. Timed from AUTH (or the first checksum) to the verdict; gbps is
1e9 bytes/s, the median of --repeats; ratio_vs_plain = gbps over the same
backend's plain variant in this run.

Part 3, ttft: two local clusters at once (1 prefill + 1 decode, --model, --transport),
one secure (the default) and one with `insecure=True` (PD_INSECURE=1: plaintext,
no certificates, no capabilities). After --warmup requests each, --requests
disaggregated requests each (fresh random --prompt-tokens prompt, --max-tokens,
ignore_eos) alternate between them, the order swapped every pair. Client-side TTFT
(the SDK's) per cluster: median and p90; the added ms = median secure - median
insecure (also the median of the per-pair differences), ratio = secure / insecure,
against the target (< 2 ms).

JSON lines: {"bench": "security", "metric": "config" | "micro" | "bandwidth" | "ttft"
| "ttft_added", ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _security_peers import ABI, DESTINATION, ISSUER, PUBLIC_KEYS, SIGNING_KEY, SOURCE, TENANT, TTL_MS
from _spawned import Spawned
from transfer import geometry

from pdserve_client import Client, contract
from runtime.security.capability import PUSH, Grant, Signer, TransferAsk, Verifier, generate_signing_key
from runtime.security.pki import Identity, LocalCA
from runtime.transfer.keys import new_key

MIB = 1 << 20
TARGET_ADDED_TTFT_MS = 2.0
# (variant, backend, tls, capability, plain variant of the same backend)
VARIANTS = (("tcp", "tcp", False, False, "tcp"), ("tcp-tls", "tcp", True, False, "tcp"),
            ("tcp-tls+cap", "tcp", True, True, "tcp"), ("ucx", "ucx", False, False, "ucx"),
            ("ucx+cap", "ucx", False, True, "ucx"))


def emit(**row) -> None:
    print(json.dumps({"bench": "security", **row}), flush=True)


def make_identities(tls_dir: Path) -> None:
    """One CA, the two workers' certificates and the router's capability key pair."""
    ca = LocalCA(tls_dir)
    ca.issue(Identity("decode", DESTINATION))
    ca.issue(Identity("prefill", SOURCE))
    generate_signing_key(tls_dir / SIGNING_KEY, tls_dir / PUBLIC_KEYS)


# ---- part 1: micro -------------------------------------------------------------------
def per_call_us(fn, calls: int, batches: int) -> float:
    out = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(out)


def micro_part(args, tls_dir: Path) -> None:
    signer = Signer.from_file(tls_dir / SIGNING_KEY, ISSUER)
    verifier = Verifier.from_file(tls_dir / PUBLIC_KEYS, [ISSUER], TTL_MS)
    block_bytes = 16 * 2 * 4096  # one 16-token block; the bound matters, not its size
    grant = Grant(TENANT, SOURCE, 1, DESTINATION, 1, "t-1", 1, 0, ABI, PUSH, (7,), block_bytes, TTL_MS)
    minted = signer.mint(grant)
    ask = TransferAsk(TENANT, SOURCE, 1, DESTINATION, 1, "t-1", 1, ABI, PUSH, (7,), block_bytes, minted.nonce)
    mint_us = per_call_us(lambda: signer.mint(grant), args.micro_calls, args.micro_batches)
    authorize_us = per_call_us(lambda: verifier.authorize(minted.raw, ask, 0, time.time_ns() // 1_000_000),
                               args.micro_calls, args.micro_batches)
    emit(metric="micro", mint_us=round(mint_us, 1), authorize_us=round(authorize_us, 1),
         capability_bytes=len(minted.raw), calls=args.micro_calls, batches=args.micro_batches)


# ---- part 2: bandwidth ---------------------------------------------------------------
def bandwidth_part(args, tls_dir: Path) -> None:
    size_bytes = args.size_mib * MIB
    g = geometry(size_bytes, args.layers, args.block_kib * 1024, args.max_chunk_blocks)
    r, s = (Spawned(name, "_security_peers:SecurePeer", call_timeout_s=300, tls_dir=str(tls_dir))
            for name in ("receiver", "sender"))
    runs: dict[str, list[float]] = {v[0]: [] for v in VARIANTS}
    try:
        r.call("alloc", geometry=g.__dict__)
        sent = s.call("alloc", geometry=g.__dict__, fill_seed=args.size_mib)
        dests = {}
        for variant, kind, tls, cap, _ in VARIANTS:
            dests[variant] = r.call("sec_listen", variant=variant, kind=kind, tls=tls, cap=cap)
            s.call("sec_connect", variant=variant, kind=kind, tls=tls)
        for i in range(args.repeats + 1):
            for variant, _, _, cap, _ in VARIANTS:
                tid, key = f"{variant}-{i}", new_key().hex()  # the router's part: a secret per attempt
                r.call("sec_expect", variant=variant, transfer_id=tid, key=key)
                out = s.call("sec_send", variant=variant, dest=dests[variant], transfer_id=tid,
                             kv_digest=sent, cap=cap, key=key)
                res = r.call("pd_result", kind=variant, transfer_id=tid)
                if not out["published"] or res["state"] != "published" or res["digest"] != sent:
                    raise RuntimeError(f"{variant}: not published or wrong bytes ({out} / {res})")
                if i:
                    runs[variant].append(out["elapsed_s"])
    finally:
        r.close()
        s.close()
    gbps = {v: size_bytes / statistics.median(t) / 1e9 for v, t in runs.items()}
    for variant, kind, tls, cap, plain in VARIANTS:
        emit(metric="bandwidth", size_mib=args.size_mib, variant=variant, backend=kind, tls=tls,
             capability=cap, gbps=round(gbps[variant], 3),
             ratio_vs_plain=round(gbps[variant] / gbps[plain], 3),
             ms=[round(t * 1000, 1) for t in runs[variant]], chunks=len(g.plan()))


# ---- part 3: TTFT ------------------------------------------------------------------------
def insecure_client(address: str) -> Client:
    """A plaintext SDK client: tls.resolve gives None only under $PD_INSECURE (an explicit
    None means "look for files"), so set it just while the client is made."""
    old = os.environ.get(contract.INSECURE_ENV)
    os.environ[contract.INSECURE_ENV] = "1"
    try:
        return Client(address, timeout_s=60)
    finally:
        if old is None:
            del os.environ[contract.INSECURE_ENV]
        else:
            os.environ[contract.INSECURE_ENV] = old


def p90(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=10)[8]


def ttft_part(args) -> None:
    from runtime.engine.presets import preset_config
    from tooling.cluster.launcher import ClusterSpec, LocalCluster

    vocab = preset_config(args.model).vocab_size
    rng = random.Random(args.seed)
    names = ("secure", "insecure")
    clusters: dict[str, LocalCluster] = {}
    ttft: dict[str, list[float]] = {n: [] for n in names}
    server: dict[str, list[float]] = {n: [] for n in names}
    try:
        for name in names:
            state = tempfile.mkdtemp(prefix=f"pdserve-bench-security-{name}-")
            clusters[name] = LocalCluster(ClusterSpec(
                prefill=1, decode=1, model=args.model, transport=args.transport, state_dir=state,
                insecure=name == "insecure"))
            clusters[name].up()
        clients = {"secure": clusters["secure"].client(timeout_s=60),
                   "insecure": insecure_client(clusters["insecure"].router_address)}
        for i in range(args.warmup + args.requests):
            for name in names if i % 2 == 0 else names[::-1]:
                prompt = [rng.randrange(3, vocab) for _ in range(args.prompt_tokens)]
                res = clients[name].generate_full(prompt_ids=prompt, max_tokens=args.max_tokens,
                                                  mode="disaggregated", ignore_eos=True, deadline_s=60)
                if res.route != "disaggregated" or res.attempts != 1:
                    raise RuntimeError(f"{name}: ran {res.route} after {res.attempts} attempts "
                                       f"({res.failed_attempts}; logs in {clusters[name].state}/logs)")
                if i >= args.warmup:
                    ttft[name].append(res.ttft_ms)
                    server[name].append(res.server_ttft_ms)
        for c in clients.values():
            c.close()
        rpc_ms = asyncio.run(directory_rpc_ms(clusters, args.rpc_calls))
    finally:
        for c in clusters.values():
            c.down()
    for c in clusters.values():
        shutil.rmtree(c.state, ignore_errors=True)  # kept only when something failed
    med = {n: statistics.median(ttft[n]) for n in names}
    for n in names:
        emit(metric="ttft", cluster=n, requests=len(ttft[n]), ttft_median_ms=round(med[n], 2),
             ttft_p90_ms=round(p90(ttft[n]), 2), router_ttft_median_ms=round(statistics.median(server[n]), 2))
    added = med["secure"] - med["insecure"]
    paired = statistics.median(a - b for a, b in zip(ttft["secure"], ttft["insecure"], strict=True))
    emit(metric="ttft_added", prompt_tokens=args.prompt_tokens, added_ms=round(added, 2),
         added_paired_median_ms=round(paired, 2), ratio=round(med["secure"] / med["insecure"], 3),
         added_router_ms=round(statistics.median(server["secure"]) - statistics.median(server["insecure"]), 2),
         target_ms=TARGET_ADDED_TTFT_MS, met=added < TARGET_ADDED_TTFT_MS)
    emit(metric="directory_rpc", calls=args.rpc_calls, **{f"{n}_median_ms": round(v, 3) for n, v in rpc_ms.items()},
         note="one directory round trip as decode-0 (Lookup); a secure hand-off adds one such call "
              "(ConsumeNonce) that an insecure cluster does not make")


async def directory_rpc_ms(clusters: dict, calls: int) -> dict[str, float]:
    """Median ms of one directory round trip as decode-0 (Lookup of an unknown transfer: a
    gRPC call and a Redis read), per cluster, interleaved. A secure hand-off adds such a
    call (ConsumeNonce: a lookup, then a Redis script); plaintext vs TLS shows its cost."""
    from runtime.directory.client import DirectoryClient
    dirs = {n: DirectoryClient(c.directory_address, security=c.identity(DESTINATION)) for n, c in clusters.items()}
    out: dict[str, list[float]] = {n: [] for n in dirs}
    try:
        for i in range(calls + 1):
            for n, d in dirs.items():
                t0 = time.perf_counter()
                assert await d.lookup(f"bench-{i}", f"bench-{i}") is None
                out[n].append((time.perf_counter() - t0) * 1000)
    finally:
        for d in dirs.values():
            await d.close()
    return {n: statistics.median(ms[1:]) for n, ms in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="micro,bandwidth,ttft")
    ap.add_argument("--micro-calls", type=int, default=500)
    ap.add_argument("--micro-batches", type=int, default=5)
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=9, help="timed transfers per variant")
    ap.add_argument("--layers", type=int, default=32, help="synthetic cache layers")
    ap.add_argument("--block-kib", type=int, default=32, help="K+V bytes of one block per layer")
    ap.add_argument("--max-chunk-blocks", type=int, default=64)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--transport", default="ucx")
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=5, help="untimed requests per cluster")
    ap.add_argument("--requests", type=int, default=80, help="timed requests per cluster")
    ap.add_argument("--rpc-calls", type=int, default=100, help="timed directory round trips per cluster")
    ap.add_argument("--seed", type=int, default=17)
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    emit(metric="config", parts=sorted(parts), cpus=os.cpu_count(), size_mib=args.size_mib,
         repeats=args.repeats, geometry=f"{args.layers} layers x {args.block_kib} KiB blocks, "
                                        f"<= {args.max_chunk_blocks} blocks/chunk",
         model=args.model, transport=args.transport, prompt_tokens=args.prompt_tokens,
         max_tokens=args.max_tokens, warmup=args.warmup, requests=args.requests,
         timing="bandwidth: AUTH/first checksum -> verdict, median; ttft: SDK client-side")
    tls_dir = Path(tempfile.mkdtemp(prefix="pdserve-bench-security-tls-"))
    try:
        make_identities(tls_dir)
        if "micro" in parts:
            micro_part(args, tls_dir)
        if "bandwidth" in parts:
            bandwidth_part(args, tls_dir)
        if "ttft" in parts:
            ttft_part(args)
    finally:
        shutil.rmtree(tls_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
