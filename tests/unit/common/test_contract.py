"""pdserve_client/contract.py is the one vocabulary: every process and the SDK agree on
default addresses, the variables that name other services, mode names, the
ErrorCode -> status mapping and message limits. Each test pins one disagreement
that once existed (the SDK looked for the router on 50051 while it listened on
50080; workers looked for the directory on 50050 under PD_DIRECTORY while it
listened on 50070 and the router read PD_DIRECTORY_ADDR; TRANSFER_FAILED was
ABORTED in the router and UNAVAILABLE in the SDK; `pdserve up` defaulted to tcp
while the launcher and README said ucx; PD_NUM_BLOCKS and PD_CHUNK_TOKENS had
different defaults in the worker and the engine)."""

from __future__ import annotations

import pytest

from kv_directory.config import DirectoryConfig
from pdserve_client import address, contract, wire
from pdserve_client.rpc.pd.v1 import admin_pb2, common_pb2, router_pb2
from router.config import RouterConfig
from router.convert import ERROR_CODE_STATUS
from runtime.common import grpc_server
from runtime.engine.config import EngineConfig
from runtime.worker.config import WorkerConfig
from tooling.cluster.launcher import ClusterSpec


def test_clients_look_where_the_services_listen():
    assert address.DEFAULT_ROUTER_ADDRESS == RouterConfig().listen_addr == contract.DEFAULT_ROUTER_ADDRESS
    assert WorkerConfig().directory_addr == RouterConfig().directory_addr == DirectoryConfig().listen_addr


def test_the_router_and_the_workers_read_the_directory_address_from_one_variable(monkeypatch):
    monkeypatch.setenv(contract.DIRECTORY_ADDRESS_ENV, "10.0.0.9:7000")
    assert RouterConfig.from_env().directory_addr == WorkerConfig.from_env().directory_addr == "10.0.0.9:7000"


def test_the_sdk_finds_the_address_the_launcher_writes(tmp_path, monkeypatch):
    monkeypatch.delenv(contract.ROUTER_ADDRESS_ENV, raising=False)
    state = tmp_path / ClusterSpec().state_dir
    state.mkdir()
    (state / "router.addr").write_text("127.0.0.1:4242")
    assert address.resolve_router_address(cwd=tmp_path) == "127.0.0.1:4242"
    assert str(address.ROUTER_ADDR_FILE) == contract.ROUTER_ADDRESS_FILE


@pytest.mark.parametrize("name", [n.removeprefix("ERROR_CODE_") for n in common_pb2.ErrorCode.keys()])
def test_every_error_code_maps_to_one_status_in_the_router_and_the_sdk(name):
    number = common_pb2.ErrorCode.Value(f"ERROR_CODE_{name}")
    router_status = ERROR_CODE_STATUS[number].name
    sdk = wire.error_from_event(common_pb2.Error(code=number, message="m"))
    assert router_status == contract.ERROR_CODE_STATUS[name]
    assert sdk.grpc_code == router_status


def test_mode_names_are_the_protos_and_every_user_takes_them_all():
    proto = {n.removeprefix("MODE_").lower() for n in router_pb2.Mode.keys()} - {"unspecified"}
    assert set(contract.MODES) == proto == set(wire.MODES)
    for mode in contract.MODES:
        RouterConfig(default_mode=mode)
        ClusterSpec(mode=mode)
    release = {n.removeprefix("RELEASE_MODE_").lower() for n in admin_pb2.ReleaseMode.keys()} - {"unspecified"}
    assert set(contract.RELEASE_MODES) == release == set(wire.RELEASE_MODES)


def test_a_variable_the_worker_and_the_engine_both_read_has_one_default():
    worker_env, engine_env = WorkerConfig.env_names(), EngineConfig.env_names()
    shared = {engine_env[var] for var in engine_env.keys() & worker_env.keys()}
    assert {"num_blocks", "chunk_tokens", "block_size", "torch_threads"} <= shared
    for field in shared:
        assert WorkerConfig.model_fields[field].default == EngineConfig.model_fields[field].default, field
    cfg = WorkerConfig().engine_config()
    assert (cfg.num_blocks, cfg.chunk_tokens) == (ClusterSpec.num_blocks, ClusterSpec.chunk_tokens)


def test_pdserve_up_defaults_are_the_launchers(monkeypatch):
    from tooling import cli
    seen = {}
    monkeypatch.setattr(cli, "cmd_up", lambda args: seen.update(vars(args)) or 0)
    assert cli.main(["up"]) == 0
    spec = ClusterSpec()
    assert (seen["transport"], seen["mode"], seen["num_blocks"], seen["prefill"], seen["decode"]) == \
        (spec.transport, spec.mode, spec.num_blocks, spec.prefill, spec.decode) == \
        ("ucx", "disaggregated", 512, 1, 1)


def test_one_message_limit_for_servers_and_clients():
    assert grpc_server.MAX_MESSAGE_BYTES == wire.MAX_MESSAGE_BYTES == contract.MAX_MESSAGE_BYTES
    assert ("grpc.max_receive_message_length", contract.MAX_MESSAGE_BYTES) in wire.CHANNEL_OPTIONS


def test_one_rule_names_a_transfer():
    from router.requests.handoff import transfer_id
    from runtime.directory.records import TransferRef
    ref = TransferRef("req/with/slashes", 12)
    assert ref.transfer_id == transfer_id("req/with/slashes", 12) == "req/with/slashes/12"
    assert TransferRef.parse(ref.transfer_id) == ref
    for bad in ("no-generation", "r/", "/3", "r/x"):
        with pytest.raises(ValueError, match="not a transfer id"):
            TransferRef.parse(bad)
