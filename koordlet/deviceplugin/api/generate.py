"""Regenerate the Python modules of the device-plugin ``api.proto``
(``python -m koordlet.deviceplugin.api.generate``; ``--check`` exits 1 when they are stale).

Role: the same generator as the runtime-hook API (``runtimehooks.api.generate``: protoc in a
subprocess, the repository root as include path, typed stubs), pointed at this folder, so both
APIs' generated code comes out of one procedure.

Invariants: the output is a pure function of ``api.proto`` and the installed grpcio-tools;
files are written only after every step succeeded.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from runtimehooks.api.generate import REPO_ROOT, render
from runtimehooks.api.generate import generate as runtimehooks_generate

__all__ = ["API_DIR", "PROTO", "generate", "main", "stale_files"]

API_DIR: Final = Path(__file__).resolve().parent
PROTO: Final = API_DIR / "api.proto"


def generate(out_dir: Path = API_DIR) -> list[Path]:
    """Write the generated modules into ``out_dir``; returns the paths written."""
    return runtimehooks_generate(out_dir, PROTO, REPO_ROOT)


def stale_files(out_dir: Path = API_DIR) -> list[str]:
    """Names of generated files in ``out_dir`` that differ from a fresh generation."""
    return [
        name
        for name, content in render(PROTO, REPO_ROOT).items()
        if not (out_dir / name).is_file() or (out_dir / name).read_bytes() != content
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m koordlet.deviceplugin.api.generate",
        description="Regenerate the Python modules of the device-plugin api.proto.",
    )
    parser.add_argument("--out", type=Path, default=API_DIR, help="output directory")
    parser.add_argument("--check", action="store_true", help="exit 1 if stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.out)
        if stale:
            print(f"stale generated files: {', '.join(stale)}; run `make proto`", file=sys.stderr)
            return 1
        return 0
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
