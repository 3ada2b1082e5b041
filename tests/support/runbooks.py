"""The commands a runbook (docs/runbooks/*.md) tells an operator to run, read from its
text as the operator reads them: every line of a code block that starts with one of
PROGRAMS (or `$ ` and one of them; a trailing backslash continues it), and every inline
code span that does. So a runbook's commands are its complete commands: a span naming a
tool without its arguments would be a command that fails.

`local(command, values)` fills in the placeholders a command may carry (NOT_FILLED says
which are not), the way an operator would on the local cluster.
"""

from __future__ import annotations

import re
from pathlib import Path

RUNBOOKS = Path(__file__).resolve().parents[2] / "docs" / "runbooks"
PROGRAMS = ("pdserve", "pdctl", "kubectl")
CODE_INDENT = "    "
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]+\b|/path/to/")
"""What is left for the operator to fill in: an upper-case word (REQUEST_ID, IDS, NS) or a
made-up path."""


def _is_command(text: str) -> bool:
    return text.split(" ", 1)[0] in PROGRAMS


def _code_lines(lines: list[str]) -> tuple[list[str], list[str]]:
    """(lines of code blocks, the other lines): indented blocks after a blank line, fences."""
    code, prose, fenced, previous = [], [], False, ""
    for line in lines:
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced or (line.startswith(CODE_INDENT) and (not previous.strip() or previous in code)):
            code.append(line)
        else:
            prose.append(line)
        previous = line
    return code, prose


def _block_commands(code: list[str]) -> list[str]:
    commands, pending = [], ""
    for line in code:
        text = line.strip().removeprefix("$ ")
        if pending:
            text, pending = pending + " " + text, ""
        if not _is_command(text):
            continue
        if text.endswith("\\"):
            pending = text[:-1].strip()
            continue
        commands.append(re.sub(r"\s+", " ", text))
    return commands


def commands(path: Path) -> list[str]:
    """The runbook's commands, code blocks first, each once, in the order they appear."""
    code, prose = _code_lines(path.read_text().splitlines())
    spans = [re.sub(r"\s+", " ", s).strip() for s in re.findall(r"`([^`]+)`", "\n".join(prose))]
    return list(dict.fromkeys(_block_commands(code) + [s for s in spans if _is_command(s)]))


def all_commands() -> dict[str, list[str]]:
    """Every runbook's commands, by file name."""
    return {p.name: commands(p) for p in sorted(RUNBOOKS.glob("*.md"))}


def local(command: str, values: dict[str, str]) -> str:
    """`command` with each placeholder in `values` (a regex -> its text) filled in;
    ValueError naming any placeholder left."""
    for pattern, value in values.items():
        command = re.sub(pattern, value, command)
    left = PLACEHOLDER.findall(command)
    if left:
        raise ValueError(f"{command!r}: no value for {left}")
    return command
