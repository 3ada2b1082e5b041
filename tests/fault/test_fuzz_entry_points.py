"""Property-based fuzzing of every gRPC entry point of a running cluster (the
fault suite): random bytes, and well-formed messages with random field values
(edge integers, NaN and infinite floats, long and odd strings, unknown enum values,
out-of-vocabulary tokens), built by hypothesis from the services' own descriptors.

Every answer must be a deliberate status (OK or a code that names the caller's
problem or a refusal), never UNKNOWN or INTERNAL (a handler that crashed), and no
call may hang. Every service is still serving afterwards and the cluster ends clean:
no held block, no open transaction.

Not fuzzed with well-formed messages (they would change the cluster for the other
cases, not test input handling): Directory.RegisterWorker, AdvanceRouteEpoch and
WriteRelease, and the release moves of Admin (SetMode, Promote, Rollback: a promotion
runs its gates' requests, a rollback stops disaggregated routes for good). Their
malformed-bytes and oversize cases are fuzzed; tests/unit/release covers the release
record's refusals.
"""

from __future__ import annotations

import time

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor as F
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kv_directory.access import ACCESS as DIRECTORY_ACCESS
from pdserve_client.rpc.pd.v1 import admin_pb2, decode_pb2, directory_pb2, prefill_pb2, router_pb2
from router.server import ACCESS as ROUTER_ACCESS
from tests.support.cluster import assert_cluster_clean, start_cluster

ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
           grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED,
           grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.ABORTED,
           grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.PERMISSION_DENIED}
"""UNAVAILABLE: e.g. a prefill told to send to an address that does not exist.
PERMISSION_DENIED: a message naming a worker or transfer its caller's certificate does
not hold (the directory's identity checks; every call is made as a role its method
admits, so the role check itself never answers). Never
UNKNOWN or INTERNAL; never a call that hangs (DEADLINE_EXCEEDED at the caller's own
timeout). DEADLINE_EXCEEDED answered by the service before that (a request whose own
`deadline_ms` is 1) is deliberate: `_call` reports it as SERVICE_DEADLINE."""
SERVICE_DEADLINE = "DEADLINE_EXCEEDED answered by the service (the request's own deadline)"
SKIP_WELL_FORMED = {"RegisterWorker", "AdvanceRouteEpoch", "WriteRelease", "SetMode", "Promote", "Rollback"}
CALL_TIMEOUT_S = 20.0
EXAMPLES = 50


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("fuzz"), prefill=1, decode=1, transport="tcp",
                      env={"PD_RESERVATION_TTL_S": "3", "PD_PREFILL_TTL_S": "10", "PD_TXN_TTL_S": "5"})
    yield c
    c.down()


def _endpoints(cluster) -> list[tuple[str, object, str]]:
    """(address, service descriptor, method name) of every RPC the cluster serves."""
    where = [(cluster.router_address, router_pb2.DESCRIPTOR.services_by_name["Router"]),
             (cluster.router_address, admin_pb2.DESCRIPTOR.services_by_name["Admin"]),
             (cluster.procs["decode-0"].address, decode_pb2.DESCRIPTOR.services_by_name["Decode"]),
             (cluster.procs["prefill-0"].address, prefill_pb2.DESCRIPTOR.services_by_name["Prefill"]),
             (cluster.directory_address, directory_pb2.DESCRIPTOR.services_by_name["Directory"])]
    return [(addr, svc, m.name) for addr, svc in where for m in svc.methods]


METHODS = [(svc.full_name, m.name) for svc in (
    router_pb2.DESCRIPTOR.services_by_name["Router"], admin_pb2.DESCRIPTOR.services_by_name["Admin"],
    decode_pb2.DESCRIPTOR.services_by_name["Decode"], prefill_pb2.DESCRIPTOR.services_by_name["Prefill"],
    directory_pb2.DESCRIPTOR.services_by_name["Directory"]) for m in svc.methods]

# ---- strategies from descriptors -----------------------------------------------------

EDGE_INTS = [0, 1, 2, 7, 511, 512, 4096, 2**31 - 1, 2**31, 2**32 - 1, 2**53, 2**63 - 1]
_INT_RANGES = {F.TYPE_INT32: (-2**31, 2**31 - 1), F.TYPE_SINT32: (-2**31, 2**31 - 1),
               F.TYPE_SFIXED32: (-2**31, 2**31 - 1), F.TYPE_INT64: (-2**63, 2**63 - 1),
               F.TYPE_SINT64: (-2**63, 2**63 - 1), F.TYPE_SFIXED64: (-2**63, 2**63 - 1),
               F.TYPE_UINT32: (0, 2**32 - 1), F.TYPE_FIXED32: (0, 2**32 - 1),
               F.TYPE_UINT64: (0, 2**64 - 1), F.TYPE_FIXED64: (0, 2**64 - 1)}


def _scalar(field) -> st.SearchStrategy:
    t = field.type
    if t in _INT_RANGES:
        lo, hi = _INT_RANGES[t]
        edges = [v for v in EDGE_INTS + [-1, lo] if lo <= v <= hi]
        return st.one_of(st.sampled_from(edges), st.integers(max(lo, -5), min(hi, 600)))
    if t in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return st.one_of(st.sampled_from([0.0, -0.0, 1.0, -1.0, 1e308, float("nan"), float("inf"),
                                          float("-inf")]), st.floats(-1e6, 1e6, width=32))
    if t == F.TYPE_BOOL:
        return st.booleans()
    if t == F.TYPE_STRING:
        return st.one_of(st.text(max_size=24), st.sampled_from(["", "x" * 1100, "é" * 300, "a/1", "/", "\x00"]))
    if t == F.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == F.TYPE_ENUM:
        values = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(values), st.integers(-3, 50))
    raise AssertionError(f"no strategy for field type {t}")


def message(descriptor, depth: int = 0) -> st.SearchStrategy:
    """Well-formed messages of `descriptor` with random field values (any subset set)."""
    fields = {}
    for field in descriptor.fields:
        if field.type == F.TYPE_MESSAGE:
            if depth >= 2 or field.message_type.GetOptions().map_entry:
                continue
            value = message(field.message_type, depth + 1)
        else:
            value = _scalar(field)
        if field.is_repeated:
            value = st.lists(value, max_size=40 if field.type != F.TYPE_MESSAGE else 3)
        fields[field.name] = st.none() | value

    def build(values: dict):
        msg = GetMessageClass(descriptor)()
        for name, v in values.items():
            if v is None:
                continue
            field = descriptor.fields_by_name[name]
            if field.is_repeated:
                if field.type == F.TYPE_MESSAGE:
                    for item in v:
                        getattr(msg, name).add().CopyFrom(item)
                else:
                    getattr(msg, name).extend(v)
            elif field.type == F.TYPE_MESSAGE:
                getattr(msg, name).CopyFrom(v)
            else:
                try:
                    setattr(msg, name, v)
                except ValueError:  # a closed enum refusing an unknown value
                    pass
        return msg
    return st.fixed_dictionaries(fields).map(build)


# ---- calling --------------------------------------------------------------------------

def _call(channel: grpc.Channel, service, method_name: str, payload: bytes) -> grpc.StatusCode:
    method = service.methods_by_name[method_name]
    path = f"/{service.full_name}/{method_name}"
    ident = lambda b: b  # noqa: E731 - raw bytes both ways
    start = time.monotonic()
    try:
        if method.server_streaming:
            for _ in channel.unary_stream(path, request_serializer=ident, response_deserializer=ident)(
                    payload, timeout=CALL_TIMEOUT_S):
                pass
        else:
            channel.unary_unary(path, request_serializer=ident, response_deserializer=ident)(
                payload, timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as e:
        if e.code() is grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - start < CALL_TIMEOUT_S - 2:
            return SERVICE_DEADLINE
        return e.code()
    return grpc.StatusCode.OK


def _service(full_name: str):
    for mod in (router_pb2, admin_pb2, decode_pb2, prefill_pb2, directory_pb2):
        for svc in mod.DESCRIPTOR.services_by_name.values():
            if svc.full_name == full_name:
                return svc
    raise KeyError(full_name)


CALLERS = ("router", "operator", "client", "decode-0")
"""Certificates a fuzzed call presents: the first whose role its method admits."""


def _caller(full_name: str, method_name: str) -> str:
    method = f"/{full_name}/{method_name}"
    for table in (DIRECTORY_ACCESS, ROUTER_ACCESS):
        if method in table:
            roles = table[method]
            return next(c for c in CALLERS if c.split("-")[0] in roles)
    return "router"  # a worker's RPC: only the router calls them


def _address(cluster, full_name: str) -> str:
    return {"pd.v1.Router": cluster.router_address, "pd.v1.Admin": cluster.router_address,
            "pd.v1.Decode": cluster.procs["decode-0"].address, "pd.v1.Prefill": cluster.procs["prefill-0"].address,
            "pd.v1.Directory": cluster.directory_address}[full_name]


FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.mark.parametrize("service_name,method_name", METHODS)
def test_fuzzed_messages_get_a_deliberate_status(cluster, service_name, method_name):
    svc = _service(service_name)
    descriptor = svc.methods_by_name[method_name].input_type
    seen: dict[str, set] = {"codes": set()}

    service = {"pd.v1.Router": "router", "pd.v1.Admin": "router", "pd.v1.Decode": "decode",
               "pd.v1.Prefill": "prefill", "pd.v1.Directory": "directory"}[service_name]
    security = cluster.identity(_caller(service_name, method_name))
    with security.channel(_address(cluster, service_name), service) as channel:
        @FUZZ
        @given(payload=st.one_of(st.binary(min_size=1, max_size=200),
                                 st.nothing() if method_name in SKIP_WELL_FORMED
                                 else message(descriptor).map(lambda m: m.SerializeToString())))
        def check(payload):
            code = _call(channel, svc, method_name, payload)
            seen["codes"].add(code)
            assert code in ALLOWED or code == SERVICE_DEADLINE, \
                f"{service_name}/{method_name} answered {code} to {payload[:120]!r}"

        check()
        # oversize: refused before it is parsed, whatever the method
        assert _call(channel, svc, method_name, b"\x0a" + b"\xff" * (9 << 20)) == \
            grpc.StatusCode.RESOURCE_EXHAUSTED
    assert grpc.StatusCode.UNKNOWN not in seen["codes"]


def test_the_cluster_is_clean_and_serving_after_the_fuzzing(cluster):
    with cluster.client(timeout_s=60) as sdk:
        r = sdk.generate_full(prompt_ids=list(range(3, 60)), max_tokens=4, mode="disaggregated")
    assert r.route == "disaggregated" and len(r.token_ids) == 4
    assert_cluster_clean(cluster, timeout_s=30)
