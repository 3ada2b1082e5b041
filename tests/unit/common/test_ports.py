"""The local cluster's ports and start failures (tooling/cluster/ports.py, processes.py).

A service restarted on its address must find its port free: a port picked inside the
kernel's ephemeral range can meanwhile become the source port of any outgoing connection
(or of a peer reconnecting to the dead service that connected to itself). CI lost a run
to exactly that: a decode worker killed by a fault test could not bind its port again.
"""

from __future__ import annotations

import socket

import pytest

from tooling.cluster.ports import LOWEST, bindable, ephemeral_range, free_port, quiet_ranges
from tooling.cluster.processes import PortTaken, start_failure

GRPC_BIND_FAILURE = (b"Traceback (most recent call last):\n  ...\nRuntimeError: Failed to bind to address "
                     b"127.0.0.1:30850; set GRPC_VERBOSITY=debug environment variable to see detailed error "
                     b"message.\n")


def test_quiet_ranges_are_what_the_kernel_never_gives_implicitly():
    assert quiet_ranges((32768, 60999)) == [range(LOWEST, 32768), range(61000, 65536)]
    assert quiet_ranges((LOWEST, 65000)) == [range(65001, 65536)]
    assert quiet_ranges((1024, 65535)) == []


def test_the_ephemeral_range_is_read_from_the_kernel_or_defaults(tmp_path):
    f = tmp_path / "ip_local_port_range"
    f.write_text("40000\t50000\n")
    assert ephemeral_range(f) == (40000, 50000)
    f.write_text("garbage\n")
    assert ephemeral_range(f) == (32768, 60999)
    assert ephemeral_range(tmp_path / "missing") == (32768, 60999)


def test_picked_ports_are_outside_the_hosts_ephemeral_range_and_bindable():
    first, last = ephemeral_range()
    if not quiet_ranges((first, last)):
        pytest.fail(f"this host's ephemeral range {first}-{last} leaves no port outside it")
    for _ in range(200):
        port = free_port()
        assert not first <= port <= last and port >= LOWEST
        assert bindable("127.0.0.1", port)


def test_a_taken_port_is_never_picked():
    # Only LOWEST is outside this range: taken, the pick falls back to what the OS gives.
    with socket.socket() as holder:
        try:
            holder.bind(("127.0.0.1", LOWEST))
            holder.listen()
        except OSError:
            pass  # something on the host holds it already: taken either way
        assert not bindable("127.0.0.1", LOWEST)
        assert free_port(ephemeral=(LOWEST + 1, 65535)) != LOWEST


def test_a_bind_failure_in_the_log_is_port_taken_with_its_reason(tmp_path):
    log = tmp_path / "decode-0.log"
    log.write_bytes(b"an earlier run's lines\nRuntimeError: Failed to bind to address 127.0.0.1:1\n")
    start = log.stat().st_size
    with open(log, "ab") as f:
        f.write(GRPC_BIND_FAILURE)
    err = start_failure("decode-0", RuntimeError("process for 127.0.0.1:30850 exited with 1"), log, start)
    assert isinstance(err, PortTaken)
    assert "decode-0: process for 127.0.0.1:30850 exited with 1: RuntimeError: Failed to bind" in str(err)


def test_any_other_exit_is_a_plain_error_naming_the_last_line(tmp_path):
    log = tmp_path / "router.log"
    log.write_bytes(b"RuntimeError: Failed to bind to address 127.0.0.1:1\n")  # an earlier start's
    start = log.stat().st_size
    with open(log, "ab") as f:
        f.write(b"starting\nValueError: --model 'x' is not known\n\n")
    err = start_failure("router", RuntimeError("exited with 2"), log, start)
    assert type(err) is RuntimeError
    assert str(err).startswith("router: exited with 2: ValueError: --model 'x' is not known (log ")
    assert "its log says nothing" in str(start_failure("router", RuntimeError("x"), log, log.stat().st_size))
