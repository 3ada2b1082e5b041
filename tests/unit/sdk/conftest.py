"""Fixtures of the SDK and pdctl tests: one fake Router+Admin (tests/support/sdk.py)
per module on a real loopback gRPC server with mutual TLS, reset before each test."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from pdserve_client import Client
from pdserve_client.rpc.pd.v1 import admin_pb2_grpc, router_pb2_grpc
from tests.support import pki
from tests.support.sdk import FakeRouter


@pytest.fixture(autouse=True)
def client_certificate(monkeypatch):
    """The SDK and pdctl present a client certificate found through PD_TLS_* (the fake
    router speaks mutual TLS with the same test CA)."""
    for name, value in pki.env("client", "acme").items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("PD_INSECURE", raising=False)


@pytest.fixture(scope="module")
def server():
    fake = FakeRouter()
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    router_pb2_grpc.add_RouterServicer_to_server(fake, srv)
    admin_pb2_grpc.add_AdminServicer_to_server(fake, srv)
    port = srv.add_secure_port("127.0.0.1:0", pki.security("router", "router").server_credentials())
    srv.start()
    yield fake, f"127.0.0.1:{port}"
    srv.stop(0)


@pytest.fixture
def fake(server):
    server[0].reset()
    return server[0]


@pytest.fixture
def addr(server):
    return server[1]


@pytest.fixture
def client(addr):
    with Client(addr, timeout_s=5) as c:
        yield c
