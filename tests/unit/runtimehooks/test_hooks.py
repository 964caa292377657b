"""runtimehooks.hooks: the default registry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from runtimehooks.hooks import new_default_registry
from runtimehooks.registry import FailurePolicy, Stage

ROOT = Path(__file__).resolve().parents[3]


def test_default_registry_has_the_gpu_hook_at_pre_create() -> None:
    registry = new_default_registry()
    assert registry.stages() == [Stage.PRE_CREATE_CONTAINER]
    (spec,) = registry.hooks(Stage.PRE_CREATE_CONTAINER)
    assert spec.name == "gpu-env-inject"
    assert spec.policy is FailurePolicy.FAIL


def test_each_call_builds_a_fresh_registry() -> None:
    assert new_default_registry() is not new_default_registry()
    ignore = new_default_registry(gpu_policy=FailurePolicy.IGNORE)
    assert ignore.hooks(Stage.PRE_CREATE_CONTAINER)[0].policy is FailurePolicy.IGNORE


def test_hooks_import_neither_protobuf_nor_grpc() -> None:
    code = (
        "import sys, runtimehooks.hooks, runtimehooks.hooks.gpu, runtimehooks.registry\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('grpc', 'google')]\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
