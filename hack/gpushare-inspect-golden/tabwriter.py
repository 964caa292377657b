"""Record Go's text/tabwriter (flags 0, padding 2, ' ') on random texts of tabs and newlines.

Usage: ``python hack/gpushare-inspect-golden/tabwriter.py`` (needs a Go toolchain; no network).
Builds tabwriter.go.txt (stdin through ``tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)``) and
writes tests/unit/fixtures/gpushare-inspect/tabwriter.json: ``[[input, output], ...]``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parents[1] / "tests" / "unit" / "fixtures" / "gpushare-inspect" / "tabwriter.json"
CELLS = ("", "a", "bb", "cccc", "NAME", "GPU0(Allocated)", "0/0", "x" * 9)


def texts(n: int, seed: int = 27) -> list[str]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        lines = [
            "\t".join(rnd.choice(CELLS) for _ in range(rnd.randint(1, 6)))
            for _ in range(rnd.randint(0, 10))
        ]
        out.append("\n".join(lines) + rnd.choice(("", "\n", "\t", "\t\n")))
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(HERE / "tabwriter.go.txt", Path(d) / "main.go")
        env = {**os.environ, "GO111MODULE": "off"}
        subprocess.run(["go", "build", "-o", "tw", "main.go"], cwd=d, check=True, env=env)
        tw = str(Path(d) / "tw")
        cases = []
        for text in texts(200):
            proc = subprocess.run([tw], input=text.encode(), capture_output=True, check=True)
            cases.append([text, proc.stdout.decode()])
    OUT.write_text(json.dumps(cases, indent=0) + "\n")


if __name__ == "__main__":
    main()
