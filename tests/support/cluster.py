"""Helpers for tests that run the real local cluster (processes on loopback)."""

from __future__ import annotations

import asyncio
import random
import time
from concurrent.futures import ThreadPoolExecutor

from pdserve_client import Client
from services.cluster.launcher import ClusterSpec, LocalCluster
from services.directory.client import DirectoryClient


def start_cluster(tmp_path, **kw) -> LocalCluster:
    """A started cluster whose state lives under tmp_path."""
    spec = ClusterSpec(state_dir=str(tmp_path / "pdserve"), **kw)
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


def _directory(cluster: LocalCluster):
    async def go():
        async with DirectoryClient(cluster.directory_address) as d:
            return await d.snapshot(), await d.list_open()
    return asyncio.run(go())


def assert_cluster_clean(cluster: LocalCluster, timeout_s: float = 15.0) -> None:
    """Leak check: no open transaction, and every worker reports all blocks free."""
    deadline = time.monotonic() + timeout_s
    while True:
        snap, open_txns = _directory(cluster)
        leaks = [(w.worker_id, f"free {w.load.free_blocks}/{w.load.total_blocks}",
                  f"reserved {w.load.reserved_blocks}", f"active {w.load.active_blocks}")
                 for w in snap.workers
                 if w.load.free_blocks != w.load.total_blocks or w.load.reserved_blocks
                 or w.load.active_blocks]
        if not leaks and not open_txns:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"leaks: workers {leaks}, open transactions "
                                 f"{[(t.transfer_id, t.state) for t in open_txns]}")
        time.sleep(0.3)


def generate_all(address: str, prompts: list[list[int]], concurrency: int = 8, raise_errors: bool = True,
                 **kwargs) -> list:
    """generate_full for every prompt, `concurrency` at a time, results in prompt order
    (kwargs: max_tokens, mode, ignore_eos, ...); with raise_errors False a failed
    request's place holds its exception."""
    def one(prompt):
        try:
            return client.generate_full(prompt_ids=prompt, **kwargs)
        except Exception as exc:  # reported in place
            if raise_errors:
                raise
            return exc

    with Client(address, timeout_s=120) as client, ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, prompts))
