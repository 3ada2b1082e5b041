"""The names and numbers every pdserve process and client must agree on, defined once.

Default addresses, the environment variables that name other services, the
serving and release mode names, how a pd.v1 ErrorCode maps onto a gRPC status,
and the message limits. Imported by the router, the directory, the workers, the
launcher and the SDK (so it imports nothing but the standard library: the SDK
installs without the server's dependencies). tests/unit/common/test_contract.py pins
that every user agrees.
"""

from __future__ import annotations

ROUTER_PORT = 50080
"""Default gRPC port of the router (pd.v1.Router and pd.v1.Admin)."""
DIRECTORY_PORT = 50070
"""Default gRPC port of the directory (pd.v1.Directory)."""
DEFAULT_ROUTER_ADDRESS = f"127.0.0.1:{ROUTER_PORT}"
DEFAULT_DIRECTORY_ADDRESS = f"127.0.0.1:{DIRECTORY_PORT}"

ROUTER_ADDRESS_ENV = "PD_ROUTER"
"""host:port of the router, for clients (SDK, pdctl)."""
DIRECTORY_ADDRESS_ENV = "PD_DIRECTORY_ADDR"
"""host:port of the directory, for the router and the workers."""
LOCAL_STATE_DIR = ".pdserve"
"""Default state folder of the local cluster (`pdserve up`), under the current directory."""
ROUTER_ADDRESS_FILE = f"{LOCAL_STATE_DIR}/router.addr"
"""Where the local launcher writes the router's host:port, relative to the directory
it was started from; `pdctl` run from there finds the cluster."""
CLUSTER_ENV = "PD_CLUSTER"
"""A local cluster's state folder (what `pdserve up` made: ./.pdserve by default, or its
--state-dir), for clients anywhere: its router.addr and its tls/ folder, together."""

MODES = ("disaggregated", "colocated", "auto", "shadow", "canary")
"""Serving modes by name: pd.v1.Mode without its MODE_ prefix, lower case."""
RELEASE_MODES = ("pinned", "shadow", "canary", "active", "rolled_back")
"""Release modes by name: pd.v1.ReleaseMode without its RELEASE_MODE_ prefix, lower case."""

ERROR_CODE_STATUS = {
    "UNSPECIFIED": "INTERNAL",
    "INVALID_ARGUMENT": "INVALID_ARGUMENT",
    "RESOURCE_EXHAUSTED": "RESOURCE_EXHAUSTED",
    "ADMISSION_REJECTED": "RESOURCE_EXHAUSTED",
    "DEADLINE_EXCEEDED": "DEADLINE_EXCEEDED",
    "CANCELLED": "CANCELLED",
    "UNAVAILABLE": "UNAVAILABLE",
    "CACHE_ABI_MISMATCH": "FAILED_PRECONDITION",
    "STALE_GENERATION": "ABORTED",
    "CAPABILITY_DENIED": "PERMISSION_DENIED",
    "TRANSFER_FAILED": "ABORTED",
    "INTERNAL": "INTERNAL",
}
"""pd.v1.ErrorCode name (without ERROR_CODE_) -> gRPC status name. A failed transfer is
ABORTED: the transaction was aborted and the request may run again under a new
generation (the router does that itself; a client may retry the request)."""

RETRYABLE_STATUSES = frozenset({"UNAVAILABLE", "RESOURCE_EXHAUSTED", "ABORTED"})
"""gRPC statuses after which the same request may succeed if sent again."""

MAX_MESSAGE_BYTES = 8 << 20
"""Largest gRPC message any pdserve channel or server sends or accepts (8 MiB: a
prompt of ~1M token ids; the default 4 MiB of gRPC allows ~500k)."""
MAX_REQUEST_ID_BYTES = 256
"""Longest request id, in UTF-8 bytes: a transfer id (request id, '/', generation) must fit
the data plane's 1,024-byte id field, whatever characters the id uses."""
MAX_TENANT_BYTES = 128
"""Longest tenant name, in UTF-8 bytes (it keys prefix caches and directory records)."""
MAX_PRIORITY = 1000
"""A request's priority lies in [-MAX_PRIORITY, MAX_PRIORITY] (GenerateRequest.priority)."""
MAX_LOGPROBS = 20
"""Most alternatives a token's log-probabilities may list (SamplingParams.logprobs):
OpenAI's cap on chat's top_logprobs, and vLLM's default max_logprobs."""

# ---- mutual TLS (client/pdserve_client/tls.py, runtime/security) -------------------
ROLES = ("router", "directory", "prefill", "decode", "mixed", "operator", "client", "monitor", "collector")
"""What a certificate may name as its holder's role. Its subject common name is
``<role>/<name>``: a worker's name is its worker id, a client's is its tenant; a
monitor (a Prometheus scraper) may only read the processes' /metrics."""
SERVER_ROLES = {"router": ("router",), "directory": ("directory",), "prefill": ("prefill",),
                "decode": ("decode",), "mixed": ("decode", "prefill"), "collector": ("collector",)}
"""Role of a server certificate -> the services it may answer as (a mixed worker answers
pd.v1.Decode and pd.v1.Prefill; the local trace collector answers OTLP as `collector`);
each becomes a DNS name `server_name(service)`."""
TLS_DIR = f"{LOCAL_STATE_DIR}/tls"
"""Where `pdserve up` writes its throwaway CA (ca.crt) and one <name>.crt/.key per process."""
TLS_CA_FILE = "ca.crt"
TLS_CERT_ENV, TLS_KEY_ENV, TLS_CA_ENV = "PD_TLS_CERT", "PD_TLS_KEY", "PD_TLS_CA"
"""PEM files of this process's certificate, its private key and the CA it trusts."""
INSECURE_ENV = "PD_INSECURE"
"""1: plaintext, no identities, no authorization (debugging only; logged on every start)."""


def server_name(service: str) -> str:
    """The DNS name a server certificate carries for `service`; a client expects it."""
    return f"{service}.pdserve.internal"
