"""What a user reads matches what ships: the documented default configuration is the real file,
and shipped text (docs, manifests, examples, ``--help``) names no document a user does not have
(the project's internal SPEC sections, its issue numbers)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INTERNAL = re.compile(r"SPEC §\s*\d|SPEC\.md|\b[Ii]ssue \d+")


def _shipped_text() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for pattern in ("*.yaml", "*.yml", "*.json"):
        files += sorted((ROOT / "config").rglob(pattern))
    return files


def test_the_documented_default_file_is_the_real_one() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    section = doc.split("## The default file", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None, "docs/configuration.md: no yaml block under 'The default file'"
    assert block.group(1) == (ROOT / "config" / "scheduler-config.yaml").read_text()


@pytest.mark.parametrize("path", _shipped_text(), ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_text_names_no_internal_document(path: Path) -> None:
    lines = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if INTERNAL.search(line)
    ]
    assert not lines, "\n".join(lines)


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        ("scheduler.cli", ["--help"]),
        ("scheduler.cli", ["simulate", "--help"]),
        ("scheduler.cli", ["run", "--help"]),
        ("scheduler.cli", ["extender", "--help"]),
        ("scheduler.cli", ["inspect", "--help"]),
        ("scheduler.cli", ["explain", "--help"]),
        ("scheduler.cli", ["webhook", "--help"]),
        ("scheduler.cli", ["webhook", "serve", "--help"]),
        ("scheduler.cli", ["webhook", "certs", "--help"]),
        ("koordlet.cli", ["--help"]),
        ("koordlet.cli", ["run", "--help"]),
        ("koordlet.cli", ["report", "--help"]),
    ],
)
def test_help_names_no_internal_document(module: str, argv: list[str]) -> None:
    main = __import__(module, fromlist=["main"]).main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    assert out.getvalue().strip()
    assert not INTERNAL.search(out.getvalue()), out.getvalue()
