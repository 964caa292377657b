"""The scripts run by path (``python bench/b2_e2e.py``, ``python
hack/gpushare-inspect-golden/record.py``) import the e2e harness; run from anywhere, outside
pytest, they must find what it imports (``tests.ports``: ``tests.e2e.apiserver`` needs it).
Found broken: ``make bench-b2`` died with ``ModuleNotFoundError: No module named 'tests'``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "script", ["bench/b2_e2e.py", "bench/startup.py", "hack/gpushare-inspect-golden/record.py"]
)
def test_the_script_imports_its_harness_from_any_directory(script: str, tmp_path: Path) -> None:
    # Import the script as __main__ would, without running main(): its imports are the test.
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('script', {str(ROOT / script)!r})\n"
        "mod = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(mod)\n"
        "print('imported')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "imported", proc.stderr[-2000:]
