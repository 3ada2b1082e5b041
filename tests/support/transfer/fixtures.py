"""The transfer harness's fixtures and the test-side helpers that drive a transfer
through R and S (tests/support/transfer)."""

from __future__ import annotations

import itertools
import random

import pytest

from runtime.transfer.keys import new_key
from tests.support.spawned import Spawned, spawned
from tests.support.transfer.engines import IDLE_TIMEOUT_S

RECEIVER = "tests.support.transfer.receiver"  # R's and LR's commands
SENDER = "tests.support.transfer.sender"      # S's and LS's commands
BACKENDS = ["tcp", "ucx"]


class Procs(tuple):
    """(R, S, R's address) plus the backend they run."""

    backend: str


@pytest.fixture(scope="module", params=BACKENDS)
def procs(request):
    """R (with its receiver started) and S; both import torch at their first engine."""
    with spawned((f"decode-R-{request.param}", RECEIVER), (f"prefill-S-{request.param}", SENDER)) as (r, s):
        addr = r.call("r_start", idle_timeout_s=IDLE_TIMEOUT_S, backend=request.param)
        p = Procs((r, s, addr))
        p.backend = request.param
        yield p


@pytest.fixture
def light():
    """`light("sender" | "receiver")`: an LS or LR started by a test, killed at its end
    at the latest."""
    started: list[Spawned] = []

    def start(side: str) -> Spawned:
        started.append(Spawned(f"light-{side}", {"sender": SENDER, "receiver": RECEIVER}[side]))
        return started[-1]

    yield start
    for w in started:
        w.kill()


@pytest.fixture(autouse=True)
def receiver_clean(procs):
    """Every test ends with R holding no pending transfer, nothing of the ended ones, and
    every block back."""
    yield
    r, s, _ = procs
    clean = r.call("r_check_clean")
    assert clean["pending"] == [] and clean["live"] == {} and not clean["ended_twice"], clean
    assert clean["kept_expectations"] == 0, clean  # e.g. a task per transfer, asleep for its idle timeout
    for spec, (free, total, max_ref) in clean["pools"].items():
        assert free == total and max_ref == 0, f"{spec} pool leaked: {clean}"
    credits = s.call("s_credits", backend=procs.backend)
    assert all(in_flight == 0 for in_flight, _, _ in credits.values()), credits
    assert s.call("s_kept") == 0  # S holds nothing of the transfers that ended either


_tids = itertools.count()
KEYS: dict[str, str] = {}
"""Each transfer's secret (hex) as the test, playing the router, handed it to R and S."""


def new_tid() -> str:
    """A transfer id no other test of this process uses."""
    return f"t{next(_tids)}"


def make_prompt(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 512) for _ in range(n)]


def reserve_and_prefill(procs, spec: str, tokens: list[int], **reserve):
    """R reserves `tokens` while S prefills them: (tid, R's reservation, S's prefill)."""
    r, s, _ = procs
    tid = new_tid()
    KEYS[tid] = new_key().hex()
    res_id = r.start("r_reserve", tid=tid, spec=spec, prompt=tokens, key=KEYS[tid], **reserve)
    pre = s.call("s_prefill", tid=tid, spec=spec, prompt=tokens)
    return tid, r.result(res_id), pre


def send(procs, tid, res, per_chunk=2, dest=None, **fault):
    """S sends R's reserved blocks of `tid` (with `fault`, see sender.s_send) and commits."""
    _, s, addr = procs
    return s.call("s_send", tid=tid, dest=dest or addr, first_block=res["first_block"],
                  last_block=res["last_block"], per_chunk=per_chunk, backend=procs.backend,
                  key=KEYS.get(tid, ""), **fault)


def expect_failed(procs, tid, match=""):
    """R's outcome for tid is Failed (matching `match`); S frees its side."""
    r, s, _ = procs
    out = r.call("r_outcome", tid=tid)
    assert out["state"] == "failed" and match in out["reason"], out
    assert r.call("r_finish", tid=tid)["state"] == "failed"
    s.call("s_decode_self", tid=tid)
    return out
