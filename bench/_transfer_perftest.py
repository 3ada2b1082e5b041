"""Native UCX baseline for bench/transfer.py: `ucx_perftest -t tag_bw` on loopback.

The binary and its libraries come from the `libucx` wheel (a dependency of ucxx).
Server and client are two processes; the client's `-f` row is parsed:

    iterations  p50_us  avg_us  overall_us  avg_MBps  overall_MBps  avg_msg/s  overall_msg/s

GB/s is computed from the message size and the overall per-message time
(ucx_perftest's MB is 2^20 bytes; we report 1e9 bytes/s).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

CONNECT_TRIES = 100


def find_perftest() -> tuple[Path, Path]:
    """(ucx_perftest binary, its lib dir) from the installed libucx wheel."""
    import libucx
    root = Path(libucx.__file__).resolve().parent
    binary = root / "bin" / "ucx_perftest"
    if not binary.exists():
        raise FileNotFoundError(f"{binary} not found (libucx wheel without tools?)")
    return binary, root / "lib"


def perftest_env(lib: Path, tls: str) -> dict[str, str]:
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(lib), env.get("LD_LIBRARY_PATH")) if p)
    env["UCX_TLS"] = tls
    return env


def run_tag_bw(size_bytes: int, iters: int, warmup: int, port: int, tls: str,
               timeout_s: float = 120.0) -> dict:
    """One server+client run with message size `size_bytes`; returns the parsed figures."""
    binary, lib = find_perftest()
    env = perftest_env(lib, tls)
    server = subprocess.Popen([str(binary), "-p", str(port)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        client = [str(binary), "127.0.0.1", "-p", str(port), "-t", "tag_bw", "-s", str(size_bytes),
                  "-n", str(iters), "-w", str(warmup), "-f"]
        for _ in range(CONNECT_TRIES):  # the server may not listen yet: connect() refused
            out = subprocess.run(client, env=env, capture_output=True, text=True, timeout=timeout_s)
            if out.returncode == 0:
                break
            if "connect() failed" not in out.stdout + out.stderr or server.poll() is not None:
                raise RuntimeError(f"ucx_perftest client failed: {out.stdout}{out.stderr}")
            time.sleep(0.05)
        else:
            raise RuntimeError("ucx_perftest server never accepted")
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    row = _final_row(out.stdout)
    overall_us = row[3]
    return {"gbps": size_bytes / (overall_us * 1e-6) / 1e9, "overall_us": overall_us,
            "overall_MiBps": row[5], "iterations": int(row[0])}


def _final_row(text: str) -> list[float]:
    for line in reversed(text.splitlines()):
        parts = line.replace("Final:", "").split()
        try:
            row = [float(p) for p in parts]
        except ValueError:
            continue
        if len(row) == 8:
            return row
    raise RuntimeError(f"no result row in ucx_perftest output:\n{text}")
