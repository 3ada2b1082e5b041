"""Ports for the local cluster's services, picked outside the kernel's ephemeral range.

A port the OS gives for bind(0) comes from the range it also draws the source port of
every outgoing connection from. A service killed by a fault test (or by an operator) and
restarted on its address could then find its port taken in between: by any connection
made on the machine, or by a peer reconnecting to the dead service that happened to
connect to itself (TCP simultaneous open, possible only inside that range). A port
outside the range is never handed out implicitly, so it stays free for the restart; only
another launcher picking the same port at random could take it (each pick is checked).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)  # Linux's default, for a host without /proc
LOWEST = 10_000  # below: the well-known and registered services people run
HIGHEST = 65_535
_PICKS = 64
_random = random.SystemRandom()


def ephemeral_range(path: Path = EPHEMERAL_RANGE) -> tuple[int, int]:
    """(first, last) port the kernel gives to unbound sockets."""
    try:
        first, last = (int(v) for v in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return first, last


def quiet_ranges(ephemeral: tuple[int, int]) -> list[range]:
    """The port ranges above LOWEST that the kernel never gives out implicitly."""
    first, last = ephemeral
    spans = [range(LOWEST, min(first, HIGHEST + 1)), range(max(last + 1, LOWEST), HIGHEST + 1)]
    return [s for s in spans if len(s)]


def bindable(host: str, port: int) -> bool:
    """Can a listener bind host:port now? (Without SO_REUSEADDR: a port with a connection
    still in TIME_WAIT counts as taken too.)"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1", ephemeral: tuple[int, int] | None = None) -> int:
    """A TCP port on `host`, free a moment ago and outside the ephemeral range when the
    host leaves any room there; else whatever bind(0) gives."""
    spans = quiet_ranges(ephemeral or ephemeral_range())
    weights = [len(s) for s in spans]  # every quiet port equally likely
    for _ in range(_PICKS if spans else 0):
        port = _random.choice(_random.choices(spans, weights)[0])
        if bindable(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
