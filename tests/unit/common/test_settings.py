"""The services' settings classes (runtime/common/settings.py): how the environment is
read, the defaults, the one-line errors, and one owner (one default) per variable."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

from kv_directory.config import DirectoryConfig
from pdserve_client import contract
from router.config import RouterConfig
from runtime.common.settings import MemberSettings, ServiceSettings, Settings, SettingsError
from runtime.engine import EngineConfig
from runtime.security.config import CapabilitySettings
from runtime.worker.config import DecodeWorkerConfig, PrefillWorkerConfig, WorkerConfig
from runtime.worker.process import parse_config
from runtime.worker.profile import ProfileConfig
from tests.support import REPO

ROOT = REPO

HAND_READ = {"PD_ENGINE_KERNEL", "PD_KERNEL_ISA", "PD_ROUTER_NATIVE", "PD_MALLOC_TUNE"}
"""Process-level knobs library code reads itself (kernels, native router builds, malloc,
): not service settings, so no settings class may declare them too."""


def settings_classes() -> list[type[Settings]]:
    """Every settings class (the imports above load every service's)."""
    out, todo = [], [Settings]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in out:
                out.append(sub)
                todo.append(sub)
    return out


def declaring_class(cls: type[Settings], field: str) -> type:
    return next(c for c in cls.__mro__ if field in c.__dict__.get("__annotations__", {}))


def readers() -> dict[str, set[tuple[type, str]]]:
    """Variable -> {(class that reads it, field)}."""
    out: dict[str, set[tuple[type, str]]] = defaultdict(set)
    for cls in settings_classes():
        for name, var in ((n, f.validation_alias) for n, f in cls.model_fields.items()):
            out[var].add((cls, name))
    return out


def test_the_walk_sees_every_service():
    seen = set(settings_classes())
    assert {RouterConfig, DirectoryConfig, EngineConfig, ProfileConfig, WorkerConfig, PrefillWorkerConfig,
            DecodeWorkerConfig, MemberSettings, ServiceSettings, CapabilitySettings} <= seen


def test_every_variable_is_declared_by_one_class_with_one_default():
    for var, read_by in readers().items():
        assert re.fullmatch(r"PD_[A-Z0-9_]+", var), var
        owners = {declaring_class(cls, field) for cls, field in read_by}
        assert len(owners) == 1, f"{var} is declared by {sorted(c.__name__ for c in owners)}"
        defaults = {repr(cls.model_fields[field].default) for cls, field in read_by}
        assert len(defaults) == 1, f"{var} has defaults {defaults}"
        assert len({field for _, field in read_by}) == 1, f"{var} names two fields"


def test_a_class_reads_each_variable_for_one_field():
    for cls in settings_classes():
        assert len(cls.env_names()) == len(cls.model_fields), cls.__name__


def test_the_shared_variables_have_their_owners():
    owner = {var: declaring_class(*next(iter(r))) for var, r in readers().items()}
    assert owner[contract.DIRECTORY_ADDRESS_ENV] is MemberSettings
    assert owner["PD_MODEL"] is MemberSettings
    assert owner["PD_LOG_LEVEL"] is ServiceSettings
    for var in ("PD_NUM_BLOCKS", "PD_BLOCK_SIZE", "PD_CHUNK_TOKENS", "PD_TORCH_THREADS"):
        assert owner[var] is EngineConfig
    assert not HAND_READ & owner.keys()


def test_every_variable_the_launcher_and_the_fault_suite_set_is_read_by_someone():
    declared = readers().keys()
    for path in ("tooling/cluster/launcher.py", "tooling/cluster/faults.py"):
        text = (ROOT / path).read_text()
        for var in re.findall(r'"(PD_[A-Z0-9_]+)"', text):
            assert var in declared, f"{path} sets {var}, which no settings class reads"


def test_every_field_keeps_its_docstring():
    for cls in settings_classes():
        for name, field in cls.model_fields.items():
            assert field.description, f"{cls.__name__}.{name} has no docstring"


@pytest.mark.parametrize("cls", [RouterConfig, DirectoryConfig, EngineConfig, ProfileConfig, WorkerConfig])
def test_an_empty_environment_gives_the_defaults(cls):
    assert cls.from_env({}) == cls()


def test_defaults_are_the_documented_ones():
    engine, worker = EngineConfig(), WorkerConfig()
    assert (engine.num_blocks, engine.chunk_tokens, engine.torch_threads) == (512, 256, 1)
    assert (worker.num_blocks, worker.chunk_tokens, worker.torch_threads) == (512, 256, 1)
    assert RouterConfig().directory_addr == worker.directory_addr == contract.DEFAULT_DIRECTORY_ADDRESS
    assert RouterConfig().model == worker.model == "tiny"
    assert (RouterConfig().max_attempts, DirectoryConfig().lease_ttl_s, worker.reservation_ttl_s) == (3, 10.0, 30.0)


def test_variables_parse_into_their_types_and_flags_win():
    env = {"PD_ROUTER_MAX_ATTEMPTS": "5", "PD_ROUTER_CANARY_FRACTION": "0.25",
           "PD_ROUTER_STREAM_START_WINDOWS": "yes", "PD_ROUTER_MODE": "auto", "PD_LOG_LEVEL": "DEBUG",
           "UNRELATED": "x", "pd_router_max_attempts": "9"}  # names match exactly, case included
    cfg = RouterConfig.from_env(env, default_mode="colocated", listen_addr=None)
    assert (cfg.max_attempts, cfg.canary_fraction, cfg.stream_start_windows) == (5, 0.25, True)
    assert (cfg.default_mode, cfg.log_level, cfg.listen_addr) == ("colocated", "DEBUG", contract.DEFAULT_ROUTER_ADDRESS)


def test_building_a_class_directly_reads_no_environment(monkeypatch):
    monkeypatch.setenv("PD_NUM_BLOCKS", "7")
    monkeypatch.setenv("PD_ROUTER_MAX_ATTEMPTS", "9")
    assert (EngineConfig().num_blocks, RouterConfig().max_attempts) == (512, 3)
    assert (EngineConfig.from_env().num_blocks, RouterConfig.from_env().max_attempts) == (7, 9)


def test_an_empty_variable_is_unset_for_workers_and_a_value_for_the_router():
    assert WorkerConfig.from_env({"PD_NUM_BLOCKS": "", "PD_MODEL": ""}).num_blocks == 512
    assert WorkerConfig.from_env({"PD_MODEL": ""}).model == "tiny"
    assert RouterConfig.from_env({"PD_ROUTER_TENANT_SLOS": ""}).tenant_slos == ""
    with pytest.raises(SettingsError, match="directory_addr must be non-empty"):
        RouterConfig.from_env({contract.DIRECTORY_ADDRESS_ENV: ""})


def test_a_bad_value_names_the_variable_in_one_line():
    with pytest.raises(SettingsError) as err:
        RouterConfig.from_env({"PD_ROUTER_MAX_ATTEMPTS": "many", "PD_ROUTER_CANARY_FRACTION": "2"})
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("RouterConfig: ")
    assert "PD_ROUTER_MAX_ATTEMPTS='many' (max_attempts): Input should be a valid integer" in msg
    assert "PD_ROUTER_CANARY_FRACTION='2' (canary_fraction): Input should be less than or equal to 1" in msg
    with pytest.raises(SettingsError, match=r"^WorkerConfig: transport='carrier' \(PD_TRANSPORT\): Input should be"):
        WorkerConfig(transport="carrier")
    with pytest.raises(ValueError, match="PD_TXN_TTL_S='0' \\(txn_ttl_s\\): Input should be greater than 0"):
        DirectoryConfig.from_env({"PD_TXN_TTL_S": "0"})


def test_cross_field_checks_stay():
    with pytest.raises(SettingsError, match="max_disaggregated_attempts must be in"):
        RouterConfig(max_attempts=2, max_disaggregated_attempts=3)
    with pytest.raises(SettingsError, match="attn_tile_tokens=24 is not a multiple of block_size=16"):
        WorkerConfig.from_env({"PD_ATTN_TILE_TOKENS": "24"})
    for bad in ({"reservation_ttl_s": 0}, {"prefill_ttl_s": -1}, {"max_chunk_blocks": 0},
                {"credit_window_bytes": 0}, {"transfer_timeout_s": 0}):
        with pytest.raises(SettingsError, match=next(iter(bad))):
            WorkerConfig(**bad)


def test_settings_are_frozen_and_replace_validates_again():
    cfg = WorkerConfig()
    with pytest.raises(ValueError):
        cfg.num_blocks = 3
    assert cfg.replace(worker_id="w1").worker_id == "w1"
    with pytest.raises(SettingsError, match="num_blocks"):
        cfg.replace(num_blocks=0)
    with pytest.raises(SettingsError, match="Extra inputs"):
        RouterConfig(max_atempts=4)


def test_each_role_reads_its_own_variables(monkeypatch):
    monkeypatch.setenv("PD_RESERVATION_TTL_S", "8")
    monkeypatch.setenv("PD_PREFILL_TTL_S", "20")
    prefill, roles = parse_config("prefill", ["--reservation-ttl-s", "3", "--num-blocks", "64"])
    assert type(prefill) is PrefillWorkerConfig and roles == ["prefill"]
    assert (prefill.prefill_ttl_s, prefill.num_blocks) == (20.0, 64)
    assert not hasattr(prefill, "reservation_ttl_s")
    decode, roles = parse_config("decode", ["--reservation-ttl-s", "3", "--worker-id", "d7"])
    assert type(decode) is DecodeWorkerConfig and roles == ["decode"]
    assert (decode.reservation_ttl_s, decode.worker_id) == (3.0, "d7")
    assert not hasattr(decode, "prefill_ttl_s")
    monkeypatch.setenv("PD_SERVE_PREFILL", "1")
    mixed, roles = parse_config("decode", [])
    assert type(mixed) is WorkerConfig and roles == ["decode", "prefill"]
    assert (mixed.reservation_ttl_s, mixed.prefill_ttl_s) == (8.0, 20.0)
    assert mixed.worker_id.startswith("decode-")


def test_a_worker_with_a_bad_setting_exits_with_one_line(monkeypatch, capsys):
    monkeypatch.setenv("PD_NUM_BLOCKS", "lots")
    with pytest.raises(SystemExit) as exit_:
        parse_config("prefill", [])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith("prefill_worker: bad configuration: PrefillWorkerConfig: PD_NUM_BLOCKS='lots'")
