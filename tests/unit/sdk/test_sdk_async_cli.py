"""Async SDK client and pdctl against the in-process fake Router+Admin
(tests/support/sdk.py, fixtures in conftest.py) on a real loopback gRPC server."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from pdserve_client import AsyncClient, PdError, resolve_router_address
from pdserve_client.rpc.pd.v1 import common_pb2, manifest_pb2, router_pb2
from pdserve_ops.cli import main
from tests.support.sdk import Abort, Forever, complete, error, paced_script, started, token
from tooling.cluster.ports import free_port

# --------------------------------------------------------------------------- async client


def test_async_stream_and_result(fake, addr):
    fake.script = paced_script(first_s=0.1, gap_s=0.03)

    async def run():
        async with AsyncClient(addr, timeout_s=5) as c:
            stream = c.generate(prompt_ids=[1], max_tokens=3, mode="disaggregated")
            events = [e async for e in stream]
            full = await c.generate_full(prompt="again", max_tokens=3)
            return events, stream.result, full

    events, result, full = asyncio.run(run())
    assert [e.token_id for e in events] == [11, 12, 13] and events[0].t_ms >= 100 - 1
    assert result.ttft_ms == events[0].t_ms
    assert result.tpot_ms == pytest.approx((result.latency_ms - result.ttft_ms) / 2) and result.tpot_ms >= 0
    # The last token cannot arrive before the script sent it (a loaded client may read the
    # first one late, so the gaps it sees can be shorter than the script's).
    assert result.latency_ms >= 100 + 2 * 30 - 1
    assert full.text == "Hello world!" and full.request_id != result.request_id
    assert fake.requests[0].mode == router_pb2.MODE_DISAGGREGATED


def test_async_errors_keep_code_and_message(fake, addr):
    async def run(script, call):
        fake.script = script
        async with AsyncClient(addr, timeout_s=5) as c:
            with pytest.raises(PdError) as info:
                await call(c)
            return info.value

    e = asyncio.run(run([started(), error(common_pb2.ERROR_CODE_DEADLINE_EXCEEDED, "deadline 50 ms passed")],
                        lambda c: c.generate_full(prompt="x", max_tokens=2)))
    assert (e.code, e.message) == ("DEADLINE_EXCEEDED", "deadline 50 ms passed")
    e = asyncio.run(run([Abort(grpc.StatusCode.INVALID_ARGUMENT, "max_tokens must be > 0")],
                        lambda c: c.generate_full(prompt="x", max_tokens=2)))
    assert (e.code, e.message) == ("INVALID_ARGUMENT", "max_tokens must be > 0")
    fake.status_abort = Abort(grpc.StatusCode.UNAVAILABLE, "router draining")
    e = asyncio.run(run([], lambda c: c.status()))
    assert (e.code, e.message, e.retryable) == ("UNAVAILABLE", "router draining", True)


@pytest.mark.parametrize("how", ["break", "aclose"])
def test_async_leaving_the_stream_cancels_the_rpc(fake, addr, how):
    fake.script = [started(), Forever()]

    async def run():
        async with AsyncClient(addr, timeout_s=5) as c:
            if how == "break":
                async for event in c.generate(prompt="x", max_tokens=1000):
                    if event.index == 1:
                        break
            else:
                stream = c.generate(prompt="x", max_tokens=1000)
                await stream.__anext__()
                await stream.aclose()
            # Keep the channel open so only the stream's own cancel can end the RPC.
            return await asyncio.to_thread(fake.stream_cancelled.wait, 5)

    assert asyncio.run(run()), "router never saw the cancellation"


def test_async_admin_calls(fake, addr):
    async def run():
        async with AsyncClient(addr) as c:
            return await c.status(), await c.transactions(), await c.cancel("known")

    status, txns, found = asyncio.run(run())
    assert status.mode == "canary" and [w.role for w in status.workers] == ["prefill", "decode"]
    assert txns[0].transfer_id == "t1" and found is True


# --------------------------------------------------------------------------- pdctl


def test_cli_generate_streams_text_and_summary(fake, addr, capsys):
    fake.script = paced_script(first_s=0.02, gap_s=0.01)
    assert main(["--router", addr, "generate", "--prompt", "hi", "--max-tokens", "3", "--seed", "4"]) == 0
    out = capsys.readouterr().out
    text, summary = out.splitlines()
    assert text == "Hello world!"
    request_id = fake.requests[0].request_id
    assert f"request_id={request_id}" in summary and "route=disaggregated" in summary
    assert "ttft_ms=" in summary and "tpot_ms=" in summary and "workers=prefill-0->decode-0" in summary
    assert fake.requests[0].sampling.seed == 4


def test_cli_generate_json(fake, addr, capsys):
    fake.script = paced_script(first_s=0.02, gap_s=0.01)
    argv = ["generate", "--router", addr, "--prompt-ids", "1, 2,3", "--max-tokens", "3", "--mode", "colocated",
            "--temperature", "0.5", "--tenant", "acme", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["token_ids"] == [11, 12, 13] and doc["num_tokens"] == 3 and doc["text"] == "Hello world!"
    assert doc["tpot_ms"] == pytest.approx((doc["latency_ms"] - doc["ttft_ms"]) / 2)
    assert doc["ttft_ms"] >= 20 - 1 and doc["request_id"] == fake.requests[0].request_id
    req = fake.requests[0]
    assert list(req.prompt_token_ids.ids) == [1, 2, 3] and req.mode == router_pb2.MODE_COLOCATED
    assert req.tenant == "acme"


def test_cli_generate_ids_and_textless_output(fake, addr, capsys):
    fake.script = [started(), token(0, 5), token(1, 6), complete(2)]
    assert main(["--router", addr, "generate", "--prompt", "x", "--max-tokens", "2", "--ids"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split() == ["5", "6"]
    assert main(["--router", addr, "generate", "--prompt", "x", "--max-tokens", "2"]) == 0
    assert "token_ids: 5,6" in capsys.readouterr().out


def test_cli_error_goes_to_stderr_with_code_and_message(fake, addr, capsys):
    fake.script = [started(), token(0, 1, "par"),
                   error(common_pb2.ERROR_CODE_ADMISSION_REJECTED, "TTFT SLO 5 ms unmeetable")]
    assert main(["--router", addr, "generate", "--prompt", "x", "--max-tokens", "4"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "par\n"
    assert "ADMISSION_REJECTED: TTFT SLO 5 ms unmeetable" in captured.err
    assert main(["--router", f"127.0.0.1:{free_port()}", "--timeout", "2", "status"]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    [],
    ["generate", "--max-tokens", "3"],
    ["generate", "--prompt", "a", "--prompt-ids", "1", "--max-tokens", "3"],
    ["generate", "--prompt-ids", "1,x", "--max-tokens", "3"],
    ["generate", "--prompt", "a", "--max-tokens", "0"],
    ["generate", "--prompt", "a"],
    ["generate", "--prompt", "a", "--max-tokens", "3", "--mode", "sideways"],
    ["transactions", "--state", "limbo"],
    ["cancel"],
    ["frobnicate"],
])
def test_cli_bad_arguments_exit_2(fake, addr, capsys, argv):
    assert main(["--router", addr] + argv) == 2
    assert capsys.readouterr().err
    assert fake.requests == []


def test_cli_status_transactions_cancel_set_mode(fake, addr, capsys):
    assert main(["--router", addr, "status"]) == 0
    out = capsys.readouterr().out
    assert "mode: canary" in out and "open_transactions: 2" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("prefill-0", "decode-0"))}
    # WORKER ROLE EPOCH FREE (CACHED) RESERVED ACTIVE TOTAL PENDING_PREFILL BATCH
    assert rows["prefill-0"][1:10] == ["prefill", "3", "60", "10", "0", "4", "64", "512", "0"]

    assert main(["--router", addr, "status", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["open_transactions"] == 2 and [w["worker_id"] for w in doc["workers"]] == ["prefill-0", "decode-0"]

    assert main(["--router", addr, "transactions", "--state", "aborted", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["state"] == "aborted"
    assert list(fake.list_requests[0].states) == [manifest_pb2.TXN_STATE_ABORTED]
    assert main(["--router", addr, "transactions"]) == 0
    assert "checksum mismatch" in capsys.readouterr().out

    assert main(["--router", addr, "cancel", "known", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"request_id": "known", "found": True}
    assert fake.cancels[0].request_id == "known"

    assert main(["--router", addr, "set-mode", "rolled_back", "--reason", "drill"]) == 0
    assert "ADVANCE_ROUTE_EPOCH" in capsys.readouterr().out
    assert fake.set_mode_requests[0].reason == "drill"


def test_router_address_resolution(fake, addr, monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PD_ROUTER", raising=False)
    assert resolve_router_address() == "127.0.0.1:50080"
    (tmp_path / ".pdserve").mkdir()
    (tmp_path / ".pdserve" / "router.addr").write_text(addr + "\n")
    assert resolve_router_address() == addr
    assert main(["status", "--json"]) == 0  # found through the launcher's file
    monkeypatch.setenv("PD_ROUTER", "10.0.0.1:1")
    assert resolve_router_address() == "10.0.0.1:1"
    assert resolve_router_address("h:2") == "h:2"
    monkeypatch.setenv("PD_ROUTER", addr)
    (tmp_path / ".pdserve" / "router.addr").write_text("127.0.0.1:1\n")
    assert main(["cancel", "other"]) == 0  # the environment wins over the file
    assert "not found" in capsys.readouterr().out
