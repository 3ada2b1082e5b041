"""`python -m runtime.kernels [build|status]` (see runtime/kernels/__init__.py)."""

from __future__ import annotations

import sys

import runtime.kernels
from runtime.common.native import build_command
from runtime.kernels import ENV_KERNEL, build, build_path, choice, load


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    cmd = next((a for a in args if not a.startswith("-")), "build")
    if cmd == "build":
        return build_command("runtime.kernels", build, "the engine runs torch's kernels",
                             lambda done: f"{'compiled' if done else 'up to date'}: {build_path().name}",
                             "--strict" in args)
    if cmd == "status":
        mod = load()
        print(f"kernel: {'pdkernels ' + mod.isa() if mod else 'torch'} ({ENV_KERNEL}={choice()})")
        return 0 if mod is not None or choice() == "torch" else 1
    print(runtime.kernels.__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
