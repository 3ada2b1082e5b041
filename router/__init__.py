"""The router: admission, placement, attempts and retries for client requests.

Modules: `config` (RouterConfig), `types` (domain values), `admission`
(request checks), `placement` (pure placement + load overlay), `cluster_view`
(cached snapshot), `handoff` (manifest), `attempts` (one generation on one
route, and its teardown), `output` (forwarded tokens, continuation check),
`orchestrator` (retry policy, deadlines, cancellation), `gateway` (the ABCs it
talks through). gRPC lives only in `grpc_gateway`, `convert`, `server`,
`admin` and `__main__`. `native` loads compiled builds of the per-request modules when
they exist for the current source (router/native.py).
"""

from router.native import install as _install_native

_install_native()
