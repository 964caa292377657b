"""Every crash the fuzz tier found, as the input that found it (minimised by hand).

Each runs in a forked child (``tests.fuzz.bounded``): some of these killed the process
outright (libyaml's composer recursing in C until the stack ran out: SIGSEGV), which a plain
in-process test could not report. The property is the tier's: the target's declared error,
within the time and memory bounds.
"""

from __future__ import annotations

import pytest

from tests.fuzz.bounded import run_bounded
from tests.fuzz.targets import by_name

DEEP_FLOW = 50_000
"""Flow collections nested this deep crashed libyaml's composer (SIGSEGV from ~30,000)."""

CASES = [
    # YAML files: nested past the stack (C loader) or the recursion limit (pure loader)
    ("scenario", b"[" * DEEP_FLOW + b"]" * DEEP_FLOW, "nested deeper than"),
    ("scenario", b"kind: " + b"{a: " * DEEP_FLOW + b"1" + b"}" * DEEP_FLOW, "nested deeper than"),
    ("config", b"profiles: " + b"[" * DEEP_FLOW + b"]" * DEEP_FLOW, "nested deeper than"),
    ("sweep", b"nodes: " + b"[" * DEEP_FLOW + b"]" * DEEP_FLOW, "nested deeper than"),
    ("fake-gpus", b"gpus: " + b"[" * 2000 + b"]" * 2000, "nested deeper than"),
    ("fake-gpus", b"{a: " * 1000 + b"1" + b"}" * 1000, "nested deeper than"),
    ("fake-gpus", b"".join(b" " * i + b"a:\n" for i in range(600)) + b" " * 600 + b"1\n",
     "nested deeper than"),
    # a PodGroup whose metadata is not an object (AttributeError: 'str' has no 'get')
    ("pod-group", b'{"metadata":"g"}', "metadata"),
]


@pytest.mark.parametrize(("name", "data", "message"), CASES, ids=[f"{c[0]}-{i}" for i, c in
                                                                  enumerate(CASES)])  # fmt: skip
def test_found_crash_is_now_the_declared_error(name: str, data: bytes, message: str) -> None:
    target = by_name(name)
    outcome = run_bounded(target.run, target.errors, data, seconds=30, memory_bytes=1 << 30)
    assert outcome.kind == "refused", f"{name}: {outcome.kind}: {outcome.detail}"
    assert message in outcome.detail
