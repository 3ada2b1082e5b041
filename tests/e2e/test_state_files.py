"""Files at rest (docs/design.md, Security): the local cluster's state folder and every
folder in it are 0700, every file in it 0600, the ones its processes write later too:
the spans of a request, Redis's rewritten append-only file, a certificate issued after
the start. Walked on a real local cluster (runtime/common/private_files.py)."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import redis

from pdserve_client.spans import SPANS_FILE
from tests.support.cluster import client, start_cluster


def loose(root: Path) -> dict[str, str]:
    """Every path from `root` down that is not its owner's alone (folders 0700, files 0600) -> its mode."""
    wrong = {}
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode != (0o700 if path.is_dir() else 0o600):
            wrong[str(path.relative_to(root))] = oct(mode)
    return wrong


def wait_for(check, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_the_state_folder_and_every_file_in_it_are_the_owners_alone(tmp_path):
    cluster = start_cluster(tmp_path, prefill=1, decode=1)
    try:
        with client(cluster) as sdk:
            sdk.generate_full(prompt_ids=[5, 6, 7, 8], max_tokens=3)
        wait_for(lambda: (cluster.state / SPANS_FILE).exists())
        store = redis.Redis.from_url(cluster.redis_url)
        store.bgrewriteaof()  # files Redis creates now, not at its start
        wait_for(lambda: not store.info("persistence")["aof_rewrite_in_progress"]
                 and not store.info("persistence")["aof_rewrite_scheduled"])
        store.close()
        cluster.issue_client("acme")
        cluster.stop("collector")
        cluster.restart("collector")  # its log opened again
        names = {p.name for p in cluster.state.rglob("*")}
        assert {"appendonly.aof", "redis.conf", "cluster.json", "router.addr", "spans.jsonl", "router.log",
                "client-acme.crt", "client-acme.key", "ca.crt", "ca.key"} <= names, names
        assert loose(cluster.state) == {}
    finally:
        cluster.down()
