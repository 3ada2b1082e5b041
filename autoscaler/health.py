"""`python -m autoscaler.health --file F --max-age-s S`: exit 0 when the autoscaler's
heartbeat file (PD_AUTOSCALER_HEARTBEAT_FILE, touched after every decision) is younger
than S seconds, else 1 with why. The chart's probes run it: a loop stuck in a call, or
one that never made its first decision, is restarted."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """The probe's exit code."""
    ap = argparse.ArgumentParser(prog="python -m autoscaler.health", description=__doc__.split("\n")[0])
    ap.add_argument("--file", required=True, type=Path, help="the heartbeat file")
    ap.add_argument("--max-age-s", required=True, type=float, help="oldest heartbeat that still counts, s")
    args = ap.parse_args(argv)
    try:
        age = time.time() - args.file.stat().st_mtime
    except FileNotFoundError:
        print(f"no heartbeat at {args.file}: no decision made yet", file=sys.stderr)
        return 1
    if age > args.max_age_s:
        print(f"last decision {age:.0f} s ago (more than {args.max_age_s:g} s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
