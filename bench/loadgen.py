"""The router's OpenAI front under an open-source load generator: AIPerf (PyPI `aiperf`, the
version deploy/loadgen-env.sh pins), so the TTFT, inter-token latency and throughput come
from a tool that knows nothing of pdserve, measured over HTTPS as a client sees them.

    make loadgen-env        # once: AIPerf in .venv-loadgen, never in .venv
    .venv/bin/python bench/loadgen.py --base-url https://HOST:PORT/v1 --api-key KEY \\
        --ca CA.pem --tokenizer DIR --model NAME [--endpoints completions,chat] \\
        [--concurrency 4] [--requests 40] [--prompt-tokens 128] [--output-tokens 32] \\
        [--out bench/results] [-- MORE AIPERF PROFILE FLAGS]

This file imports only the standard library (any Python 3.10+ runs it); AIPerf runs as a
subprocess from --venv. One AIPerf `profile` per endpoint, one after the other: closed loop
at --concurrency, --requests timed requests after --concurrency warm-up ones (excluded from
the figures), synthetic prompts of exactly --prompt-tokens tokens (seeded), streaming,
`max_tokens` --output-tokens with `ignore_eos`, so every request decodes the same length.

What it needs:
  --base-url   the OpenAI base URL (what the OpenAI SDK calls base_url): requests go to
               BASE/completions and BASE/chat/completions, streamed (SSE).
  --api-key    sent as `Authorization: Bearer KEY` (AIPerf redacts it in its report).
  --ca         the PEM of the CA that signed the front's certificate. AIPerf has no CA flag:
               its aiohttp client verifies with OpenSSL's default trust store, whose file
               SSL_CERT_FILE names; verification is never switched off, so the key goes only
               to a server that proves itself.
  --tokenizer  a local directory AutoTokenizer loads (tokenizer.json, tokenizer_config.json;
               a chat template for chat), which builds the prompts. Never a Hub name: the
               Hub endpoint is pointed at a closed local port, so a lookup fails at once.
  the front    streams `usage` in a final chunk when asked (`stream_options.include_usage`,
               which AIPerf sets): token counts are the server's (--client-token-count
               re-tokenizes the text instead; a model's sampled ids seldom re-tokenize to
               the same count, which skews inter-token latency); accepts `ignore_eos`
               (--allow-eos drops it); chat takes `max_completion_tokens`.

What it writes:
  OUT/loadgen-aiperf.json   {endpoint: AIPerf's profile_export_aiperf.json, unchanged}; an
                            endpoint whose run produced no report maps to null
  bench/out/loadgen/ENDPOINT/   AIPerf's artifact directory: per-request records
                            (profile_export.jsonl), its console tables and log
  stdout                    one JSON line: {"bench": "loadgen", "tool": "aiperf", ...} with
                            per endpoint the requests, errors, TTFT and ITL p50/p99 (ms),
                            output tokens/s and requests/s, all read from AIPerf's report
                            (a run with no report: AIPerf's exit status, the first failed
                            request's error and AIPerf's log)
Exit status 0 only when every endpoint's run completed with no failed request. No baseline
ratio here: the figures are the tool's own over the front; bench/vllm.py holds the
comparisons against vLLM (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOL = "aiperf"
# Under the base URL, as the OpenAI SDK joins them (AIPerf wants the leading slash).
ENDPOINT_PATHS = {"completions": "/completions", "chat": "/chat/completions"}
# A port nothing listens on: the Hugging Face Hub is unreachable from CI and the tokenizer
# is a local directory, so any Hub call is a bug to surface at once, not a TCP timeout.
# (HF_HUB_OFFLINE would say so more plainly, but AIPerf 0.13.0 then resolves even a local
# path through the Hub cache and fails.)
NO_HUB = "http://127.0.0.1:9"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Flags before `--` are ours; whatever follows goes to `aiperf profile` verbatim."""
    ours, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True, help="the OpenAI base URL, e.g. https://127.0.0.1:8443/v1")
    p.add_argument("--api-key", required=True, help="the Bearer key")
    p.add_argument("--ca", required=True, type=Path, help="PEM of the CA that signed the server's certificate")
    p.add_argument("--tokenizer", required=True, type=Path, help="local tokenizer directory")
    p.add_argument("--model", required=True, help="the model name the front serves")
    p.add_argument("--endpoints", default="completions,chat", help="comma-separated: completions, chat")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--requests", type=int, default=40, help="timed requests per endpoint")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0, help="the synthetic prompts' seed")
    p.add_argument("--request-timeout-s", type=float, default=120.0,
                   help="a request past this counts as failed (AIPerf's default is 6 hours)")
    p.add_argument("--client-token-count", action="store_true",
                   help="count tokens by re-tokenizing the text, not from the server's usage")
    p.add_argument("--allow-eos", action="store_true", help="do not send ignore_eos")
    p.add_argument("--venv", type=Path, default=ROOT / ".venv-loadgen", help="AIPerf's environment")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="where the report goes")
    p.add_argument("--artifacts", type=Path, default=ROOT / "bench" / "out" / "loadgen",
                   help="AIPerf's artifact directories, one per endpoint")
    args = p.parse_args(ours)
    args.aiperf_extra = extra
    args.endpoints = [e.strip() for e in args.endpoints.split(",") if e.strip()]
    unknown = set(args.endpoints) - set(ENDPOINT_PATHS)
    if unknown or not args.endpoints:
        p.error(f"--endpoints: choose from {', '.join(ENDPOINT_PATHS)} (got {args.endpoints})")
    if not (args.tokenizer / "tokenizer.json").is_file() and not (args.tokenizer / "tokenizer_config.json").is_file():
        p.error(f"--tokenizer {args.tokenizer}: not a local tokenizer directory")
    if not args.ca.is_file():
        p.error(f"--ca {args.ca}: no such file")
    if not (args.venv / "bin" / TOOL).exists():
        p.error(f"no {args.venv / 'bin' / TOOL}: run `make loadgen-env` first")
    return args


def aiperf_command(args: argparse.Namespace, endpoint: str, artifacts: Path) -> list[str]:
    """One `aiperf profile` of `endpoint`: the fixed workload, telemetry scrapes off (the
    front is the subject, not a GPU exporter or its /metrics), no dashboard."""
    cmd = [str(args.venv / "bin" / TOOL), "profile",
           "--model", args.model, "--url", args.base_url, "--api-key", args.api_key,
           "--endpoint-type", endpoint, "--custom-endpoint", ENDPOINT_PATHS[endpoint], "--streaming",
           "--tokenizer", str(args.tokenizer.resolve()),
           "--concurrency", str(args.concurrency), "--request-count", str(args.requests),
           "--warmup-request-count", str(args.concurrency),
           "--prompt-input-tokens-mean", str(args.prompt_tokens), "--prompt-input-tokens-stddev", "0",
           "--prompt-output-tokens-mean", str(args.output_tokens), "--prompt-output-tokens-stddev", "0",
           "--random-seed", str(args.seed), "--request-timeout-seconds", str(args.request_timeout_s),
           "--artifact-dir", str(artifacts), "--ui-type", "none",
           "--no-gpu-telemetry", "--no-server-metrics"]
    if not args.client_token_count:
        cmd.append("--use-server-token-count")
    if not args.allow_eos:
        cmd += ["--extra-inputs", "ignore_eos:true"]
    return cmd + args.aiperf_extra


def aiperf_env(ca: Path) -> dict[str, str]:
    """The environment AIPerf runs in: the CA as OpenSSL's trust file (aiohttp's default
    context reads SSL_CERT_FILE; REQUESTS_CA_BUNDLE for any requests-based helper), the Hub
    closed, no telemetry."""
    ca = str(ca.resolve())
    return {**os.environ, "SSL_CERT_FILE": ca, "REQUESTS_CA_BUNDLE": ca, "HF_ENDPOINT": NO_HUB,
            "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONUNBUFFERED": "1"}


def run_endpoint(args: argparse.Namespace, endpoint: str) -> tuple[dict | None, int]:
    """(AIPerf's report or None, its exit status) for one endpoint; its console output goes
    to the artifact directory's log, not ours (stdout carries the one JSON line)."""
    artifacts = args.artifacts / endpoint
    shutil.rmtree(artifacts, ignore_errors=True)
    artifacts.mkdir(parents=True)
    with open(artifacts / "console.log", "wb") as log:
        rc = subprocess.call(aiperf_command(args, endpoint, artifacts), env=aiperf_env(args.ca),
                             stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    report = artifacts / "profile_export_aiperf.json"
    return (json.loads(report.read_text()) if report.is_file() else None), rc


def first_error(artifacts: Path) -> dict | None:
    """The first failed request's error as AIPerf recorded it (code, type, message): with
    every request failed there is no report, and the console says only that they failed."""
    records = artifacts / "profile_export.jsonl"
    for line in records.read_text().splitlines() if records.is_file() else []:
        error = json.loads(line).get("error")
        if error:
            return {k: error.get(k) for k in ("code", "type", "message")}
    return None


def _stat(report: dict, metric: str, stat: str) -> float | None:
    value = report.get(metric, {}).get(stat)
    return None if value is None else round(value, 2)


def summarize(report: dict | None, rc: int, artifacts: Path) -> dict:
    """The figures a reader checks first, each read from AIPerf's report as it stands; a run
    without a report (every request failed, or AIPerf refused its flags) names the first
    request's error and AIPerf's log."""
    if report is None:
        return {"ok": False, "aiperf_exit": rc, "report": None, "first_error": first_error(artifacts),
                "log": str(artifacts / "console.log")}
    errors = sum(e.get("count", 0) for e in report.get("error_summary") or [])
    ok = rc == 0 and errors == 0 and report.get("is_complete", False) and not report.get("was_cancelled")
    return {"ok": bool(ok), "aiperf_exit": rc,
            "requests": _stat(report, "completed_request_count", "avg"), "errors": errors,
            "ttft_ms": {"p50": _stat(report, "time_to_first_token", "p50"),
                        "p99": _stat(report, "time_to_first_token", "p99")},
            "itl_ms": {"p50": _stat(report, "inter_token_latency", "p50"),
                       "p99": _stat(report, "inter_token_latency", "p99")},
            "output_tokens_per_request": _stat(report, "output_sequence_length", "avg"),
            "output_tokens_per_s": _stat(report, "output_token_throughput", "avg"),
            "requests_per_s": _stat(report, "request_throughput", "avg"),
            "duration_s": _stat(report, "benchmark_duration", "avg")}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    reports, summary = {}, {}
    for endpoint in args.endpoints:
        reports[endpoint], rc = run_endpoint(args, endpoint)
        summary[endpoint] = summarize(reports[endpoint], rc, args.artifacts / endpoint)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"loadgen-{TOOL}.json"
    path.write_text(json.dumps(reports, indent=2) + "\n")
    version = next((r["aiperf_version"] for r in reports.values() if r), None)
    ok = all(s["ok"] for s in summary.values())
    print(json.dumps({"bench": "loadgen", "tool": TOOL, "version": version, "ok": ok,
                      "concurrency": args.concurrency, "prompt_tokens": args.prompt_tokens,
                      "output_tokens": args.output_tokens, "report": str(path), **summary}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
