"""vLLM behind pdserve, against vLLM's own disaggregated prefill and against vLLM alone
(docs/benchmarks.md, "vLLM behind the hand-off"; `make bench-vllm`).

Three systems, one after the other on the same two cores, over the same checkpoint (the
`small` preset exported), greedy with ignore_eos, every prompt fresh (no prefix-cache hit):

    vllm-pd        vLLM's own disaggregated prefill: two OpenAI servers with NixlConnector
                   (kv_buffer_device cpu, the nixl-cu12 wheel), the prefill bound to core 0,
                   the decode to core 1; this process makes the proxy's two calls (prefill
                   with do_remote_decode, then the decode with the returned transfer params)
    pdserve-vllm   pdserve's local cluster whose prefill-0 and decode-0 run vLLM (PD_ENGINE=
                   vllm), bound to core 0 and core 1; requests through the router (mTLS)
                   with its defaults: a vLLM-CPU prefill sends the K/V after the compute
                   (as vLLM's decode pulls it after the prefill)
    pdserve-vllm-streamed  the same with PD_STREAM_LAYERS=1: each layer's K/V leaves as vLLM's
                   attention reports it written, during the compute (a GPU worker's
                   default); on a worker bound to one core its sends share that core with
                   the compute
    vllm-alone     one OpenAI server, no connector, bound to core 0

Each system's colocated run is on core 0 alone (vLLM: the same prefill server without the
remote-decode flag; pdserve: the router's colocated mode, on either worker).

Rows (JSON lines), ratios from this run:
    ttft            median time to the first token (and to token 1), per system, mode and
                    prompt length
    added_ttft      what disaggregation adds to TTFT (disaggregated - colocated medians):
                    pdserve's against vLLM's own; target pdserve <= vLLM (ratio <= 1)
    colocated       pdserve with vLLM workers against vLLM alone, colocated: TTFT (ratio
                    vLLM / pdserve) and decode tokens/s of one stream (ratio pdserve / vLLM);
                    target >= 0.95 each
Tokens: each system's disaggregated tokens are checked against its colocated ones; and
    batched_equality  12 greedy requests disaggregated at once against each alone, colocated
                   (vLLM-CPU is not batch-invariant: equality measured, not promised)
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.engine.checkpoint import export_preset
from tooling.cluster.launcher import VLLM_PYTHON, ClusterSpec, LocalCluster

LENGTHS = (16, 2048)
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
DECODE_TOKENS = 128
BLOCK, BLOCKS = 128, 48
VOCAB = 32000
rng = random.Random(58)


def emit(**row) -> None:
    print(json.dumps({"bench": "vllm", **row}), flush=True)


def fresh(n: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(n)]


# ---- vLLM's OpenAI servers ------------------------------------------------------------------
class Server:
    """One vLLM OpenAI server bound to `core` (its engine core process inherits the binding)."""

    def __init__(self, model: Path, port: int, core: int, nixl_port: int = 0, log: Path | None = None,
                 block: int = BLOCK):
        self.port, self.model = port, str(model)
        args = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                "--port", str(port), "--enforce-eager", "--dtype", "float32", "--max-model-len", "4096",
                "--block-size", str(block), "--kv-cache-memory-bytes", str(BLOCKS * 8 * 2 * 2 * BLOCK * 64 * 4),
                "--skip-tokenizer-init", "--seed", "0"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if nixl_port:
            args += ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both",
                                                         "kv_buffer_device": "cpu"})]
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(nixl_port)
        out = open(log or os.devnull, "wb")
        self.proc = subprocess.Popen(["taskset", "-c", str(core), *args], env=env, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server on {self.port} exited {self.proc.returncode}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2).close()
                return
            except OSError:
                time.sleep(1)
        raise TimeoutError(f"vLLM server on {self.port} not up in {timeout_s} s")

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def complete(self, prompt: list[int], max_tokens: int, stream: bool = False, **extra):
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True, "stream": stream, **extra}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        return urllib.request.urlopen(req, timeout=300)

    def stream(self, prompt: list[int], max_tokens: int, t0: float, **extra) -> tuple[list[int], list[float]]:
        """(tokens, arrival time of each, from t0) of a streamed completion."""
        tokens, times = [], []
        with self.complete(prompt, max_tokens, stream=True, **extra) as s:
            for line in s:
                line = line.decode().strip()
                if not line.startswith("data:") or line.endswith("[DONE]"):
                    continue
                ids = json.loads(line[5:])["choices"][0].get("token_ids") or []
                now = time.perf_counter() - t0
                tokens += ids
                times += [now] * len(ids)
        return tokens, times


REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}


def vllm_pd(p: Server, d: Server, prompt: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
    """vLLM's proxy flow: the prefill with do_remote_decode, then the decode pulls its K/V."""
    t0 = time.perf_counter()
    with p.complete(prompt, 1, kv_transfer_params=REMOTE_DECODE) as r:
        params = json.loads(r.read())["kv_transfer_params"]
    return d.stream(prompt, max_tokens, t0, kv_transfer_params=params)


def vllm_alone(s: Server, prompt: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
    return s.stream(prompt, max_tokens, time.perf_counter())


# ---- pdserve with vLLM workers ---------------------------------------------------------------
def pdserve(sdk, prompt: list[int], max_tokens: int, mode: str) -> tuple[list[int], list[float]]:
    t0 = time.perf_counter()
    tokens, times = [], []
    with sdk.generate(prompt_ids=prompt, max_tokens=max_tokens, ignore_eos=True, mode=mode) as stream:
        for event in stream:
            tokens.append(event.token_id)
            times.append(time.perf_counter() - t0)
    return tokens, times


def bind(cluster: LocalCluster, name: str, core: int) -> None:
    """Every thread of worker `name` onto `core`."""
    subprocess.run(["taskset", "-a", "-p", "-c", str(core), str(cluster.procs[name].pid)], check=True,
                   capture_output=True)


# ---- measuring ---------------------------------------------------------------------------------
def ttfts(run, modes: tuple[str, ...], system: str) -> dict[tuple[str, int], float]:
    """Median TTFT (ms) per (mode, length) over ROUNDS fresh prompts each, after one warm-up;
    each disaggregated run's tokens checked against a colocated run of its prompt (untimed)."""
    med = {}
    for n in LENGTHS:
        samples: dict[str, list[float]] = {m: [] for m in modes}
        second: dict[str, list[float]] = {m: [] for m in modes}
        equal = True
        for r in range(ROUNDS + 1):
            for m in modes:
                prompt = fresh(n)
                tokens, times = run(prompt, 8, m)
                if m == "disaggregated":
                    equal &= tokens == run(prompt, 8, "colocated")[0]
                if r:  # round 0 warms up
                    samples[m].append(times[0] * 1000)
                    second[m].append(times[1] * 1000)
        for m in modes:
            med[(m, n)] = statistics.median(samples[m])
            emit(metric="ttft", system=system, mode=m, prompt_tokens=n, median_ms=round(med[(m, n)], 1),
                 samples_ms=[round(x, 1) for x in samples[m]],
                 token_1_median_ms=round(statistics.median(second[m]), 1))
        if "disaggregated" in modes:
            emit(metric="tokens", system=system, prompt_tokens=n, disaggregated_equals_colocated=equal)
    return med


def decode_rate(run, system: str) -> float:
    """Tokens/s of one stream's decode (after token 0), median of ROUNDS."""
    rates = []
    for r in range(ROUNDS + 1):
        _, times = run(fresh(64), DECODE_TOKENS)
        if r:
            rates.append((len(times) - 1) / (times[-1] - times[0]))
    emit(metric="decode_rate", system=system, tokens=DECODE_TOKENS, median_tok_s=round(statistics.median(rates), 1))
    return statistics.median(rates)


def batched_equality(sdk, system: str, n: int = 12) -> None:
    """vLLM-CPU is not batch-invariant: how many of `n` greedy requests, run disaggregated all
    at once (decoded in one batch), give the tokens each gives colocated and alone."""
    import threading

    prompts = [fresh(rng.randrange(100, 300)) for _ in range(n)]  # all of them fit the pool at once
    together: dict[int, list[int]] = {}

    def run(i: int) -> None:
        together[i] = pdserve(sdk, prompts[i], 32, "disaggregated")[0]
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    equal = sum(together[i] == pdserve(sdk, p, 32, "colocated")[0] for i, p in enumerate(prompts))
    emit(metric="batched_equality", system=system, requests=n, tokens=32, equal_to_colocated_alone=equal,
         note="measured, not promised: vLLM-CPU is not batch-invariant")


def run_pdserve(tmp: Path, env: dict[str, str], system: str) -> tuple[dict, float]:
    """pdserve with vLLM workers (`env` over the workers' defaults): TTFT medians, and the
    decode rate of one colocated stream (the default configuration only)."""
    cluster = LocalCluster(ClusterSpec(prefill=1, decode=1, engine="vllm", model="small", block_size=BLOCK,
                                       num_blocks=BLOCKS, transport="ucx", state_dir=str(tmp / system),
                                       traces=False, env={"PD_PROFILE_BUDGET_S": "1", **env}))
    cluster.up()
    try:
        bind(cluster, "prefill-0", 0), bind(cluster, "decode-0", 1)
        with cluster.client("client") as sdk:
            med = ttfts(lambda prompt, n, m: pdserve(sdk, prompt, n, m), ("disaggregated", "colocated"), system)
            rate = 0.0 if env else decode_rate(lambda prompt, n: pdserve(sdk, prompt, n, "colocated"), system)
            if not env:
                batched_equality(sdk, system)
    finally:
        cluster.down()
    return med, rate


def main() -> None:
    if not VLLM_PYTHON.exists():
        sys.exit(f"bench/vllm.py: {VLLM_PYTHON} is missing (make vllm-env)")
    tmp = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    model = export_preset("small", tmp / "small")
    emit(metric="setup", cores=os.cpu_count(), rounds=ROUNDS, lengths=LENGTHS, block=BLOCK, model="small",
         cpu=subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                            capture_output=True, text=True).stdout.strip())

    p, d = Server(model, 8100, 0, 5600, tmp / "p.log"), Server(model, 8200, 1, 5601, tmp / "d.log")
    try:
        p.wait(), d.wait()
        theirs = ttfts(lambda prompt, n, m: vllm_pd(p, d, prompt, n) if m == "disaggregated"
                       else vllm_alone(p, prompt, n), ("disaggregated", "colocated"), "vllm-pd")
    finally:
        p.stop(), d.stop()

    ours, our_rate = run_pdserve(tmp, {}, "pdserve-vllm")
    streamed, _ = run_pdserve(tmp, {"PD_STREAM_LAYERS": "1"}, "pdserve-vllm-streamed")

    alone = Server(model, 8300, 0, 0, tmp / "alone.log")
    try:
        alone.wait()
        base = ttfts(lambda prompt, n, m: vllm_alone(alone, prompt, n), ("colocated",), "vllm-alone")
        base_rate = decode_rate(lambda prompt, n: vllm_alone(alone, prompt, n), "vllm-alone")
    finally:
        alone.stop()

    for n in LENGTHS:
        added_ours = ours[("disaggregated", n)] - ours[("colocated", n)]
        added_theirs = theirs[("disaggregated", n)] - theirs[("colocated", n)]
        emit(metric="added_ttft", prompt_tokens=n, pdserve_ms=round(added_ours, 1), vllm_ms=round(added_theirs, 1),
             ratio=round(added_ours / added_theirs, 3) if added_theirs > 0 else None, target="pdserve <= vllm",
             met=added_ours <= added_theirs, baseline="each system's colocated run on its own processes")
        # vLLM's servers with NixlConnector are themselves slower than a plain one (measured
        # here): what its disaggregation costs against vLLM alone, beside the row above.
        added_alone = theirs[("disaggregated", n)] - base[("colocated", n)]
        emit(metric="added_ttft_vs_vllm_alone", prompt_tokens=n, pdserve_ms=round(added_ours, 1),
             vllm_ms=round(added_alone, 1), ratio=round(added_ours / added_alone, 3) if added_alone > 0 else None,
             target="pdserve <= vllm", met=added_ours <= added_alone,
             baseline="vLLM: its P/D against one plain vLLM server; pdserve: against its colocated run")
        added_streamed = streamed[("disaggregated", n)] - streamed[("colocated", n)]
        emit(metric="added_ttft_streamed", prompt_tokens=n, pdserve_ms=round(added_streamed, 1),
             vllm_ms=round(added_theirs, 1),
             ratio=round(added_streamed / added_theirs, 3) if added_theirs > 0 else None,
             target="pdserve <= vllm", met=added_streamed <= added_theirs,
             baseline="pdserve with PD_STREAM_LAYERS=1 (each layer sent during the compute)")
        ratio = base[("colocated", n)] / ours[("colocated", n)]
        emit(metric="colocated_ttft", prompt_tokens=n, pdserve_ms=round(ours[("colocated", n)], 1),
             vllm_ms=round(base[("colocated", n)], 1), ratio=round(ratio, 3), target=">= 0.95", met=ratio >= 0.95)
    ratio = our_rate / base_rate
    emit(metric="colocated_decode", pdserve_tok_s=round(our_rate, 1), vllm_tok_s=round(base_rate, 1),
         ratio=round(ratio, 3), target=">= 0.95", met=ratio >= 0.95)


if __name__ == "__main__":
    main()
