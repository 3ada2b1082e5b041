"""Helpers for tests that run the real local cluster (processes on loopback).

The cluster runs with mutual TLS: a test speaks to it with one of the certificates
the launcher wrote into its state dir (`client` generates, `operator` administers,
a service's own name when a test poses as that service: `cluster.identity(name)`).
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import grpc.aio

from pdserve_client import Client, contract
from pdserve_client.types import PdError
from runtime.directory.client import DirectoryClient
from tooling.cluster.launcher import REPO_ROOT, ClusterSpec, LocalCluster


def start_cluster(tmp_path, state_name: str = "pdserve", **kw) -> LocalCluster:
    """A started cluster whose state lives in tmp_path/state_name (".pdserve": where
    pdctl and the SDK look for their certificates when run from tmp_path)."""
    spec = ClusterSpec(state_dir=str(tmp_path / state_name), **kw)
    cluster = LocalCluster(spec)
    cluster.up()
    return cluster


def seeded_requests(n: int, seed: int, vocab: int = 512, max_prompt: int = 512,
                    shared_fraction: float = 0.3) -> list[list[int]]:
    """n prompts of 1..max_prompt tokens; some share one of a few long prefixes."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, vocab) for _ in range(rng.randrange(32, 257))] for _ in range(5)]
    prompts = []
    for _ in range(n):
        if rng.random() < shared_fraction:
            head = rng.choice(prefixes)
            tail = [rng.randrange(3, vocab) for _ in range(rng.randrange(1, max_prompt - len(head) + 1))]
            prompts.append(head + tail)
        else:
            prompts.append([rng.randrange(3, vocab) for _ in range(rng.randrange(1, max_prompt + 1))])
    return prompts


def client(cluster: LocalCluster, identity: str = "client", **kw) -> Client:
    """An SDK client of the cluster's router presenting `identity`'s certificate."""
    return cluster.client(identity, **kw)


def pdctl(cluster, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    """pdctl run from the state dir's parent (a cluster started with state_name=".pdserve"),
    no flags but the command's, no PD_TLS_*; killed past `timeout_s` (a drill runs minutes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PD_TLS_", "PD_INSECURE"))}
    env["PYTHONPATH"] = f"{REPO_ROOT}:{REPO_ROOT / 'client'}"
    return subprocess.run([sys.executable, "-m", "pdserve_ops.cli", *args], cwd=cluster.state.parent,
                          env=env, capture_output=True, text=True, timeout=timeout_s)


def tls_env(cluster: LocalCluster, identity: str = "client") -> dict[str, str]:
    """os.environ plus PD_TLS_* naming `identity`'s files (for pdctl as a subprocess)."""
    d = cluster.tls_dir
    return {**os.environ, contract.TLS_CERT_ENV: str(d / f"{identity}.crt"),
            contract.TLS_KEY_ENV: str(d / f"{identity}.key"), contract.TLS_CA_ENV: str(d / contract.TLS_CA_FILE)}


def directory(cluster: LocalCluster, identity: str = "operator", timeout_s: float = 5.0) -> DirectoryClient:
    """A DirectoryClient presenting `identity`'s certificate (create it inside the event loop)."""
    return DirectoryClient(cluster.directory_address, timeout_s, cluster.identity(identity))


def address(cluster: LocalCluster, name: str) -> str:
    """Where service `name` (router, directory, decode-0, ...) listens."""
    return cluster.router_address if name == "router" else cluster.procs[name].address


def channel(cluster: LocalCluster, name: str, identity: str, service: str | None = None,
            options=()) -> grpc.Channel:
    """A blocking channel to service `name` presenting `identity`'s certificate; `service`
    (decode, prefill, ...) picks which one a mixed worker answers as."""
    service = service or contract.SERVER_ROLES[cluster.roles[name]][0]
    return cluster.identity(identity).channel(address(cluster, name), service, options)


def aio_channel(cluster: LocalCluster, name: str, identity: str, service: str | None = None,
                options=()) -> grpc.aio.Channel:
    """The asyncio twin of `channel` (create it inside the event loop)."""
    service = service or contract.SERVER_ROLES[cluster.roles[name]][0]
    return cluster.identity(identity).aio_channel(address(cluster, name), service, options)


def _directory(cluster: LocalCluster):
    async def go():
        async with directory(cluster) as d:
            return await d.snapshot(), await d.list_open()
    return asyncio.run(go())


def assert_cluster_clean(cluster: LocalCluster, timeout_s: float = 15.0) -> None:
    """Leak check: no open transaction, and every worker holds no block (all free or
    cached prefix). Holdings come from the router's Admin.Blocks, so a failure names
    the holders (request, tenant, state, blocks, orphan or not); a worker the router
    cannot reach, or every worker when the router itself is down, is judged by the
    load it last reported to the directory."""
    deadline = time.monotonic() + timeout_s
    with client(cluster, "operator", timeout_s=10) as ops:
        while True:
            snap, open_txns = _directory(cluster)
            holders, unanswered = _holders(ops)
            leaks = [(w.worker_id, f"free {w.load.free_blocks}/{w.load.total_blocks}",
                      f"reserved {w.load.reserved_blocks}", f"active {w.load.active_blocks}")
                     for w in snap.workers if unanswered is None or w.worker_id in unanswered
                     if w.load.free_blocks != w.load.total_blocks or w.load.reserved_blocks
                     or w.load.active_blocks]
            if not leaks and not holders and not open_txns:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"leaks: holders {holders}, workers {leaks}, open transactions "
                                     f"{[(t.transfer_id, t.state) for t in open_txns]}")
            time.sleep(0.3)


def _holders(ops: Client) -> tuple[list[str], set[str] | None]:
    """(every holding as one line, the workers that did not answer); None for the
    latter when the router gave no answer at all."""
    try:
        view = ops.blocks()
    except PdError:
        return [], None
    return ([f"{w.worker_id}: {h.request_id or '?'} tenant {h.tenant or '?'} {h.transfer_id or '-'} {h.state} "
             f"{h.charged_blocks}/{h.num_blocks} blocks age {h.age_s:.1f}s"
             + (f" ORPHAN ({h.orphan_reason})" if h.orphan else "")
             for w in view.workers for h in w.holdings],
            {w.worker_id for w in view.workers if w.error})


def generate_all(cluster: LocalCluster, prompts: list[list[int]], concurrency: int = 8, raise_errors: bool = True,
                 **kwargs) -> list:
    """generate_full for every prompt, `concurrency` at a time, results in prompt order
    (kwargs: max_tokens, mode, ignore_eos, ...); with raise_errors False a failed
    request's place holds its exception."""
    def one(prompt):
        try:
            return sdk.generate_full(prompt_ids=prompt, **kwargs)
        except Exception as exc:  # reported in place
            if raise_errors:
                raise
            return exc

    with client(cluster, timeout_s=120) as sdk, ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, prompts))


def router_events(cluster: LocalCluster, request, identity: str = "client", timeout_s: float = 90.0):
    """One GenerateRequest through the router's gRPC API: (its Started events, its tokens,
    each token's arrival in s from the call, its Complete event or None)."""
    from pdserve_client.rpc.pd.v1 import router_pb2_grpc

    started, tokens, times, complete = [], [], [], None
    with channel(cluster, "router", identity) as ch:
        t0 = time.monotonic()
        for event in router_pb2_grpc.RouterStub(ch).Generate(request, timeout=timeout_s):
            kind = event.WhichOneof("event")
            if kind == "started":
                started.append(event.started)
            elif kind == "token":
                tokens.append(event.token.token_id)
                times.append(time.monotonic() - t0)
            elif kind == "complete":
                complete = event.complete
    return started, tokens, times, complete
