"""The device check (`make gpu-check`): what only an NVIDIA GPU can show of vLLM behind
pdserve's hand-off, in one run sized for 8 minutes on one GPU. Never part of `make test`.

    environment  nvidia-smi sees a GPU; vLLM's environment imports vLLM with CUDA
    contract     the engine contract through vLLM's engine on CUDA (K/V staged through host
                 buffers: kv_memory.py), with VLLM_BATCH_INVARIANT=1: digests equal, tokens
                 equal to colocated, every block back (tests/support/vllm_contract.py)
    hand-off     two vLLM workers on the same GPU (prefill-0, decode-0) behind the router:
                 disaggregated tokens against colocated for greedy prompts of 16..2,048
    throughput   the same cluster, colocated decode tokens/s of 8 concurrent streams,
                 against one vLLM OpenAI server alone on the same GPU (ratio)

Rows are JSON lines on stdout and in bench/results/gpu-check.jsonl; a step that cannot run
says why (`ok: false, why: ...`) and the rest still run where they can. The model is the
`small` preset exported (no download: a device machine may reach no network) unless
GPU_CHECK_MODEL names a checkpoint directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runtime.engine.checkpoint import export_preset  # noqa: E402
from tooling.cluster.launcher import VLLM_PYTHON, ClusterSpec, LocalCluster  # noqa: E402

OUT = REPO / "bench" / "results" / "gpu-check.jsonl"
rows: list[dict] = []


def emit(**row) -> None:
    row = {"bench": "gpu-check", **row}
    rows.append(row)
    print(json.dumps(row), flush=True)


def environment() -> bool:
    smi = shutil.which("nvidia-smi")
    gpus = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout.strip() if smi else ""
    if not gpus:
        emit(check="environment", ok=False, why="no NVIDIA GPU (nvidia-smi -L lists none)")
        return False
    probe = "import torch, vllm; print(vllm.__version__, torch.__version__, torch.cuda.is_available())"
    got = subprocess.run([str(VLLM_PYTHON), "-c", probe], capture_output=True, text=True) \
        if VLLM_PYTHON.exists() else None
    if got is None or got.returncode != 0 or not got.stdout.strip().endswith("True"):
        why = "vLLM's environment is missing (make vllm-env on this host)" if got is None else \
            (got.stderr.strip().splitlines() or ["torch sees no CUDA device"])[-1]
        emit(check="environment", ok=False, gpus=gpus.splitlines(), why=why)
        return False
    emit(check="environment", ok=True, gpus=gpus.splitlines(), vllm_torch_cuda=got.stdout.split())
    return True


def contract(model: Path) -> None:
    env = {**os.environ, "VLLM_BATCH_INVARIANT": "1"}
    out = subprocess.run([str(VLLM_PYTHON), "-m", "tests.support.vllm_contract", str(model), "auto"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=240)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        emit(check="contract", ok=False, why=out.stderr.strip()[-2000:])
        return
    report = json.loads(lines[0].removeprefix("RESULT "))
    cases = [v for k, v in report.items() if isinstance(v, dict) and "tokens_equal" in v]
    ok = bool(cases) and all(c["tokens_equal"] and c["digests_equal"] for c in cases) \
        and all(report["failures"].values()) and not report["left"]["held_blocks"]
    emit(check="contract", ok=ok, report=report)


def cluster_checks(model: Path, tmp: Path) -> None:
    import random

    spec = ClusterSpec(prefill=1, decode=1, engine="vllm", model=str(model), block_size=16, num_blocks=4096,
                       chunk_tokens=2048, transport="ucx", state_dir=str(tmp / "cluster"), traces=False,
                       env={"VLLM_BATCH_INVARIANT": "1", "PD_VLLM_ARGS": json.dumps({"gpu_memory_utilization": 0.3})})
    cluster = LocalCluster(spec)
    t0 = time.perf_counter()
    try:
        cluster.up(timeout_s=300)
    except Exception as exc:  # noqa: BLE001 - reported, the check goes on
        emit(check="hand-off", ok=False, why=f"the cluster did not start: {exc}")
        return
    emit(check="cluster", ok=True, start_s=round(time.perf_counter() - t0, 1))
    rng = random.Random(58)
    try:
        with cluster.client("client") as sdk:
            results = []
            for n in (16, 300, 2048):
                prompt = [rng.randrange(3, 32000) for _ in range(n)]
                split = sdk.generate_full(prompt_ids=prompt, max_tokens=32, mode="disaggregated", ignore_eos=True)
                alone = sdk.generate_full(prompt_ids=prompt, max_tokens=32, mode="colocated", ignore_eos=True)
                results.append({"prompt_tokens": n, "route": split.route, "equal": split.token_ids == alone.token_ids,
                                "ttft_ms": round(split.ttft_ms, 1), "colocated_ttft_ms": round(alone.ttft_ms, 1)})
            emit(check="hand-off", ok=all(r["equal"] and r["route"] == "disaggregated" for r in results),
                 batch_invariant=True, results=results)
            emit(check="throughput-pdserve", **decode_rate(lambda p, n: sdk.generate_full(
                prompt_ids=p, max_tokens=n, mode="colocated", ignore_eos=True)))
    finally:
        cluster.down()


def decode_rate(call, streams: int = 8, tokens: int = 256) -> dict:
    import random

    rng = random.Random(7)
    prompts = [[rng.randrange(3, 32000) for _ in range(128)] for _ in range(streams)]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=call, args=(p, tokens)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    return {"streams": streams, "tokens": streams * tokens, "tok_s": round(streams * tokens / elapsed, 1)}


def vllm_alone(model: Path, tmp: Path) -> None:
    from bench.vllm import Server

    server = Server(model, 8300, 0, 0, tmp / "alone.log", block=16)
    try:
        server.wait(300)
        emit(check="throughput-vllm", **decode_rate(lambda p, n: server.complete(p, n).read()))
    except Exception as exc:  # noqa: BLE001
        emit(check="throughput-vllm", ok=False, why=str(exc))
    finally:
        server.stop()


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    try:
        if environment():
            model = Path(os.environ.get("GPU_CHECK_MODEL") or export_preset("small", tmp / "small"))
            contract(model)
            cluster_checks(model, tmp)
            vllm_alone(model, tmp)
            ours = next((r for r in rows if r["check"] == "throughput-pdserve"), None)
            theirs = next((r for r in rows if r["check"] == "throughput-vllm" and "tok_s" in r), None)
            if ours and theirs:
                emit(check="throughput", ratio=round(ours["tok_s"] / theirs["tok_s"], 3), target=">= 0.95",
                     met=ours["tok_s"] >= 0.95 * theirs["tok_s"])
    finally:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
