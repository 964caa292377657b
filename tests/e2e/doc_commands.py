"""The shell commands of README.md and docs/*.md, as a user reads them (library of
``test_doc_commands.py``; no test here).

A command lives in a fenced block tagged ``sh``, ``bash``, ``shell`` or ``console``:

- ``sh``/``bash``/``shell``: every line that is not blank or a ``#`` comment is a command; a
  line ending in ``\\`` continues on the next one;
- ``console``: the lines starting with ``$ `` are commands, the lines after one (up to the next
  ``$ ``) its documented output.

An untagged block (or ``text``) whose line starts like a command (``make``, ``kubectl``,
``.venv/bin/...``, an optional ``$ `` prompt and ``NAME=value`` prefixes first) is reported by
``untagged_commands``: it must be tagged so that the commands in it are checked.

A command's key is ``(doc, normalized text)``: its shell words joined by single spaces, comments
dropped (a change of spacing or of a comment keeps the key; a change of a word does not).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL_LANGS = frozenset({"sh", "bash", "shell", "console"})
UNTAGGED = frozenset({"", "text"})
_FENCE = re.compile(r"^\s*```(\S*)\s*$")
_PROGRAMS = (
    r"make|kubectl|kubectl-\S+|koord-scheduler|koordlet|\.venv/bin/\S+|python3?|pytest|bash|sh"
    r"|podman|docker|skopeo|promtool|curl|cd|git|helm|kustomize|nvidia-smi|ldconfig|eval"
)
_LOOKS_LIKE_COMMAND = re.compile(rf"^\s*(\$\s+)?(\w+=\S*\s+)*({_PROGRAMS})(\s|$)")


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Command:
    doc: str  # path relative to the repository root
    line: int  # 1-based line of its first physical line
    block: int  # 1-based line of its block's opening fence
    text: str  # as written: continuation lines joined with "\\\n", trailing comment kept
    output: tuple[str, ...] = ()  # the documented output (console blocks), right-stripped

    @property
    def key(self) -> tuple[str, str]:
        return (self.doc, normalize(self.text))

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def normalize(text: str) -> str:
    """The shell words of ``text``, comments dropped, joined by single spaces."""
    text = text.replace("\\\n", " ")
    try:
        words = shlex.split(text, comments=True)
    except ValueError:  # unbalanced quotes: keep the text, spacing collapsed
        words = text.split()
    return " ".join(words)


def _blocks(path: Path) -> list[tuple[str, int, list[str]]]:
    """(language, line of the opening fence, body lines) for each fenced block."""
    lines = path.read_text().splitlines()
    out: list[tuple[str, int, list[str]]] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        out.append((m.group(1).lower(), i + 1, lines[i + 1 : j]))
        i = j + 1
    return out


def _logical(body: list[str], first: int) -> list[tuple[int, str]]:
    """Join backslash continuations: (line number, text) per logical line."""
    out: list[tuple[int, str]] = []
    start, parts = 0, list[str]()
    for n, raw in enumerate(body, first):
        if not parts:
            start = n
        parts.append(raw)
        if raw.rstrip().endswith("\\"):
            continue
        out.append((start, "\n".join(parts)))
        parts = []
    if parts:
        out.append((start, "\n".join(parts)))
    return out


def commands(path: Path) -> list[Command]:
    doc = str(path.relative_to(ROOT))
    found: list[Command] = []
    for lang, fence, body in _blocks(path):
        if lang not in SHELL_LANGS:
            continue
        if lang == "console":
            current: tuple[int, str] | None = None
            output: list[str] = []
            for n, text in _logical(body, fence + 1):
                if text.startswith("$ "):
                    if current:
                        found.append(Command(doc, current[0], fence, current[1], tuple(output)))
                    current, output = (n, text[2:].strip()), []
                elif current:
                    output.extend(ln.rstrip() for ln in text.splitlines())
            if current:
                found.append(Command(doc, current[0], fence, current[1], tuple(output)))
            continue
        for n, text in _logical(body, fence + 1):
            stripped = text.strip()
            if stripped and not stripped.startswith("#"):
                found.append(Command(doc, n, fence, stripped))
    return found


def untagged_commands(path: Path) -> list[str]:
    """``doc:line: text`` for each command-looking line of an untagged block."""
    doc = str(path.relative_to(ROOT))
    return [
        f"{doc}:{n}: {line.strip()}"
        for lang, fence, body in _blocks(path)
        if lang in UNTAGGED
        for n, line in enumerate(body, fence + 1)
        if _LOOKS_LIKE_COMMAND.match(line)
    ]


_INLINE = re.compile(r"`([^`\n]+)`")
_INLINE_COMMAND = re.compile(r"^(\.venv/bin/)?(koord-scheduler|koordlet|make)\s")


def inline_commands(path: Path) -> list[tuple[str, str]]:
    """``(doc:line, text)`` of the inline code spans outside fenced blocks that start with
    ``make``, ``koord-scheduler`` or ``koordlet`` (with or without ``.venv/bin/``)."""
    doc = str(path.relative_to(ROOT))
    out: list[tuple[str, str]] = []
    fenced = False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if _FENCE.match(line) or re.match(r"^\s*```\s*$", line):
            fenced = not fenced
            continue
        if not fenced:
            out += [(f"{doc}:{n}", m) for m in _INLINE.findall(line) if _INLINE_COMMAND.match(m)]
    return out
