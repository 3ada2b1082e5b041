"""Where the router is: explicit address, then $PD_ROUTER, then the local launcher's file.

The local launcher (services/cluster) writes the router's host:port to
`.pdserve/router.addr` under the directory it was started from, so `pdctl` run
from the same directory finds a cluster started on a random port.
"""

from __future__ import annotations

import os
from pathlib import Path

from pdserve_client import contract

DEFAULT_ROUTER_ADDRESS = contract.DEFAULT_ROUTER_ADDRESS
ROUTER_ENV = contract.ROUTER_ADDRESS_ENV
ROUTER_ADDR_FILE = Path(contract.ROUTER_ADDRESS_FILE)


def resolve_router_address(explicit: str | None = None, cwd: Path | None = None) -> str:
    """First non-empty of: `explicit`, $PD_ROUTER, ./.pdserve/router.addr, 127.0.0.1:50080."""
    if explicit:
        return explicit
    from_env = os.environ.get(ROUTER_ENV, "").strip()
    if from_env:
        return from_env
    addr_file = (cwd or Path.cwd()) / ROUTER_ADDR_FILE
    try:
        from_file = addr_file.read_text().strip()
    except OSError:
        from_file = ""
    return from_file or DEFAULT_ROUTER_ADDRESS
