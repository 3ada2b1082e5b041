"""The bench helpers import each other by bare name (bench/transfer.py runs with bench/ on
its path): so do these tests, whichever of them runs first."""

from __future__ import annotations

import sys

from tests.support import REPO

if str(REPO / "bench") not in sys.path:
    sys.path.insert(0, str(REPO / "bench"))
