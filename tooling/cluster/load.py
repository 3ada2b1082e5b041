"""Load that shakes a running local cluster, for the fault suite and bench/faults.py:
a storm of cancels, a burst beyond the K/V pool's room, Redis killed under traffic.
Each returns a `LoadResult` with counts by outcome and the cluster's state after
(tooling/cluster/faults.py holds the single-request fault cases)."""

from __future__ import annotations

import dataclasses
import threading
import time

from pdserve_client import Client, PdError
from tooling.cluster.faults import fences, settle, until_disaggregated
from tooling.cluster.launcher import LocalCluster


@dataclasses.dataclass
class LoadResult:
    """What a storm or a burst did: counts by outcome, and the cluster afterwards."""

    name: str
    requests: int
    faults: int
    """Cancels injected (storm) or requests over the pool's room (burst)."""
    ok: int = 0
    failed: int = 0
    """Requests meant to complete that did not (a cancelled one ending is not a failure)."""
    hung: int = 0
    wrong_tokens: int = 0
    held_blocks: int = 0
    open_txns: int = 0
    took_s: float = 0.0
    settle_s: float = 0.0
    errors: list[str] = dataclasses.field(default_factory=list)


def cancel_storm(cluster: LocalCluster, n: int = 1000, seed: int = 1000, concurrency: int = 48,
                 max_tokens: int = 24) -> LoadResult:
    """n requests (prompts of 8-300 tokens, disaggregated and colocated): a third cancelled
    through Router.Cancel, a third by dropping the stream, each 0-250 ms after it
    started; a third left to finish (they must, with max_tokens tokens)."""
    import random
    from concurrent.futures import ThreadPoolExecutor, wait

    rng = random.Random(seed)
    plans = [dict(prompt=[rng.randrange(3, 500) for _ in range(rng.randrange(8, 300))],
                  how=("router_cancel", "drop_stream", "finish")[i % 3], after_s=rng.uniform(0.0, 0.25),
                  mode=rng.choice(["disaggregated", "colocated"])) for i in range(n)]
    out = LoadResult("cancel storm", n, sum(p["how"] != "finish" for p in plans))
    lock = threading.Lock()

    def one(client: Client, i: int) -> None:
        plan = plans[i]
        with client.generate(prompt_ids=plan["prompt"], max_tokens=max_tokens, ignore_eos=True,
                             mode=plan["mode"], request_id=f"storm-{seed}-{i}", deadline_s=60) as stream:
            if plan["how"] != "finish":
                time.sleep(plan["after_s"])
                if plan["how"] == "router_cancel":
                    stream.cancel("storm")
                return
            try:
                ok = len(stream.collect().token_ids) == max_tokens
            except PdError as e:
                ok = False
                with lock:
                    out.errors.append(str(e))
        with lock:
            out.ok += ok
            out.failed += not ok

    t0 = time.monotonic()
    with cluster.client(timeout_s=60) as client, ThreadPoolExecutor(concurrency) as pool:
        futures = [pool.submit(one, client, i) for i in range(n)]
        _, pending = wait(futures, timeout=600)
        out.hung = len(pending)
    out.took_s = time.monotonic() - t0
    (out.held_blocks, out.open_txns, _), out.settle_s = settle(cluster)
    return out


def burst(cluster: LocalCluster, prompts: list[list[int]], mode: str, max_tokens: int = 24,
          deadline_s: float = 90.0) -> LoadResult:
    """Every prompt at once (one injected burst); each must be served at its first
    attempt (queued for room, not shed, no worker refusing for room)."""
    from concurrent.futures import ThreadPoolExecutor

    out = LoadResult(f"burst of {len(prompts)} ({mode})", len(prompts), 1)

    def one(prompt):
        try:
            return client.generate_full(prompt_ids=prompt, max_tokens=max_tokens, mode=mode, ignore_eos=True,
                                        deadline_s=deadline_s)
        except Exception as exc:  # noqa: BLE001 - counted
            return exc

    t0 = time.monotonic()
    with cluster.client(timeout_s=deadline_s + 30) as client, \
            ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(one, prompts))
    out.took_s = time.monotonic() - t0
    for r in results:
        if isinstance(r, Exception):
            out.failed += 1
            out.errors.append(str(r))
        elif len(r.token_ids) == max_tokens and not r.failed_attempts:
            out.ok += 1
        else:
            out.failed += 1
            out.errors.append(r.failed_attempts or f"{len(r.token_ids)} tokens")
    (out.held_blocks, out.open_txns, _), out.settle_s = settle(cluster)
    return out


def redis_restart(cluster: LocalCluster, prompt: list[int], keep_data: bool, max_tokens: int = 4,
                  down_s: float = 1.0) -> LoadResult:
    """Requests keep coming (one at a time, alternating modes) while Redis is SIGKILLed and,
    `down_s` later, restarted with its AOF files or without them. `wrong_tokens` counts
    fence regressions too (a worker epoch or the route epoch that moved backwards would
    let a stale publication through)."""
    import shutil
    import signal

    out = LoadResult(f"redis restart ({'with data' if keep_data else 'data lost'})", 0, 1)
    with cluster.client(timeout_s=30) as c:
        reference = c.generate_full(prompt_ids=prompt, max_tokens=max_tokens, ignore_eos=True,
                                    mode="colocated").token_ids
    time.sleep(1.2)  # appendfsync everysec
    epochs, route_epoch = fences(cluster)
    stop = threading.Event()

    def traffic():
        with cluster.client(timeout_s=30) as c:
            while not stop.is_set():
                mode = ("disaggregated", "colocated")[out.requests % 2]
                out.requests += 1
                try:
                    r = c.generate_full(prompt_ids=prompt, max_tokens=max_tokens, ignore_eos=True, mode=mode,
                                        deadline_s=20)
                    out.ok += 1
                    out.wrong_tokens += list(r.token_ids) != list(reference)
                except Exception as exc:  # noqa: BLE001 - counted
                    out.failed += 1
                    out.errors.append(str(exc))

    t0 = time.monotonic()
    thread = threading.Thread(target=traffic, daemon=True)
    thread.start()
    time.sleep(0.3)
    cluster.signal("redis", signal.SIGKILL)
    if not keep_data:
        for path in cluster.state.glob("appendonly*"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    time.sleep(down_s)
    cluster.restart("redis")
    until_disaggregated(cluster, prompt)
    stop.set()
    thread.join(60)
    out.hung = int(thread.is_alive())
    out.took_s = time.monotonic() - t0
    after, route_after = fences(cluster)
    out.wrong_tokens += sum(after.get(w, e) < e for w, e in epochs.items()) + (route_after < route_epoch)
    (out.held_blocks, out.open_txns, _), out.settle_s = settle(cluster)
    return out
