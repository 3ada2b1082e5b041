"""The router's intake in a real router process (router/edge; docs/design.md, Failures):
what a large refused prompt costs the process, read from /proc (peak RSS is VmHWM,
reset before the request; VmRSS after), and refusals of huge fields that stay short.

A 7.4 MB prompt (3.7M ids) is longer than any worker of the tiny model takes (2,048
tokens). Before the intake read sizes from the wire bytes, refusing it raised the
router's peak RSS by 25x the message and kept it all; the target is at most 4x at the
peak and nothing kept.
"""

from __future__ import annotations

import time

import grpc
import pytest

from pdserve_client.rpc.pd.v1 import common_pb2, router_pb2, router_pb2_grpc
from tests.support.cluster import assert_cluster_clean, channel, start_cluster

MB = 1 << 20
OVERSIZE = router_pb2.GenerateRequest(prompt_token_ids=common_pb2.TokenIds(ids=[300] * 3_700_000), max_tokens=2)
"""7.4 MB: two bytes an id, under the 8 MiB message limit."""
PEAK_PER_MESSAGE = 4
"""Most the router's peak RSS may grow per byte of a refused message (gRPC alone makes
~3 copies of it: its read slices, one contiguous buffer, the bytes handed to Python)."""
NOISE_MIB = 2
"""What a router's RSS moves by on its own between two readings a few seconds apart."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("intake"), prefill=0, decode=0, mixed=1, mode="colocated",
                      traces=False)
    yield c
    c.down()


def memory_mib(pid: int) -> dict[str, float]:
    """VmHWM (peak since the last reset) and VmRSS of process `pid`, in MiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key] = int(value.split()[0]) / 1024
    return out


def reset_peak(pid: int) -> None:
    """Start VmHWM again from the current RSS (proc(5), clear_refs: 5)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def generate(stub, req: router_pb2.GenerateRequest) -> tuple[grpc.StatusCode, str]:
    try:
        for _ in stub.Generate(req, timeout=60):
            pass
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


def generate_once(cluster, req: router_pb2.GenerateRequest) -> tuple[grpc.StatusCode, str]:
    """`req` from a client of its own, gone once answered."""
    with channel(cluster, "router", "client") as ch:
        return generate(router_pb2_grpc.RouterStub(ch), req)


def settled_rss(pid: int, target: float, wait_s: float = 5.0) -> float:
    """The router's RSS once within NOISE_MIB of `target`, else the lowest seen in `wait_s`:
    on a loaded machine the second trim (TRIM_AGAIN_S after the call) may run late. Memory
    kept is never given back, so it still shows."""
    lowest, until = memory_mib(pid)["VmRSS"], time.monotonic() + wait_s
    while lowest - target > NOISE_MIB and time.monotonic() < until:
        time.sleep(0.25)
        lowest = min(lowest, memory_mib(pid)["VmRSS"])
    return lowest


def test_a_refused_large_prompt_costs_at_most_4x_its_size_and_leaves_nothing(cluster):
    """Three in a row, each from a client of its own and its peak read on its own:
    nothing piles up from one to the next, nothing stays after."""
    pid, size = cluster.procs["router"].pid, OVERSIZE.ByteSize()
    small = router_pb2.GenerateRequest(prompt_token_ids=common_pb2.TokenIds(ids=[5, 6, 7]), max_tokens=2)
    assert generate_once(cluster, small)[0] == grpc.StatusCode.OK
    warm = router_pb2.GenerateRequest(prompt_token_ids=common_pb2.TokenIds(ids=[300] * 600_000), max_tokens=2)
    assert generate_once(cluster, warm)[0] == grpc.StatusCode.INVALID_ARGUMENT  # the refusal's own code, warm
    time.sleep(1.0)
    first = memory_mib(pid)["VmRSS"]
    answers, peaks, after = [], [], []
    for _ in range(3):
        before = memory_mib(pid)["VmRSS"]
        reset_peak(pid)
        answers.append(generate_once(cluster, OVERSIZE))
        time.sleep(1.0)  # the heap is trimmed when a large call is over, and half a second later
        peaks.append(memory_mib(pid)["VmHWM"] - before)
        after.append(settled_rss(pid, first))
    report = (f"message {size / MB:.1f} MiB; RSS {first:.1f} MiB before, peaks "
              f"{', '.join(f'+{p:.1f}' for p in peaks)}, after each {', '.join(f'{a:.1f}' for a in after)}")
    assert max(peaks) * MB <= PEAK_PER_MESSAGE * size, report
    assert max(after) - first <= NOISE_MIB, report
    code, details = answers[0]
    assert code == grpc.StatusCode.INVALID_ARGUMENT and len(details) < 200, (code, details[:200])
    assert details.startswith("prompt is 3700000 tokens; no worker takes more than 2048"), details
    assert answers == [answers[0]] * 3
    assert_cluster_clean(cluster)


@pytest.mark.parametrize("field", ["tenant", "request_id"])
def test_a_1mb_field_is_invalid_argument_naming_its_limit(cluster, field):
    """Before: the tenant came back in a 1 MB PERMISSION_DENIED message, which the client
    dropped as RESOURCE_EXHAUSTED ("received metadata size exceeds hard limit")."""
    req = router_pb2.GenerateRequest(prompt_token_ids=common_pb2.TokenIds(ids=[5, 6, 7]), max_tokens=2,
                                     **{field: "x" * MB})
    with channel(cluster, "router", "client") as ch:
        code, details = generate(router_pb2_grpc.RouterStub(ch), req)
    limit = {"tenant": 128, "request_id": 256}[field]
    assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT, f"{field} is {MB} bytes in UTF-8; at most {limit}")
    assert_cluster_clean(cluster)


def test_a_tenant_not_the_callers_is_refused_quoting_a_bounded_prefix(cluster):
    other = "o" * 128  # the longest tenant there is: the message shows its first 64 characters
    req = router_pb2.GenerateRequest(prompt_token_ids=common_pb2.TokenIds(ids=[5, 6, 7]), max_tokens=2, tenant=other)
    with channel(cluster, "router", "client") as ch:
        code, details = generate(router_pb2_grpc.RouterStub(ch), req)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert details == f"tenant {'o' * 64!r}... (128 characters) is not the caller's ('default', from its certificate)"
