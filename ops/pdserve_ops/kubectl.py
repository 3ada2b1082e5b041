"""`kubectl pdserve`: a kubectl plugin (the console script `kubectl-pdserve`, found on PATH by
kubectl) that runs pdctl's drill and release commands against the pdserve release in the
cluster of the current kube context. It needs the `kube` extra:
pip install 'pdserve-ops[kube]'.

    kubectl pdserve drill rollback [pdctl drill options] [--release NAME] [--router ADDR]
    kubectl pdserve release status|promote|rollback [pdctl release options]
                                                    [--router ADDR | --release NAME]
    both: [--context CTX] [--namespace/-n NS]  (default: the kubeconfig's current ones)

kubectl hands a plugin only the words after its name, none of its own flags, so the plugin
reads the current context and that context's namespace from the kubeconfig itself (in a pod
without one: the pod's namespace), and these flags go after `kubectl pdserve`.

    drill:   pdctl drill ... --cluster kube --namespace NS --context CTX [--release] [--router]
    release: pdctl release ... [--router ADDR]: the one given, else (with --release) the
             router Service the release ConfigMap names, reachable from pods of the cluster,
             else pdctl's default ($PD_ROUTER, else 127.0.0.1:50080, where
             `kubectl port-forward svc/<release>-pdserve-router 50080` listens)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
COMMANDS = ("drill", "release")
USAGE = __doc__.split("\n\n")[1]


class PluginError(RuntimeError):
    """The plugin cannot build the pdctl command (the message says why)."""


class UsageError(PluginError):
    """The words given are no plugin command."""


def _flags() -> argparse.ArgumentParser:
    # Only the plugin's own flags; everything else passes through to pdctl in order.
    # No abbreviations: `--re` must not be taken for --release or --router.
    parser = argparse.ArgumentParser(prog="kubectl pdserve", add_help=False, allow_abbrev=False)
    parser.add_argument("--context", default=None)
    parser.add_argument("--namespace", "-n", default=None)
    parser.add_argument("--release", default=None)
    parser.add_argument("--router", default=None)
    return parser


def current_context(context: str | None) -> tuple[str | None, str]:
    """(context, namespace) as kubectl would pick them: `context` or the kubeconfig's current
    one, and the namespace that context names ("default" when none); without a kubeconfig,
    in a pod: (None, the pod's namespace)."""
    from kubernetes import config

    from pdserve_ops.drill.kube import in_pod, kubeconfig_path

    try:
        contexts, active = config.list_kube_config_contexts(kubeconfig_path())
    except config.ConfigException as e:
        if context is None and in_pod() and POD_NAMESPACE_FILE.exists():
            return None, POD_NAMESPACE_FILE.read_text().strip()
        raise PluginError(f"no kubeconfig ({kubeconfig_path()}): {e}") from None
    if context is not None:
        active = next((c for c in contexts if c["name"] == context), None)
        if active is None:
            raise PluginError(f"context {context!r} is not in the kubeconfig "
                              f"(contexts: {', '.join(c['name'] for c in contexts) or 'none'})")
    if not active:
        raise PluginError("the kubeconfig has no current context: give --context")
    return active["name"], active.get("context", {}).get("namespace") or "default"


def release_router(namespace: str, release: str, context: str | None) -> str:
    """The router address the release ConfigMap names, qualified for any namespace."""
    from pdserve_ops.drill.kube import KubernetesCluster

    cluster = KubernetesCluster(namespace, release, context)
    try:
        return cluster.router_address()
    finally:
        cluster.close()


def to_pdctl(argv: Sequence[str], resolve: Callable[[str | None], tuple[str | None, str]] = current_context,
             router_of: Callable[[str, str, str | None], str] = release_router) -> list[str]:
    """pdctl's argv for the plugin's `argv` (see the module docstring)."""
    opts, rest = _flags().parse_known_args(list(argv))
    if not rest or rest[0] not in COMMANDS:
        raise UsageError(f"expected one of {', '.join(COMMANDS)}\n{USAGE}")
    if rest[0] == "drill":
        context, namespace = resolve(opts.context)
        out = [*rest, "--cluster", "kube", "--namespace", opts.namespace or namespace]
        out += ["--context", context] if context else []
        out += ["--release", opts.release] if opts.release else []
        return out + (["--router", opts.router] if opts.router else [])
    router = opts.router
    if router is None and opts.release:
        context, namespace = resolve(opts.context)
        router = router_of(opts.namespace or namespace, opts.release, context)
    return [*rest, *(["--router", router] if router else [])]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `kubectl-pdserve`; returns pdctl's exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(f"usage:\n{USAGE}")
        return 0 if argv else 2
    try:
        import pdserve_ops.drill.kube  # noqa: F401  (the kube extra, or its install hint)
    except ImportError as e:
        print(f"kubectl pdserve: error: {e}", file=sys.stderr)
        return 1
    from pdserve_ops.drill.cluster import DrillError

    try:
        pdctl = to_pdctl(argv)
    except (PluginError, DrillError) as e:
        print(f"kubectl pdserve: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1
    from pdserve_ops import cli

    return cli.main(pdctl)


if __name__ == "__main__":
    sys.exit(main())
