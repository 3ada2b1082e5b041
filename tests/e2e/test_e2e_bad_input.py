"""Bad requests through the real cluster get a precise status and leak nothing."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from pdserve_client import PdError
from pdserve_client.rpc.pd.v1 import (
    common_pb2,
    decode_pb2,
    decode_pb2_grpc,
    manifest_pb2,
    prefill_pb2,
    prefill_pb2_grpc,
    router_pb2,
    router_pb2_grpc,
)
from runtime.engine.checkpoint import export_preset
from tests.support.cluster import assert_cluster_clean, channel, client, start_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # The tiny preset exported without its tokenizer.json: a router without a tokenizer,
    # which refuses text prompts (the preset by name has one: runtime/engine/preset_tokenizer.py).
    home = tmp_path_factory.mktemp("bad")
    model = export_preset("tiny", home / "tiny-without-tokenizer")
    (model / "tokenizer.json").unlink()
    c = start_cluster(home, prefill=1, decode=1, model=str(model))
    yield c
    c.down()


@pytest.mark.parametrize("kwargs,code,words", [
    (dict(prompt_ids=[], max_tokens=4), "INVALID_ARGUMENT", "empty"),
    (dict(prompt_ids=[5] * 2048, max_tokens=4), "INVALID_ARGUMENT", "2048"),
    (dict(prompt_ids=[5, 6], max_tokens=0), "INVALID_ARGUMENT", "max_tokens"),
    (dict(prompt_ids=[5, 6], max_tokens=100_000), "INVALID_ARGUMENT", "max_tokens"),
    (dict(prompt_ids=[5, 512, 7], max_tokens=4), "INVALID_ARGUMENT", "512"),
    (dict(prompt="hello", max_tokens=4), "INVALID_ARGUMENT", "tokenizer"),
])
@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_bad_request_is_rejected_precisely(cluster, kwargs, code, words, mode):
    with client(cluster) as sdk:
        with pytest.raises(PdError) as err:
            sdk.generate_full(mode=mode, **kwargs)
    assert err.value.code == code, err.value
    assert words in err.value.message, err.value.message
    assert_cluster_clean(cluster)


def test_cancel_of_unknown_request_is_not_found(cluster):
    with client(cluster) as sdk:
        assert sdk.cancel("no-such-request") is False


def test_wrong_cache_abi_digest_is_refused_by_decode(cluster):
    with channel(cluster, "decode-0", "router") as ch:
        with pytest.raises(grpc.RpcError) as err:
            decode_pb2_grpc.DecodeStub(ch).Reserve(decode_pb2.DecodeReserveRequest(
                request_id="abi", generation=1, prompt_token_ids=[1, 2, 3], max_tokens=2,
                cache_abi_digest="0" * 32, sampling=common_pb2.SamplingParams()), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "cache ABI" in err.value.details()
    assert_cluster_clean(cluster)


NAN = float("nan")


@pytest.mark.parametrize("call,request_,words", [
    ("Reserve", decode_pb2.DecodeReserveRequest(
        request_id="nan", generation=1, prompt_token_ids=[1, 2, 3], max_tokens=2,
        sampling=common_pb2.SamplingParams(temperature=NAN)), "temperature nan"),
    ("Generate", decode_pb2.DecodeGenerateRequest(
        request_id="nan", generation=1, prompt_token_ids=[1, 2, 3], max_tokens=2,
        sampling=common_pb2.SamplingParams(temperature=NAN)), "temperature nan"),
    ("Generate", decode_pb2.DecodeGenerateRequest(generation=1, prompt_token_ids=[1, 2, 3], max_tokens=2),
     "request_id is required"),
], ids=["reserve-nan-temperature", "generate-nan-temperature", "generate-without-request-id"])
def test_decode_worker_refuses_bad_calls_precisely(cluster, call, request_, words):
    """Straight to the worker, past the router's checks (docs/design.md, Principles)."""
    with channel(cluster, "decode-0", "router") as ch:
        stub = decode_pb2_grpc.DecodeStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            result = getattr(stub, call)(request_, timeout=10)
            list(result) if call == "Generate" else result
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
    assert words in err.value.details()
    assert_cluster_clean(cluster)


def test_a_good_request_still_works_afterwards(cluster):
    with client(cluster) as sdk:
        res = sdk.generate_full(prompt_ids=list(range(3, 40)), max_tokens=5, ignore_eos=True)
    assert len(res.token_ids) == 5 and res.route == "disaggregated"
    assert_cluster_clean(cluster)


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_client_cancel_mid_stream_reaches_every_worker(cluster, mode):
    with client(cluster) as sdk:
        # 1700 tokens take the tiny model well over the 4 s allowed below: only a
        # cancel that reaches the decode worker frees its blocks in time.
        stream = sdk.generate(prompt_ids=list(range(3, 300)), max_tokens=1700, mode=mode,
                                 ignore_eos=True)
        got = []
        for event in stream:
            got.append(event.token_id)
            if len(got) == 3:
                break
        stream.close()
    assert len(got) == 3
    # Decode stopped, blocks returned, transaction released/aborted on every worker.
    assert_cluster_clean(cluster, timeout_s=4)


@pytest.mark.parametrize("service,method", [("router", "/pd.v1.Router/Generate"),
                                            ("router", "/pd.v1.Router/Cancel"),
                                            ("decode-0", "/pd.v1.Decode/Reserve"),
                                            ("decode-0", "/pd.v1.Decode/Generate"),
                                            ("prefill-0", "/pd.v1.Prefill/Prefill"),
                                            ("directory", "/pd.v1.Directory/RegisterWorker")])
def test_malformed_bytes_are_invalid_argument(cluster, service, method):
    """Bytes that are no protobuf message get a status a person can act on (docs/design.md, Principles)."""
    # Each caller is one its method admits: the bytes, not the identity, are at fault.
    identity = {"router": "client", "decode-0": "router", "prefill-0": "router", "directory": "decode-0"}[service]
    with channel(cluster, service, identity) as ch:
        streaming = method.endswith("Generate")
        call = (ch.unary_stream if streaming else ch.unary_unary)(method)
        with pytest.raises(grpc.RpcError) as err:
            result = call(b"\x0a\xff\xff\xff\xff\xff", timeout=10)  # field 1: a truncated length
            list(result) if streaming else result
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
    assert err.value.details().startswith(f"{method}: the request is not a valid protobuf message")
    assert_cluster_clean(cluster)


def test_a_message_over_the_size_limit_is_refused_before_it_is_parsed(cluster):
    """The router refuses a 9 MB request at the transport (the SDK would refuse to send it)."""
    request = router_pb2.GenerateRequest(  # 3-byte varints: 9 MB, over the 8 MiB limit
        request_id="huge", prompt_token_ids=common_pb2.TokenIds(ids=[200_000] * 3_000_000), max_tokens=1)
    options = [("grpc.max_send_message_length", 64 << 20)]
    with channel(cluster, "router", "client", options=options) as ch:
        with pytest.raises(grpc.RpcError) as err:
            list(router_pb2_grpc.RouterStub(ch).Generate(request, timeout=30))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value
    assert "larger than max" in err.value.details()
    assert_cluster_clean(cluster)


# ---- Prefill's job and its grant (one call, two requests) ---------------------------

def _job(generation: int = 1, **fields) -> prefill_pb2.PrefillRequest:
    return prefill_pb2.PrefillRequest(manifest=manifest_pb2.HandoffManifest(
        request_id="job", tenant="default", generation=generation, transfer_id=f"job/{generation}"),
        prompt_token_ids=list(range(3, 40)), **fields)


@pytest.mark.parametrize("grant,words", [
    (None, "the call ended without a grant"),
    (_job(2, destination_data_plane_address="127.0.0.1:1"), "the grant names transfer 'job/2'"),
    (_job(1), "the grant's destination_data_plane_address is empty"),
], ids=["no-grant", "another-transfer", "no-destination"])
def test_a_prefill_job_without_a_valid_grant_is_refused_and_frees_its_compute(cluster, grant, words):
    """The job computes before its grant; a grant that never comes, names another transfer
    or no destination is INVALID_ARGUMENT, and the computed blocks are freed."""
    with channel(cluster, "prefill-0", "router") as ch:
        with pytest.raises(grpc.RpcError) as err:
            list(prefill_pb2_grpc.PrefillStub(ch).Prefill(iter([_job()] + ([grant] if grant else [])), timeout=20))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
    assert words in err.value.details(), err.value.details()
    assert_cluster_clean(cluster)


def test_a_job_with_bad_sampling_is_invalid_argument(cluster):
    """The job's sampling is checked with the rest of it: INVALID_ARGUMENT saying what."""
    bad = _job(sampling=common_pb2.SamplingParams(top_p=-1.0))
    with channel(cluster, "prefill-0", "router") as ch:
        with pytest.raises(grpc.RpcError) as err:
            list(prefill_pb2_grpc.PrefillStub(ch).Prefill(iter([bad]), timeout=20))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
    assert "top_p" in err.value.details(), err.value.details()
    assert_cluster_clean(cluster)


def test_a_malformed_grant_is_invalid_argument(cluster):
    with channel(cluster, "prefill-0", "router") as ch:
        call = ch.stream_stream("/pd.v1.Prefill/Prefill")
        with pytest.raises(grpc.RpcError) as err:
            list(call(iter([_job().SerializeToString(), b"\x0a\xff\xff\xff\xff\xff"]), timeout=20))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
    assert err.value.details().startswith("/pd.v1.Prefill/Prefill: the request is not a valid protobuf message")
    assert_cluster_clean(cluster)


def test_a_job_cancelled_before_its_grant_leaves_nothing(cluster):
    """The router's Reserve failed: it cancels the call while the prefill waits for the
    grant. Nothing was sent; the blocks are freed; the worker serves on."""
    stop = threading.Event()

    def requests():
        yield _job()
        stop.wait(20)  # the grant that never comes

    with channel(cluster, "prefill-0", "router") as ch:
        call = prefill_pb2_grpc.PrefillStub(ch).Prefill(requests(), timeout=20)
        time.sleep(1.0)  # the job arrived and computed
        call.cancel()
        stop.set()
        with pytest.raises(grpc.RpcError) as err:
            list(call)
        assert err.value.code() == grpc.StatusCode.CANCELLED
    assert_cluster_clean(cluster)
    with client(cluster) as sdk:
        res = sdk.generate_full(prompt_ids=list(range(3, 40)), max_tokens=3, ignore_eos=True, mode="disaggregated")
    assert len(res.token_ids) == 3 and res.route == "disaggregated"
    assert_cluster_clean(cluster)
