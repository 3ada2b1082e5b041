"""`pdserve down --purge` (tooling/cluster/purge.py) removes a local cluster's state dir
and nothing else: a folder that is not one, or that holds the Python environment, the
working directory or the repository, is refused and left as it was."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tooling.cli import main
from tooling.cluster.purge import REPO_ROOT, NotPurged, purge


def state_dir(path: Path) -> Path:
    """What a stopped cluster leaves: Redis's files (the release record in them), logs, certificates."""
    (path / "tls").mkdir(parents=True)
    (path / "logs").mkdir()
    for name in ("redis.conf", "appendonly.aof", "release.json", "tls/ca.crt", "logs/router.log"):
        (path / name).write_text("x")
    return path


def test_a_state_dir_is_removed_whole_and_what_is_beside_it_stays(tmp_path):
    state = state_dir(tmp_path / ".pdserve")
    (tmp_path / "drill.json").write_text("{}")
    assert purge(state) is True
    assert not state.exists() and (tmp_path / "drill.json").exists()
    assert purge(state) is False  # nothing left to remove


def test_a_folder_that_is_no_state_dir_is_refused(tmp_path):
    (tmp_path / "mine.txt").write_text("keep")
    with pytest.raises(NotPurged, match="is not a pdserve state dir"):
        purge(tmp_path)
    assert (tmp_path / "mine.txt").read_text() == "keep"


@pytest.mark.parametrize("holds", ["prefix", "cwd", "repo"])
def test_a_folder_holding_the_venv_the_working_directory_or_the_repository_is_refused(tmp_path, monkeypatch, holds):
    state = state_dir(tmp_path / "state")
    inner = state / "inner"
    inner.mkdir()
    if holds == "prefix":
        monkeypatch.setattr(sys, "prefix", str(inner))
    elif holds == "cwd":
        monkeypatch.chdir(inner)
    else:
        monkeypatch.setattr("tooling.cluster.purge.REPO_ROOT", inner)
    with pytest.raises(NotPurged, match="nothing removed"):
        purge(state)
    assert (state / "redis.conf").exists()


def test_the_repository_itself_is_never_a_state_dir():
    assert (REPO_ROOT / "pyproject.toml").exists()
    with pytest.raises(NotPurged):
        purge(REPO_ROOT)


def test_pdserve_down_purge_with_no_cluster_running_still_removes_the_state(tmp_path, capsys):
    state = state_dir(tmp_path / ".pdserve")
    assert main(["down", "--purge", "--state-dir", str(state)]) == 0
    assert not state.exists()
    err = capsys.readouterr().err
    assert "no local cluster recorded" in err and "the next `pdserve up` starts from clean state" in err


def test_pdserve_down_purge_refuses_a_folder_it_does_not_know(tmp_path, capsys):
    assert main(["down", "--purge", "--state-dir", str(tmp_path)]) == 1
    assert "is not a pdserve state dir" in capsys.readouterr().err
