"""One variable names a local cluster for clients anywhere: $PD_CLUSTER, its state folder
(what `pdserve up` made), gives the SDK and pdctl the router's address and the
certificates together; $PD_ROUTER and $PD_TLS_* still win, and the current directory's
.pdserve comes after it. A folder that is not a cluster's says so."""

from __future__ import annotations

import pytest

from pdserve_client import address, contract, tls
from pdserve_client.tls import TlsConfigError


@pytest.fixture
def state(tmp_path):
    """A cluster's state folder somewhere else than the current directory: router.addr and tls/."""
    folder = tmp_path / "clusters" / "a"
    (folder / "tls").mkdir(parents=True)
    (folder / "router.addr").write_text("127.0.0.1:31337\n")
    for name in ("client", "operator"):
        (folder / "tls" / f"{name}.crt").write_bytes(f"{name} cert".encode())
        (folder / "tls" / f"{name}.key").write_bytes(f"{name} key".encode())
    (folder / "tls" / "ca.crt").write_bytes(b"the ca")
    return folder


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in (contract.ROUTER_ADDRESS_ENV, contract.CLUSTER_ENV, contract.TLS_CERT_ENV, contract.TLS_KEY_ENV,
                 contract.TLS_CA_ENV, contract.INSECURE_ENV):
        monkeypatch.delenv(name, raising=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no .pdserve here
    return monkeypatch


def test_pd_cluster_gives_the_address_and_the_certificates(state, clean_env):
    clean_env.setenv(contract.CLUSTER_ENV, str(state))
    assert address.resolve_router_address() == "127.0.0.1:31337"
    files = tls.resolve(identity="operator")
    assert (files.cert, files.key, files.ca) == (b"operator cert", b"operator key", b"the ca")


def test_pd_router_and_pd_tls_still_win_over_pd_cluster(state, clean_env, tmp_path):
    clean_env.setenv(contract.CLUSTER_ENV, str(state))
    clean_env.setenv(contract.ROUTER_ADDRESS_ENV, "10.0.0.1:50080")
    for env, name in ((contract.TLS_CERT_ENV, "c"), (contract.TLS_KEY_ENV, "k"), (contract.TLS_CA_ENV, "a")):
        (tmp_path / name).write_bytes(name.encode())
        clean_env.setenv(env, str(tmp_path / name))
    assert address.resolve_router_address() == "10.0.0.1:50080"
    assert tls.resolve().cert == b"c"


def test_pd_cluster_comes_before_the_current_directorys_cluster(state, clean_env, tmp_path):
    here = tmp_path / "elsewhere" / contract.LOCAL_STATE_DIR
    (here / "tls").mkdir(parents=True)
    (here / "router.addr").write_text("127.0.0.1:1111")
    clean_env.setenv(contract.CLUSTER_ENV, str(state))
    assert address.resolve_router_address() == "127.0.0.1:31337"


def test_a_folder_that_is_no_clusters_says_so(clean_env, tmp_path):
    clean_env.setenv(contract.CLUSTER_ENV, str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match=r"PD_CLUSTER=.*nothing.*cannot read .*router.addr"):
        address.resolve_router_address()
    with pytest.raises(TlsConfigError, match=r"nothing/tls/client.crt does not exist"):
        tls.resolve()


def test_without_it_nothing_changes(clean_env):
    assert address.resolve_router_address() == contract.DEFAULT_ROUTER_ADDRESS
    with pytest.raises(TlsConfigError, match="PD_CLUSTER"):  # the error names the variable
        tls.resolve()
