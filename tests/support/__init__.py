"""Helpers the test tiers share, imported as ``tests.support.<module>``.

Every folder under tests/ is a package (an ``__init__.py`` each), so test modules
are imported by their full dotted name from the repository root: two folders may
hold files of the same name, and a spawned worker process finds its command
module by that name.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the repository root
