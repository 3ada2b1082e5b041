"""The house's plan, read from the code's own imports (docs/design.md, Processes and what
each owns): runtime/ is the shared floor and imports no service; the services do not
import each other (a mixed worker is one node with two roles, found by entry point); no
import cycle; no function over 60 lines in product code or test helpers (tests/support),
but the few listed in LONG_FUNCTIONS, a list that only shrinks (what hurts a reader is a
function's size and branching, not a file's length: ruff's C901, PLR0913 and PLR0915 are
on too, pyproject.toml)."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

from tests.support import REPO as ROOT

PRODUCT = ("router", "runtime", "kv_directory", "prefill_worker", "decode_worker", "client/pdserve_client",
           "ops/pdserve_ops", "tooling", "sim", "autoscaler")
SERVICES = ("router", "kv_directory", "prefill_worker", "decode_worker")


def _modules() -> dict[str, Path]:
    mods = {}
    for top in PRODUCT:
        base = (ROOT / top).parent
        for p in (ROOT / top).rglob("*.py"):
            if "_pb2" in p.name or "_native" in p.parts:
                continue
            parts = p.relative_to(base).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return mods


def _graph() -> dict[str, set[str]]:
    """Module -> product modules it imports (anywhere in the file, TYPE_CHECKING too)."""
    mods = _modules()
    graph: dict[str, set[str]] = collections.defaultdict(set)
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
                mod = ".".join(base + [node.module] if node.module else base)
                subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in mods]
                targets = subs + ([mod] if len(subs) < len(node.names) else [])
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in mods and t != name)
    return graph


def _top(module: str) -> str:
    return module.split(".")[0]


def test_the_shared_floor_imports_no_service():
    graph = _graph()
    up = sorted((a, b) for a, deps in graph.items() if _top(a) == "runtime"
                for b in deps if _top(b) in SERVICES)
    assert up == []


def test_nothing_that_serves_imports_the_tooling():
    """tooling/ (the local cluster, faults, load drivers, drills, the `pdserve` command, the
    stub generator) stands on the runtime and the services; nothing of those, and nothing of
    the client distribution, imports it."""
    graph = _graph()
    assert "tooling.cluster.launcher" in graph
    down = sorted((a, b) for a, deps in graph.items() if _top(a) != "tooling"
                  for b in deps if _top(b) == "tooling")
    assert down == []


def test_the_client_distribution_imports_nothing_of_the_server():
    graph = _graph()
    assert "pdserve_client.client" in graph
    server = sorted((a, b) for a, deps in graph.items() if _top(a) == "pdserve_client"
                    for b in deps if _top(b) != "pdserve_client")
    assert server == []


def test_the_sdk_imports_no_operator_tool_and_the_operator_tools_no_server():
    """client/ (pdserve_client: stubs, contract, TLS, the clients) is what users import beside
    their code; ops/ (pdserve_ops: pdctl, drills, the trace viewer, the kubectl plugin) stands
    on it alone."""
    graph = _graph()
    assert "pdserve_ops.cli" in graph and "pdserve_ops.drill.run" in graph
    sdk_up = sorted((a, b) for a, deps in graph.items() if _top(a) == "pdserve_client"
                    for b in deps if _top(b) == "pdserve_ops")
    ops_server = sorted((a, b) for a, deps in graph.items() if _top(a) == "pdserve_ops"
                        for b in deps if _top(b) not in ("pdserve_ops", "pdserve_client"))
    assert (sdk_up, [e for e in ops_server if e not in ON_DEMAND]) == ([], [])
    for module, target in ON_DEMAND:  # inside a function: pdctl's other commands never load it
        tree = ast.parse(_modules()[module].read_text())
        top = [n for n in tree.body if isinstance(n, ast.ImportFrom | ast.Import)]
        assert not any(target in ast.unparse(n) or target.split(".")[0] == getattr(n, "module", "") for n in top)


ON_DEMAND = {("pdserve_ops.cli_plan", "sim.cli")}
"""The operator tools' imports of server packages, each made when its command runs:
`pdctl plan` and `pdctl profile save` run the simulator (sim/, in the pdserve package),
and say so when it is not installed."""


def test_no_service_imports_another():
    graph = _graph()
    across = sorted((a, b) for a, deps in graph.items() if _top(a) in SERVICES
                    for b in deps if _top(b) in SERVICES and _top(b) != _top(a))
    assert across == []


def test_the_routers_pricing_wing_imports_nothing_of_its_request_wing():
    graph = _graph()
    assert "router.pricing.decision" in graph
    across = sorted((a, b) for a, deps in graph.items() if a.startswith("router.pricing")
                    for b in deps if b.startswith("router.requests"))
    assert across == []


def test_no_import_cycles():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    assert cycles == []


MAX_FUNCTION_LINES = 60
LONG_FUNCTIONS: dict[str, int] = {}
"""Functions over MAX_FUNCTION_LINES today, at their length: each may only get shorter,
and leaves the list once it fits."""


def _function_lengths(paths) -> dict[str, int]:
    """'path::name' -> lines (decorators to the last line) of every function in `paths`."""
    lengths = {}
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                key = f"{p.relative_to(ROOT)}::{node.name}"
                lengths[key] = max(lengths.get(key, 0), node.end_lineno - first + 1)
    return lengths


def test_no_function_is_over_60_lines_but_the_listed_ones_which_only_shrink():
    lengths = _function_lengths([*_modules().values(), *(ROOT / "tests" / "support").rglob("*.py")])
    long = {key: n for key, n in lengths.items() if n > MAX_FUNCTION_LINES}
    assert {k: n for k, n in long.items() if k not in LONG_FUNCTIONS} == {}, "new functions over 60 lines"
    assert {k: (n, LONG_FUNCTIONS[k]) for k, n in long.items() if k in LONG_FUNCTIONS and n > LONG_FUNCTIONS[k]} \
        == {}, "listed functions grew (lines now, lines listed)"
    assert sorted(set(LONG_FUNCTIONS) - set(long)) == [], "these fit now: take them off LONG_FUNCTIONS"


def test_the_reference_decision_is_imported_by_no_product_module():
    """router/pricing/reference.py is the oracle of tests and benches, not a serving path."""
    graph = _graph()
    assert "router.pricing.reference" in _modules()
    users = sorted(a for a, deps in graph.items() if "router.pricing.reference" in deps)
    assert users == []
