"""Local cluster: every pdserve service as its own process on loopback.

    redis-server -> kv_directory -> decode workers, prefill workers -> router

`LocalCluster.up()` starts them in that order (each waits for the previous to
answer its health check), records pids and addresses in `state_dir`, and
returns the router address. Processes run in their own sessions, so
`pdserve up` can exit and leave the cluster running; `pdserve down` (or
`LocalCluster.down()`) stops them by pid, newest first.

Security is on unless the spec says `insecure`: `up` makes a throwaway CA under
`state_dir/tls` and one certificate per process (runtime/security/pki.py), plus
`operator` and `client` certificates for pdctl and the SDK and a `monitor` one for a
metrics scraper (every process serves /metrics: tooling/cluster/observability.py);
each service gets its files through PD_TLS_CERT/KEY/CA. Traces go to a local collector
(tooling/cluster/collector.py). Redis gets a random password (in a config file, never on a
command line); the directory reads its URL from the environment. The state folder is 0700,
every file in it 0600, the children's too (runtime/common/private_files.py).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pdserve_client import Client, contract
from pdserve_client.tls import TlsFiles
from router.http import keys as api_keys
from runtime.common.private_files import CHILD_UMASK, make_private, private_dir, private_open, private_write
from runtime.security.capability import generate_signing_key
from runtime.security.pki import Identity, LocalCA
from runtime.security.tls import Security

from . import collector
from .observability import MONITOR_CERT, metrics_endpoint
from .ports import free_port
from .processes import PortTaken, pid_alive, start_failure, wait_healthy
from .redis_proc import find_redis_server, pings

ROUTER_ADDRESS_NAME = Path(contract.ROUTER_ADDRESS_FILE).name
REPO_ROOT = Path(__file__).resolve().parents[2]

VLLM_PYTHON = REPO_ROOT / ".venv-vllm" / "bin" / "python"
"""The interpreter of vLLM workers (`make vllm-env`; ClusterSpec.vllm_python names another)."""

API_KEYS_FILE = "api-keys"
"""The router's key file (hashes only: router/http/keys.py), in the state dir."""
API_KEY_FILE = "api-key"
"""The local user's own key for the front, private, beside it (the demo's curl line reads it)."""
CAPABILITY_SIGNING_KEY = "capability-signing.pem"  # the router's Ed25519 key (capability.py), in the TLS dir
CAPABILITY_PUBLIC_KEYS = "capability-keys.json"  # the workers' public key set


@dataclass
class ClusterSpec:
    """What to start."""

    prefill: int = 1
    decode: int = 1
    mixed: int = 0
    """Decode workers that also serve Prefill (`--serve-prefill`, directory role mixed)."""
    model: str = "tiny"
    engine: str = "pdserve"
    """The workers' engine: pdserve's, or "vllm" (runtime/vllm), whose workers run in the
    environment `make vllm-env` builds (`vllm_python`); a vLLM worker exports a preset
    `model` as a checkpoint directory itself (runtime/worker/process.vllm_checkpoint)."""
    vllm_python: str = ""
    """The interpreter of vLLM workers; empty: .venv-vllm/bin/python (`make vllm-env`)."""
    mode: str = "disaggregated"
    transport: str = "ucx"
    num_blocks: int = 512
    prefill_num_blocks: int = 0
    """The prefill workers' pool, when it differs from the others' (`num_blocks`)."""
    block_size: int = 16
    chunk_tokens: int = 256
    torch_threads: int = 1
    lease_ttl_s: float = 3.0
    reservation_ttl_s: float = 30.0
    state_dir: str = contract.LOCAL_STATE_DIR
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for every service process."""
    worker_env: dict[str, dict[str, str]] = field(default_factory=dict)
    """Extra environment for one worker, by name, over `env`: e.g.
    {"decode-1": {"PD_ATTN_TILE_TOKENS": "64"}} for a worker with other numerics."""
    insecure: bool = False
    """PD_INSECURE=1 everywhere: plaintext, no certificates, no Redis password (debugging)."""
    workers_together: bool = True
    """Start the workers at once (each start is mostly importing torch); False: one after
    another, so a worker's start-up calibration runs on quiet cores."""
    tenant: str = "default"
    """Tenant named by the `client` certificate (the SDK's and pdctl's by default)."""
    traces: bool = True
    """Start the local trace collector and send every process's spans to it
    (tooling/cluster/collector.py)."""
    otlp_endpoint: str = ""
    """Send spans to this OTLP/gRPC endpoint instead of a local collector."""


@dataclass
class Proc:
    """One started service."""

    name: str
    pid: int
    address: str
    log: str
    argv: list[str] = field(default_factory=list)
    """The command line it was started with (`LocalCluster.restart` reuses it)."""
    metrics_url: str = ""
    """Where it serves /metrics ("" for redis, which is not a pdserve process)."""


class LocalCluster:
    """Starts, inspects and stops a local cluster described by a ClusterSpec."""

    def __init__(self, spec: ClusterSpec):
        self.spec = spec
        self.state = Path(spec.state_dir).resolve()
        self.procs: dict[str, Proc] = {}
        self._popen: dict[str, subprocess.Popen] = {}
        self._log_from: dict[str, int] = {}  # where each log stood when its process last started
        self.router_address = ""
        self.http_address = ""
        """host:port of the router's OpenAI-compatible front."""
        self.directory_address = ""
        self.redis_url = ""
        self.tls_dir = self.state / "tls"
        self.otlp_endpoint = ""
        """Where every process sends its spans ('' = tracing off)."""
        self.roles: dict[str, str] = {}
        """Certificate role of each service, by name (what `restart` re-issues nothing for)."""

    # ---- start -----------------------------------------------------------
    def _env(self, name: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in (contract.TLS_CERT_ENV, contract.TLS_KEY_ENV, contract.TLS_CA_ENV, contract.INSECURE_ENV)}
        env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env["PD_LEASE_TTL_S"] = str(self.spec.lease_ttl_s)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.spec.insecure:
            env[contract.INSECURE_ENV] = "1"
        elif name in self.roles:
            d = self.tls_dir
            env.update({contract.TLS_CERT_ENV: str(d / f"{name}.crt"), contract.TLS_KEY_ENV: str(d / f"{name}.key"),
                        contract.TLS_CA_ENV: str(d / contract.TLS_CA_FILE)})
            if self.roles[name] == "router":
                env["PD_CAPABILITY_SIGNING_KEY"] = str(d / CAPABILITY_SIGNING_KEY)
                env["PD_ROUTER_API_KEYS"] = str(self.state / API_KEYS_FILE)
            elif self.roles[name] in ("prefill", "decode", "mixed", "directory"):  # the directory: nonce checks
                env["PD_CAPABILITY_PUBLIC_KEYS"] = str(d / CAPABILITY_PUBLIC_KEYS)
        if name == "directory" and self.redis_url:
            env["PD_REDIS_URL"] = self.redis_url
        env.update(collector.env_for(self, name))
        if self.roles.get(name) in ("prefill", "decode", "mixed"):
            env["PD_ENGINE"] = self.spec.engine
            if self.spec.engine == "vllm":  # OpenMP's count on every thread (process.build_vllm_loop)
                env["OMP_NUM_THREADS"] = str(self.spec.torch_threads)
        env.update(self.spec.env)
        env.update(self.spec.worker_env.get(name, {}))
        return env

    # ---- identities --------------------------------------------------------
    def _issue(self, name: str, role: str) -> None:
        """A certificate for service `name` in role `role` (none when insecure)."""
        self.roles[name] = role
        if not self.spec.insecure:
            LocalCA(self.tls_dir).issue(Identity(role, name))
            make_private(self.tls_dir)

    def client_files(self, name: str = "client") -> TlsFiles | None:
        """The files of certificate `name` in the state dir ("client", "operator", a
        service's name, one from `issue_client`); None when insecure."""
        return None if self.spec.insecure else TlsFiles.in_dir(self.tls_dir, name)

    def identity(self, name: str) -> Security:
        """The security of certificate `name`, for tests and tools that call services directly."""
        files = self.client_files(name)
        return Security.insecure() if files is None else Security.of(files)

    def client(self, name: str = "client", **kw) -> Client:
        """An SDK client of this cluster's router presenting certificate `name`
        (kw: Client's, e.g. timeout_s)."""
        return Client(self.router_address, tls_files=self.client_files(name), **kw)

    def issue_client(self, tenant: str, file_name: str | None = None) -> TlsFiles:
        """A client certificate for `tenant` from this cluster's CA."""
        file_name = file_name or f"client-{tenant}"
        LocalCA(self.tls_dir).issue(Identity("client", tenant), file_name)
        make_private(self.tls_dir)
        return TlsFiles.in_dir(self.tls_dir, file_name)

    def _make_identities(self) -> None:
        if self.spec.insecure:
            return
        if self.tls_dir.exists():  # a fresh CA per cluster: nothing issued for an old one stays valid
            for f in self.tls_dir.iterdir():
                f.unlink()
        ca = LocalCA(private_dir(self.tls_dir))
        generate_signing_key(self.tls_dir / CAPABILITY_SIGNING_KEY, self.tls_dir / CAPABILITY_PUBLIC_KEYS)
        ca.issue(Identity("operator", "operator"))
        ca.issue(Identity("monitor", MONITOR_CERT))
        ca.issue(Identity("client", self.spec.tenant), "client")  # made 0600 with the first service's (_issue)

    def _spawn(self, name: str, argv: list[str], address: str, metrics_url: str = "") -> subprocess.Popen:
        log_path = self.state / "logs" / f"{name}.log"
        log = private_open(log_path, "ab")
        self._log_from[name] = log.tell()
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=self._env(name), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, umask=CHILD_UMASK)
        log.close()
        self._popen[name] = proc
        self.procs[name] = Proc(name, proc.pid, address, str(log_path), list(argv), metrics_url)
        return proc

    def _service(self, name: str, module: str, args: list[str] | Callable[[], list[str]], timeout_s: float,
                 metrics: bool = True, python: str = sys.executable) -> str:
        """Start `module` on free loopback ports; retried on others, twice, if one was taken
        before the process bound it (another launcher picked it too). `args` may be a
        function: called again for each try (flags that name ports of their own)."""
        for attempt in range(3):
            address = f"127.0.0.1:{free_port()}"
            metrics_flags, metrics_url = metrics_endpoint(self.spec.insecure) if metrics else ([], "")
            more = args() if callable(args) else args
            proc = self._spawn(name, [python, "-m", module, "--listen", address, *metrics_flags, *more],
                               address, metrics_url)
            try:
                self._wait(name, address, timeout_s, proc)
                return address
            except PortTaken:
                if attempt == 2:
                    raise

    def _wait(self, name: str, address: str, timeout_s: float, proc: subprocess.Popen) -> None:
        """Until `name` serves; if it exits first, the error says why (its log's last line)."""
        service = contract.SERVER_ROLES[self.roles[name]][0]
        try:
            wait_healthy(address, timeout_s, proc, self.identity("operator"), service)
        except RuntimeError as e:
            raise start_failure(name, e, Path(self.procs[name].log), self._log_from[name]) from e

    def start_redis(self, timeout_s: float = 10.0) -> None:
        """Start the private redis-server."""
        port = free_port()
        password = "" if self.spec.insecure else secrets.token_hex(24)
        conf = self.state / "redis.conf"  # the password stays off every command line
        private_write(conf, f"requirepass {password}\n" if password else "")
        # AOF on (fsync every second): the directory's state — fences, transactions —
        # survives a Redis restart; the fences survive even losing the files (next_fence).
        self._spawn("redis", [find_redis_server(), str(conf), "--port", str(port), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
                              "--dir", str(self.state)],
                    f"127.0.0.1:{port}")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if pings("127.0.0.1", port, password):
                self.redis_url = f"redis://:{password}@127.0.0.1:{port}/0" if password else \
                    f"redis://127.0.0.1:{port}/0"
                return
            time.sleep(0.05)
        raise TimeoutError("redis-server did not answer PING")

    def start_worker(self, role: str, index: int, timeout_s: float = 120.0) -> str:
        """Start prefill, decode or mixed worker number `index`; returns its address."""
        self._issue(f"{role}-{index}", role)
        return self._start_worker(role, index, timeout_s)

    def _start_worker(self, role: str, index: int, timeout_s: float) -> str:
        s = self.spec
        name = f"{role}-{index}"
        module = "decode_worker" if role == "mixed" else f"{role}_worker"
        extra = ["--serve-prefill"] if role == "mixed" else []
        return self._service(name, module, [*extra,
            "--directory", self.directory_address, "--worker-id", name, "--model", s.model,
            "--num-blocks", str(role == "prefill" and s.prefill_num_blocks or s.num_blocks),
            "--block-size", str(s.block_size),
            "--chunk-tokens", str(s.chunk_tokens), "--transport", s.transport,
            "--torch-threads", str(s.torch_threads),
            "--reservation-ttl-s", str(s.reservation_ttl_s)], timeout_s, python=self._worker_python())

    def _worker_python(self) -> str:
        """The workers' interpreter: this one, or vLLM's environment for vLLM workers (which
        export a preset model themselves: runtime/worker/process.vllm_checkpoint)."""
        if self.spec.engine != "vllm":
            return sys.executable
        python = self.spec.vllm_python or str(VLLM_PYTHON)
        if not Path(python).exists():
            raise RuntimeError(f"vLLM workers need vLLM's environment: {python} is missing (make vllm-env)")
        return python

    def workers(self, role: str) -> list[str]:
        """Names of the recorded workers of `role` (prefill, decode, mixed), by index."""
        names = [n for n in self.procs if self.roles.get(n) == role]
        return sorted(names, key=lambda n: int(n.rpartition("-")[2]))

    def add_worker(self, role: str, timeout_s: float = 120.0) -> str:
        """Start one more worker of `role` on the lowest free index, record it in the state
        dir, and return its name once it serves (the autoscaler's scale-up)."""
        used = {int(n.rpartition("-")[2]) for n in self.workers(role)}
        name = f"{role}-{min(set(range(len(used) + 1)) - used)}"
        try:
            self.start_worker(role, int(name.rpartition("-")[2]), timeout_s)
        except BaseException:
            if name in self.procs:  # it started and failed: leave no record of it
                self.remove_worker(name, 5.0)
            raise
        self._save()
        return name

    def remove_worker(self, name: str, timeout_s: float = 60.0) -> None:
        """Stop worker `name` with SIGTERM and wait: it drains (refuses new work, finishes what it
        has, gives its blocks back, deregisters); SIGKILL only after `timeout_s`. Then forget it."""
        self.stop(name, timeout_s)
        del self.procs[name]
        self._popen.pop(name, None)
        self.roles.pop(name, None)
        self._save()

    def start_workers(self, timeout_s: float = 180.0) -> None:
        """Every worker of the spec (after `start_base`), at once (most of a start is each process importing
        torch; they are independent until the router reads their registrations)."""
        workers = [(role, i) for role, n in (("decode", self.spec.decode), ("mixed", self.spec.mixed),
                                            ("prefill", self.spec.prefill)) for i in range(n)]
        for role, i in workers:
            self._issue(f"{role}-{i}", role)
        with ThreadPoolExecutor(max(1, len(workers) if self.spec.workers_together else 1)) as pool:
            for started in [pool.submit(self._start_worker, role, i, timeout_s) for role, i in workers]:
                started.result()

    def up(self, timeout_s: float = 180.0) -> str:
        """Start everything; returns the router address."""
        try:
            self.start_base(timeout_s)
            self.start_workers(timeout_s)
            self.start_router(timeout_s)
        except BaseException:
            self.down()
            raise
        return self.router_address

    # `up` in three steps, for a caller that puts something between them (bench/
    # _transfer_exposed.py's tap in front of the prefill worker): each step stops what it
    # started only through `down`.
    def start_base(self, timeout_s: float = 180.0) -> None:
        """Fresh identities, Redis, the trace collector, the directory."""
        private_dir(private_dir(self.state) / "logs")
        self._make_identities()
        self.start_redis()
        self.otlp_endpoint = collector.start(self, timeout_s)
        self._issue("directory", "directory")
        self.directory_address = self._service("directory", "kv_directory", [], timeout_s)

    def start_router(self, timeout_s: float = 180.0) -> str:
        """The router (after the workers); records the cluster in its state dir."""
        self._issue("router", "router")
        if not self.spec.insecure:
            ensure_api_key(self.state, self.spec.tenant)

        def args() -> list[str]:
            self.http_address = f"127.0.0.1:{free_port()}"
            return ["--directory", self.directory_address, "--mode", self.spec.mode, "--model", self.spec.model,
                    "--http-listen", self.http_address]

        self.router_address = self._service("router", "router", args, timeout_s)
        self._save()
        return self.router_address

    @property
    def api_key(self) -> str:
        """The local user's key for the front (tenant `spec.tenant`); '' when insecure."""
        mine = self.state / API_KEY_FILE
        return mine.read_text().strip() if mine.is_file() else ""

    @property
    def http_url(self) -> str:
        """The OpenAI-compatible front's base URL (router/http), '' before the router starts."""
        if not self.http_address:
            return ""
        return f"{'http' if self.spec.insecure else 'https'}://{self.http_address}/v1"

    def _save(self) -> None:
        data = {"spec": asdict(self.spec), "router": self.router_address, "http": self.http_address,
                "directory": self.directory_address, "redis": self.redis_url, "roles": self.roles,
                "otlp_endpoint": self.otlp_endpoint,
                "procs": {k: asdict(v) for k, v in self.procs.items()}}
        private_write(self.state / "cluster.json", json.dumps(data, indent=2))
        private_write(self.state / ROUTER_ADDRESS_NAME, self.router_address)

    # ---- inspect / stop ----------------------------------------------------
    @classmethod
    def load(cls, state_dir: str = ".pdserve") -> LocalCluster:
        """The cluster recorded in state_dir (raises FileNotFoundError if none)."""
        data = json.loads((Path(state_dir) / "cluster.json").read_text())
        cluster = cls(ClusterSpec(**data["spec"]))
        cluster.router_address = data["router"]
        cluster.http_address = data.get("http", "")
        cluster.directory_address = data["directory"]
        cluster.redis_url = data["redis"]
        cluster.roles = data.get("roles", {})
        cluster.otlp_endpoint = data.get("otlp_endpoint", "")
        cluster.procs = {k: Proc(**v) for k, v in data["procs"].items()}
        return cluster

    def alive(self) -> dict[str, bool]:
        """Per service: is its process still running?"""
        return {name: pid_alive(p.pid, self._popen.get(name)) for name, p in self.procs.items()}

    def signal(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to one service (fault tests)."""
        pid = self.procs[name].pid
        os.kill(pid, sig)
        if sig == signal.SIGKILL:  # gone when this returns (a restart may follow at once)
            if name in self._popen:
                self._popen[name].wait(timeout=10)
            deadline = time.monotonic() + 10
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)

    def stop(self, name: str, timeout_s: float = 10.0) -> None:
        """Stop one service gracefully (SIGTERM; SIGKILL after timeout_s) and wait for it."""
        pid, popen = self.procs[name].pid, self._popen.get(name)
        if not pid_alive(pid, popen):
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while pid_alive(pid, popen) and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid_alive(pid, popen):
            self.signal(name)

    def restart(self, name: str, timeout_s: float = 60.0) -> None:
        """Start a stopped service again with the same command line and address (fault
        tests: a directory or worker coming back)."""
        p = self.procs[name]
        if pid_alive(p.pid, self._popen.get(name)):
            raise RuntimeError(f"{name} (pid {p.pid}) is still running")
        proc = self._spawn(name, p.argv, p.address, p.metrics_url)
        self._save()  # before the wait: one cut short (Ctrl-C, a timeout) still leaves the new pid on record
        if name != "redis":
            self._wait(name, p.address, timeout_s, proc)

    def revive(self) -> None:
        """Start again every service that is not running (a fault killed it), each waiting
        until it serves: the cluster whole again for what comes next."""
        for name, up in self.alive().items():
            if not up:
                self.restart(name)

    def down(self, timeout_s: float = 10.0) -> None:
        """Stop every service, newest first: SIGTERM, then SIGKILL after timeout_s."""
        for name in reversed(list(self.procs)):
            pid = self.procs[name].pid
            if pid_alive(pid, self._popen.get(name)):
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + timeout_s
        for name in reversed(list(self.procs)):
            pid = self.procs[name].pid
            while pid_alive(pid, self._popen.get(name)) and time.monotonic() < deadline:
                time.sleep(0.05)
            if pid_alive(pid, self._popen.get(name)):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if name in self._popen:
                try:
                    self._popen[name].wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        for f in ("cluster.json", ROUTER_ADDRESS_NAME):
            (self.state / f).unlink(missing_ok=True)
        self.procs.clear()

    def __enter__(self) -> LocalCluster:
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()


def ensure_api_key(state: Path, tenant: str) -> str:
    """The local user's API key for the front: made once per state dir, for `tenant`; its
    hash joins the router's key file, the key itself stays in a private file beside it."""
    mine = state / API_KEY_FILE
    if mine.is_file() and (state / API_KEYS_FILE).is_file():
        return mine.read_text().strip()
    key, line = api_keys.create(tenant)
    api_keys.append(state / API_KEYS_FILE, line)
    private_write(mine, key + "\n")
    return key
