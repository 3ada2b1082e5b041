"""`pdserve up/demo/down` and `pdctl` as a user runs them: real processes, real CLIs.

One cluster for the module, started by `pdserve up` from a directory of its own with
its state dir at ./.pdserve, as `make run` does from the repository; its
stderr is read line by line as it comes. pdctl runs from that directory with no flags
but the command's (tests/support/cluster.py's `pdctl`). The last test stops it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.cluster import client, pdctl
from tooling.cluster.launcher import LocalCluster
from tooling.cluster.processes import pid_alive

NAMES = ("redis", "collector", "directory", "decode-0", "prefill-0", "router")
"""Every process `pdserve up` starts."""
WORKERS = ("decode-0", "prefill-0")


def run(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@dataclass
class Up:
    """A `pdserve up` run: where from, its stderr lines with their arrival times, its stdout."""

    home: Path
    lines: list[tuple[float, str]]
    stdout: str
    returncode: int

    @property
    def cluster(self) -> LocalCluster:
        return LocalCluster.load(str(self.home / ".pdserve"))

    @property
    def stderr(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def first(self, pattern: str) -> tuple[float, str]:
        """The first stderr line matching `pattern` (regex), with when it arrived."""
        found = [(t, line) for t, line in self.lines if re.search(pattern, line)]
        assert found, f"no line matches {pattern!r} in:\n{self.stderr}"
        return found[0]


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    home = tmp_path_factory.mktemp("cli")
    # The state dir is ./.pdserve, named whole: cluster.json then names it whole too (LocalCluster.load here).
    proc = subprocess.Popen([sys.executable, "-m", "tooling.cli", "up", "--state-dir", str(home / ".pdserve")],
                            cwd=home, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines = [(time.monotonic(), line.rstrip("\n")) for line in proc.stderr]  # as each arrives
    started = Up(home, lines, proc.stdout.read(), proc.wait(timeout=60))
    assert started.returncode == 0, started.stderr
    yield started
    run(["tooling.cli", "down"], home)  # already down after the last test: says so, exits 0


def test_up_says_each_process_as_it_starts_and_once_it_answers(up):
    procs = up.cluster.procs
    assert sorted(procs) == sorted(NAMES)
    for name in NAMES:
        starting, _ = up.first(rf"^starting {name}$")
        ready, line = up.first(rf"^  {name:<10} ready ")
        assert starting <= ready and f"pid {procs[name].pid}" in line and procs[name].address in line, line
    # Said as it happened, not all at the end: Redis answered long before the router did.
    assert up.first(r"^  router +ready ")[0] - up.first(r"^  redis +ready ")[0] > 1.0, up.lines
    assert up.stdout.strip() == procs["router"].address == up.cluster.router_address


def test_up_prints_metrics_urls_and_a_curl_line_that_scrapes_them(up):
    procs = up.cluster.procs
    for name, p in procs.items():  # each pdserve service's /metrics, recorded and printed
        assert (p.metrics_url == "") == (name in ("redis", "collector")), (name, p)
        assert name in ("redis", "collector") or f"{name:<10} metrics {p.metrics_url}" in up.stderr
    assert f"traces -> {procs['collector'].address}" in up.stderr
    _, line = up.first(r"scrape any of them: curl ")
    argv = shlex.split(line.split(": ", 1)[1])
    assert "--cert" in argv and argv[argv.index("--cert") + 1].endswith("monitor.crt"), argv
    assert argv[-1] == procs["router"].metrics_url
    for name, family in (("router", "pd_requests_in_flight"), ("decode-0", "pd_kv_cache_usage_ratio")):
        scraped = subprocess.run([*argv[:-1], "-sS", "--fail", procs[name].metrics_url], cwd=up.home,
                                 capture_output=True, text=True, timeout=30)
        assert scraped.returncode == 0 and f"\n{family} " in scraped.stdout, (name, scraped.stderr)


def test_pdctl_generate_trace_status_and_a_bad_request(up):
    cluster = up.cluster
    gen = pdctl(cluster, "generate", "--prompt-ids", "5,6,7,8,9", "--max-tokens", "4", "--ignore-eos", "--json")
    assert gen.returncode == 0, gen.stderr
    result = json.loads(gen.stdout)
    assert len(result["token_ids"]) == 4 and result["route"] == "disaggregated"
    assert result["ttft_ms"] > 0
    shown = pdctl(cluster, "trace", result["request_id"], "--json")
    assert shown.returncode == 0, shown.stderr
    (view,) = json.loads(shown.stdout)["traces"]
    assert view["route"] == "disaggregated" and view["orphans"] == 0 and view["processes"] == 4
    assert view["t_exposed_ms"] is not None and view["t_exposed_ms"] >= 0

    status = pdctl(cluster, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert sorted(w["worker_id"] for w in json.loads(status.stdout)["workers"]) == ["decode-0", "prefill-0"]

    bad = pdctl(cluster, "generate", "--prompt-ids", "1,512", "--max-tokens", "4")  # outside tiny's vocabulary
    assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr and "512" in bad.stderr


def test_generate_prints_ids_on_one_line_and_the_presets_text_as_json_reports_it(up):
    """--ids: the ids on one line that ends, then the summary. Without it: the tiny preset's
    tokenizer (runtime/engine/preset_tokenizer.py) takes a text prompt and its tokens stream
    as text, the text --json reports for the same greedy request. (A router without a
    tokenizer streams empty text: tests/unit/sdk/test_sdk_async_cli.py.)"""
    gen = pdctl(up.cluster, "generate", "--prompt-ids", "5,6,7,8,9", "--max-tokens", "4", "--ignore-eos", "--ids")
    assert gen.returncode == 0, gen.stderr
    lines = gen.stdout.split("\n")
    assert lines[-1] == "" and "" not in lines[:-1], gen.stdout  # each line ends; none is empty
    assert len(lines[0].split()) == 4 and lines[1].startswith("-- request_id="), gen.stdout

    ask = ("generate", "--prompt", "Hello, world", "--max-tokens", "8", "--ignore-eos", "--temperature", "0")
    shown, as_json = pdctl(up.cluster, *ask), pdctl(up.cluster, *ask, "--json")
    assert shown.returncode == 0 and as_json.returncode == 0, shown.stderr + as_json.stderr
    result = json.loads(as_json.stdout)
    assert len(result["token_ids"]) == 8 and result["text"], result
    text = result["text"] + ("" if result["text"].endswith("\n") else "\n")  # the line the tokens opened ends
    assert shown.stdout.startswith(text + "-- request_id="), (shown.stdout, result["text"])


def _table(text: str) -> dict[str, dict[str, str]]:
    """pdctl's worker table (its WORKER header and the workers' rows under it) as {worker: {column: cell}}."""
    lines = text[text.index("WORKER "):].split("\n\n")[0].splitlines()
    header = lines[0].split()
    return {row[0]: dict(zip(header, row)) for row in map(str.split, lines[1:]) if row[0] in WORKERS}


def test_status_and_blocks_print_the_same_free_and_cached(up):
    """FREE counts the cached prefix in both (docs/observability.md, Blocks), in the
    tables and in the JSON, once the load reports caught up with the pool."""
    cluster = up.cluster
    with client(cluster) as sdk:  # 70 tokens: 4 full blocks stay cached on both workers
        sdk.generate_full(prompt_ids=[5 + (7 * i) % 300 for i in range(70)], max_tokens=2, mode="disaggregated")
    deadline, seen = time.monotonic() + 20, None
    while time.monotonic() < deadline:
        status, blocks = pdctl(cluster, "status"), pdctl(cluster, "blocks")
        assert status.returncode == 0 and blocks.returncode == 0, status.stderr + blocks.stderr
        pools = [{w: (row["FREE"], row["(CACHED)"], row["TOTAL"]) for w, row in _table(out.stdout).items()}
                 for out in (status, blocks)]
        seen = (pools, status.stdout, blocks.stdout)
        if pools[0] == pools[1] and all(free == total for free, _, total in pools[0].values()):
            break
        time.sleep(0.5)
    assert pools[0] == pools[1] and set(pools[0]) == set(WORKERS), seen
    assert all(int(cached) >= 4 for _, cached, _ in pools[0].values()), seen  # the cache is in FREE
    as_json = [json.loads(pdctl(cluster, cmd, "--json").stdout)["workers"] for cmd in ("status", "blocks")]
    (by_status, by_blocks) = [{w["worker_id"]: (w["free_blocks"], w.get("cached_blocks", w.get("cached_prefix_blocks")))
                               for w in workers} for workers in as_json]
    assert by_status == by_blocks, as_json
    for cmd in ("status", "blocks"):
        shown = " ".join(pdctl(cluster, cmd, "--help").stdout.split())
        assert "(CACHED): the part of FREE" in shown and "FREE + RESERVED + ACTIVE = TOTAL" in shown, cmd


@pytest.mark.parametrize("args", [["status"], ["generate", "--prompt-ids", "5,6,7", "--max-tokens", "64", "--ids"]])
def test_pdctl_into_a_closed_pipe_exits_quietly(up, args):
    """`pdctl ... | head -1` once head has gone: the pipe's reader is closed before pdctl
    writes (status writes once at the end, generate once per token)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PD_TLS_", "PD_INSECURE"))}
    proc = subprocess.Popen([sys.executable, "-m", "pdserve_ops.cli", *args], cwd=up.home, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # head read its line and left
    stderr = proc.stderr.read()
    assert proc.wait(timeout=60) == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def _hinted(demo_stdout: str) -> list[str]:
    """The commands in the demo's closing hint (between backticks)."""
    hint = demo_stdout.strip().splitlines()[-1]
    assert hint.startswith("router at "), demo_stdout
    return re.findall(r"`([^`]+)`", hint)


def _runs(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """`command` as a user pastes it into a shell in `cwd` (PATH as it is: no virtualenv on it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PD_TLS_", "PD_INSECURE", "VIRTUAL_ENV"))}
    env["PATH"] = "/usr/bin:/bin"
    return subprocess.run(["/bin/sh", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_demo_runs_and_its_hint_names_commands_that_run(up):
    demo = run(["tooling.cli", "demo", "--max-tokens", "4"], up.home)
    assert demo.returncode == 0, demo.stderr
    assert "TTFT" in demo.stdout and "TPOT" in demo.stdout
    # Every disaggregated request is shown split, or served colocated with the reason.
    fell_back = demo.stdout.count("asked for disaggregated, served colocated: attempt 1 (disaggregated")
    assert demo.stdout.count("[disaggregated") + fell_back == 3, demo.stdout
    assert demo.stdout.count("[colocated") == 1 + fell_back
    # The colocated request repeats the second prompt: the demo shows the tokens equal.
    assert "the same prompt, disaggregated earlier: the same tokens" in demo.stdout or fell_back, demo.stdout
    assert "OTHER TOKENS" not in demo.stdout, demo.stdout
    status, generate, down = _hinted(demo.stdout)[:3]
    assert down.endswith(" down") and "pdserve" in down, down
    for command, says in ((status, "decode-0"), (generate, "-- request_id=")):
        ran = _runs(command, up.home)
        assert ran.returncode == 0 and says in ran.stdout, (command, ran.stderr)


def test_the_demo_serves_text_over_https_and_its_curl_and_openai_lines_run_as_printed(up):
    """`make run`'s OpenAI part: a chat through the front, then a curl line and an `openai`
    program that run as printed, from where the demo ran, and `up` names the front's URL."""
    _, line = up.first(r"^router: gRPC ")
    assert f"OpenAI-compatible API https://{up.cluster.http_address}/v1" in line, line
    demo = run(["tooling.cli", "demo", "--max-tokens", "6"], up.home)
    assert demo.returncode == 0, demo.stderr
    assert re.search(r"^\[http chat    \] '.*'$", demo.stdout, re.M) and "over HTTPS" in demo.stdout, demo.stdout
    lines = demo.stdout.splitlines()
    curl = lines[lines.index("OpenAI-compatible API at " + up.cluster.http_url + "; with curl:") + 1].strip()
    ran = _runs(curl, up.home)
    events = [e for e in ran.stdout.split("\n\n") if e.startswith("data: ")]
    assert ran.returncode == 0 and events[-1] == "data: [DONE]", (curl, ran.stdout, ran.stderr)
    assert json.loads(events[0][6:])["object"] == "chat.completion.chunk"
    start = lines.index("with the openai package:") + 1
    program = "\n".join(lines[start:lines.index("EOF", start) + 1])
    ran = _runs(program, up.home)
    # Sampled (OpenAI's default temperature 1) on a random model: it may stop early, at EOS;
    # the program prints the text's repr, in double quotes when it holds a single quote.
    usage = r"""^('.*'|".*") CompletionUsage\(completion_tokens=(\d+), prompt_tokens="""
    assert ran.returncode == 0 and re.search(usage, ran.stdout, re.M), (program, ran.stdout, ran.stderr)


def test_the_hint_from_another_directory_names_the_router_certificates_and_state_dir(up):
    elsewhere = up.home / "elsewhere"
    elsewhere.mkdir()
    demo = run(["tooling.cli", "demo", "--max-tokens", "2", "--state-dir", str(up.home / ".pdserve")], elsewhere)
    assert demo.returncode == 0, demo.stderr
    status, _, down = _hinted(demo.stdout)[:3]
    assert "--router" in status and "PD_TLS_CERT=" in status and "--state-dir" in down, demo.stdout
    ran = _runs(status, elsewhere)
    assert ran.returncode == 0 and "decode-0" in ran.stdout, (status, ran.stderr)


def test_down_stops_every_process(up):
    pids = [p.pid for p in up.cluster.procs.values()]
    down = run(["tooling.cli", "down"], up.home)
    assert down.returncode == 0, down.stderr
    for pid in pids:
        assert not pid_alive(pid), f"pid {pid} still running after pdserve down"
