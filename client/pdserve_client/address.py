"""Where the router is: explicit address, then $PD_ROUTER, then the local launcher's file.

The local launcher (tooling/cluster) writes the router's host:port to `router.addr` in
its state folder (`.pdserve` under the directory it was started from, by default), so
`pdctl` run from that directory, or anywhere with $PD_CLUSTER naming the folder, finds
a cluster started on a random port.
"""

from __future__ import annotations

import os
from pathlib import Path

from pdserve_client import contract

DEFAULT_ROUTER_ADDRESS = contract.DEFAULT_ROUTER_ADDRESS
ROUTER_ENV = contract.ROUTER_ADDRESS_ENV
ROUTER_ADDR_FILE = Path(contract.ROUTER_ADDRESS_FILE)


def resolve_router_address(explicit: str | None = None, cwd: Path | None = None) -> str:
    """First non-empty of: `explicit`, $PD_ROUTER, $PD_CLUSTER/router.addr (ValueError when
    $PD_CLUSTER names a folder without one), ./.pdserve/router.addr, 127.0.0.1:50080."""
    if explicit:
        return explicit
    from_env = os.environ.get(ROUTER_ENV, "").strip()
    if from_env:
        return from_env
    cluster = os.environ.get(contract.CLUSTER_ENV, "").strip()
    if cluster:
        named = Path(cluster).expanduser() / ROUTER_ADDR_FILE.name
        try:
            return named.read_text().strip() or _no_address(named)
        except OSError as e:
            raise ValueError(f"${contract.CLUSTER_ENV}={cluster}: cannot read {named} ({e.strerror or e}); "
                             "is it the state folder of a cluster `pdserve up` started?") from None
    addr_file = (cwd or Path.cwd()) / ROUTER_ADDR_FILE
    try:
        from_file = addr_file.read_text().strip()
    except OSError:
        from_file = ""
    return from_file or DEFAULT_ROUTER_ADDRESS


def _no_address(path: Path) -> str:
    raise ValueError(f"{path} is empty: the cluster of this state folder is not running")
