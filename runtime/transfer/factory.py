"""Build a data-plane backend by name (the worker config's `transport`).

    make_receiver("tcp", host="0.0.0.0")  -> TcpReceiver
    make_sender("inproc")                 -> InprocSender

A backend is one entry in each table below; its module is imported only when
chosen (UCX pulls in ucxx). Keyword `options` go to the backend's constructor
(e.g. idle_timeout_s for receivers, io_timeout_s for senders, window_bytes for
the ucx sender's credit window). `advertise` is the host this process's data plane
names in the address it registers (PD_DATA_PLANE_ADVERTISE: the pod IP in
Kubernetes): tcp puts it in tcp://host:port instead of the bind host; ucx in
ucx://w2.nonce@host:pid/..., where it is also how a sender tells a peer on its own host.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from .base import KVReceiver, KVSender

_anonymous = itertools.count()


def _tcp_receiver(host: str, name: str, advertise: str = "", **options: Any) -> KVReceiver:
    from .tcp import TcpReceiver
    return TcpReceiver(host=host, advertise_host=advertise, **options)


def _inproc_receiver(host: str, name: str, advertise: str = "", **options: Any) -> KVReceiver:
    from .inproc import InprocReceiver
    return InprocReceiver(name or f"receiver-{next(_anonymous)}", **options)


def _ucx_receiver(host: str, name: str, advertise: str = "", **options: Any) -> KVReceiver:
    from .ucx import UcxReceiver
    from .ucx.runtime import advertise_host
    advertise_host(advertise)
    return UcxReceiver(**options)


def _tcp_sender(advertise: str = "", **options: Any) -> KVSender:
    from .tcp import TcpSender
    return TcpSender(**options)


def _ucx_sender(advertise: str = "", **options: Any) -> KVSender:
    from .ucx import UcxSender
    from .ucx.runtime import advertise_host
    advertise_host(advertise)
    return UcxSender(**options)


def _inproc_sender(advertise: str = "", **options: Any) -> KVSender:
    from .inproc import InprocSender
    return InprocSender(**options)


RECEIVERS: dict[str, Callable[..., KVReceiver]] = {
    "inproc": _inproc_receiver,
    "tcp": _tcp_receiver,
    "ucx": _ucx_receiver,
}
SENDERS: dict[str, Callable[..., KVSender]] = {
    "inproc": _inproc_sender,
    "tcp": _tcp_sender,
    "ucx": _ucx_sender,
}


def make_receiver(kind: str, host: str = "127.0.0.1", name: str = "", **options: Any) -> KVReceiver:
    """A receiver of backend `kind` listening on `host`; `name` is its inproc address."""
    return _pick(RECEIVERS, kind)(host, name, **options)


def make_sender(kind: str, **options: Any) -> KVSender:
    """A sender of backend `kind`."""
    return _pick(SENDERS, kind)(**options)


def _pick(table: dict[str, Callable], kind: str) -> Callable:
    try:
        return table[kind]
    except KeyError:
        raise ValueError(f"unknown transfer backend {kind!r}; known: {sorted(table)}") from None


def loggable(address: str) -> str:
    """How logs name a data-plane address: a ucx address by its host and pid (its mailbox
    nonce and worker address stay out of logs), any other as it is."""
    if address.startswith("ucx://"):
        from .ucx.wire import peer_name
        return f"ucx://{peer_name(address)}"
    return address
