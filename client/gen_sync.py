"""Regenerate the blocking client from the asyncio one with unasync (`make sync-client`).

    python client/gen_sync.py              # rewrite client/pdserve_client/_sync/client.py in place
    python client/gen_sync.py --out DIR    # write DIR/client.py instead
    python client/gen_sync.py --check      # exit 1, with a diff, if the checked-in file is stale

`pdserve_client/_async/client.py` is the only source of the client; unasync
drops `async`/`await`, maps the async dunders (`__aenter__`, `__anext__`,
StopAsyncIteration, ...) to their blocking names, and the replacements below
rename the classes and point the import of `_async/_shims.py` at its
hand-written twin `_sync/_shims.py`. Output is deterministic, and
tests/unit/sdk/test_gen_sync.py fails when the checked-in file differs from a
fresh run, so an edit of the source without `make sync-client` cannot land.

Why a checked-in file and not generation at build time: `pip install ./client`
then needs nothing beyond grpcio and protobuf (unasync is a test dependency of
the server, not a dependency of the client), an editable install or a plain
PYTHONPATH checkout runs the same code as a wheel, and the blocking client can
be read, grepped and reviewed like any other module. Like tooling/gen_stubs.py
for the pd.v1 stubs, the generator lives outside the package it writes into,
so it is not shipped.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import tempfile
from pathlib import Path

import unasync

PACKAGE_DIR = Path(__file__).resolve().parent / "pdserve_client"
ASYNC_DIR = PACKAGE_DIR / "_async"
SYNC_DIR = PACKAGE_DIR / "_sync"
SOURCES = ("client.py",)
"""Files of `_async/` turned into `_sync/`; `_shims.py` is written by hand on both sides."""
REPLACEMENTS = {
    "_async": "_sync",
    "AsyncClient": "Client",
    "AsyncTokenStream": "TokenStream",
}
"""Name tokens renamed besides unasync's own table (it would make Async* names Sync*)."""
HEADER = "# Generated from pdserve_client/_async/{name} by client/gen_sync.py (unasync); do not edit.\n"


def generate(out_dir: Path) -> list[Path]:
    """Write the blocking version of every SOURCES file into `out_dir`; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        # unasync writes each file to its path with `fromdir` replaced by `todir`.
        rule = unasync.Rule(fromdir=f"{ASYNC_DIR}{os.sep}", todir=f"{tmp}{os.sep}",
                            additional_replacements=REPLACEMENTS)
        unasync.unasync_files([str(ASYNC_DIR / name) for name in SOURCES], [rule])
        for name in SOURCES:
            path = out_dir / name
            path.write_text(HEADER.format(name=name) + (Path(tmp) / name).read_text())
            written.append(path)
    return written


def stale(out_dir: Path = SYNC_DIR) -> list[str]:
    """Unified diffs of the files in `out_dir` that differ from a fresh run (empty: current)."""
    diffs = []
    with tempfile.TemporaryDirectory() as tmp:
        for fresh in generate(Path(tmp)):
            current = out_dir / fresh.name
            old = current.read_text().splitlines(keepends=True) if current.exists() else []
            new = fresh.read_text().splitlines(keepends=True)
            if old != new:
                diffs.append("".join(difflib.unified_diff(old, new, str(current), f"fresh {fresh.name}")))
    return diffs


def main(argv: list[str] | None = None) -> int:
    """Command line: regenerate in place, into --out, or --check."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write here instead of pdserve_client/_sync")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the checked-in file is stale")
    args = parser.parse_args(argv)
    if args.check:
        diffs = stale()
        sys.stdout.writelines(diffs)
        if diffs:
            print("pdserve_client/_sync is stale: run `make sync-client`", file=sys.stderr)
        return 1 if diffs else 0
    for path in generate(args.out or SYNC_DIR):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
