"""The router: admission, route choice, attempts and retries for client requests.

Two wings over a small edge. `pricing/` prices routes and chooses one (the
per-request path, compiled when a build exists: router/native.py) and imports
nothing of the other wing; `requests/` runs a request (admission and its queue,
the planner, attempts and their teardown, the retry policy, the cluster view,
output and decision logs). The edge: `config`, `types`, `gateway` (the ABCs the
request wing talks through), and the only gRPC code, `grpc_gateway`, `convert`,
`server`, `admin` and `__main__`.
"""

from router.native import install as _install_native

_install_native()
