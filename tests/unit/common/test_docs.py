"""What a reader meets first, and what no reader can follow.

README.md opens with the two commands and says, on its first screen, that the built-in
engine computes on the CPU and what is to serve GPUs; docs/deploy.md says so at its top.
No tracked text file points at something a reader of the repository cannot open: a
numbered issue, or a reference code or the order of a paper the design started from.
What such a pointer meant is cited as a section of docs/design.md (or another doc).
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.support import REPO

PRIVATE = re.compile(
    r"(?i:article 0x)|\[0x0[0-9A-Fa-f]{2}|\b0x0[0-9A-F]{2}\b"  # reference codes: 0x06A, [0x06B]
    r"|\b0x[0-9A-F]*[G-Z]\w*"  # codes no hex number spells: 0x0FG, 0x09I
    r"|\b[Ii]ssues? [0-9]+|\b[Ii]ssue-[0-9]+"  # numbered issues
    r"|(?i:\b(?:the|this|seed) article\b|\barticle's\b|\b(?:the|this) issue's\b)"  # the same, unnumbered
)
SELF = "tests/unit/common/test_docs.py"  # names the patterns above
FIRST_SCREEN_LINES = 30
ON_CPU = re.compile(r"computes on the CPU", re.I)


def _tracked_text() -> dict[str, str]:
    """Every tracked file's text, generated stubs (`*_pb2*`, made from proto/) and binaries left out."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: no tracked files to read")
    names = listed.stdout
    texts = {}
    for name in names.decode().split("\0"):
        path = REPO / name
        if not name or name == SELF or "_pb2" in path.name or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            texts[name] = data.decode()
        except UnicodeDecodeError:
            continue
    return texts


def test_no_private_references():
    """Issue numbers and the seed paper's codes name nothing a reader can open."""
    found = [
        f"{name}:{number}: {line.strip()}"
        for name, text in _tracked_text().items()
        for number, line in enumerate(text.splitlines(), start=1)
        if PRIVATE.search(line)
    ]
    assert not found, "cite a section of docs/design.md instead:\n" + "\n".join(found)


def _first_screen(name: str) -> str:
    """The lines of `name` a reader sees before scrolling."""
    return "\n".join((REPO / name).read_text().splitlines()[:FIRST_SCREEN_LINES])


def test_readme_opens_with_the_two_commands_and_the_cpu_engine():
    """The two commands, where the engine computes today and what is to serve GPUs."""
    head = _first_screen("README.md")
    assert "make run" in head and "make test" in head
    assert ON_CPU.search(head), "README's first screen must say the built-in engine computes on the CPU"
    assert "vLLM" in head, "README's first screen must say what is to serve GPUs"


def test_deploy_says_the_engine_computes_on_the_cpu():
    """A cluster operator learns it before installing on GPU nodes."""
    head = _first_screen("docs/deploy.md")
    assert ON_CPU.search(head), "docs/deploy.md's top must say the built-in engine computes on the CPU"
    assert "vLLM" in head
