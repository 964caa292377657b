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
"""Collections nested this deep crashed libyaml's composer (SIGSEGV from ~30,000, PyYAML
6.0.3); PyYAML 6.0.4's libyaml stops at 1,000 and the pure loader's re-parse recursed."""

def _deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


def _device(spec_extra: bytes, card: bytes = b"") -> bytes:
    return (
        b'{"apiVersion":"scheduling.koordinator.sh/v1alpha1","kind":"Device",'
        b'"metadata":{"name":"n1"},"spec":{"devices":[{"type":"gpu","minor":0' + card + b"}]"
        + spec_extra + b"}}"
    )


def _gang_annotation(key: str, value: bytes) -> bytes:
    """The gang target's input: a JSON map of annotations (a string value as it is)."""
    import json

    p = "gang.scheduling.koordinator.sh"
    head = json.dumps({f"{p}/name": "g", f"{p}/min-available": "1"})[:-1]
    return head.encode() + b', "' + f"{p}/{key}".encode() + b'": ' + json.dumps(
        value.decode()).encode() + b"}"  # fmt: skip


def _laughs(key: bytes, levels: int = 9) -> bytes:
    """``key`` set to an alias of ``10**levels`` strings in 10 bytes per level."""
    lines = [b'a0: &a0 "lol"']
    for i in range(1, levels + 1):
        lines.append(b"a%d: &a%d [" % (i, i) + b", ".join([b"*a%d" % (i - 1)] * 10) + b"]")
    return b"\n".join(lines) + b"\n" + key + b": *a%d\nkind: Pod\n" % levels


def _strategy(value: bytes) -> bytes:
    return b'{"gatherStrategy":[{"layer":"x","strategy":' + value + b"}]}"


CASES = [
    # YAML files: nested past the stack (C loader) or the recursion limit (pure loader)
    ("scenario", b"[" * DEEP_FLOW + b"]" * DEEP_FLOW, "nested deeper than"),
    ("scenario", b"kind: " + b"{a: " * DEEP_FLOW + b"1" + b"}" * DEEP_FLOW, "nested deeper than"),
    ("config", b"profiles: " + b"[" * DEEP_FLOW + b"]" * DEEP_FLOW, "nested deeper than"),
    ("scenario", b"- " * DEEP_FLOW + b"a\n", "nested deeper than"),  # compact block sequences
    ("sweep", b"nodes: " + b"[" * DEEP_FLOW + b"]" * DEEP_FLOW, "nested deeper than"),
    ("fake-gpus", b"gpus: " + b"[" * 2000 + b"]" * 2000, "nested deeper than"),
    ("fake-gpus", b"{a: " * 1000 + b"1" + b"}" * 1000, "nested deeper than"),
    ("fake-gpus", b"".join(b" " * i + b"a:\n" for i in range(600)) + b" " * 600 + b"1\n",
     "nested deeper than"),
    # values PyYAML's constructor turns into a ValueError, not a YAMLError: an integer past
    # str()'s 4,300 digits, a timestamp that is no date
    ("scenario", b"a: " + b"9" * 5000 + b"\n", "4300"),
    ("scenario", b"a: 2001-13-45\n", "month"),
    ("config", b"percentageOfNodesToScore: " + b"9" * 5000 + b"\n", "4300"),
    ("sweep", b"seeds: " + b"9" * 5000 + b"\n", "4300"),
    ("fake-gpus", b"gpus: [{minor: " + b"9" * 5000 + b"}]\n", "4300"),
    # a scenario object whose apiVersion is a mapping (TypeError: unhashable, testing it
    # against the set of known kinds), and one that is a "billion laughs" alias: named in the
    # error by repr, it took minutes and gigabytes
    ("scenario", b"apiVersion: {a: 1}\nkind: Pod\n", "apiVersion"),
    ("scenario", _laughs(b"apiVersion"), "apiVersion"),
    # a sweep file of many keys: its duplicate-key check compared each key with all before it
    # (60,000 keys: minutes), in the pure-Python loader
    ("sweep", b"".join(b"k%d: 1\n" % i for i in range(60_000)), "unknown field"),
    # a watch ERROR event whose reason or message is deep: str() of it recursed (the informer
    # raises ApiError for an ERROR event; the target holds that as its refusal)
    ("informer", b'{"type":"ERROR","object":{"code":500,"reason":' + _deep(3000) + b"}}", ""),
    ("informer", b'{"type":"ERROR","object":{"code":500,"message":' + _deep(3000) + b"}}", ""),
    # ... and events whose metadata.name, namespace or resourceVersion is deep (the informer's
    # key and version: str() of them recursed)
    *[("informer", b'{"type":"%s","object":{"metadata":{"name":"x","%s":' % (t, f)
       + _deep(3000) + b"}}}", "") for t in (b"ADDED", b"DELETED", b"BOOKMARK")
      for f in (b"name", b"namespace", b"resourceVersion")
      if t != b"BOOKMARK" or f == b"resourceVersion"],  # a bookmark reads its version only
    # a PodGroup whose metadata is not an object (AttributeError: 'str' has no 'get')
    ("pod-group", b'{"metadata":"g"}', "metadata"),
    # JSON the API server accepts (10,000 levels) reaching decoders that recursed on it:
    # json.loads itself (RecursionError is no ValueError), or a deep copy / dump / repr of a
    # decoded value
    ("device-cr", _device(b',"x":' + _deep(3000)), "nested deeper than"),
    ("device-cr", _device(b"", card=b',"x":' + _deep(3000)), "nested deeper than"),
    ("pdb", b'{"metadata":{"name":"b"},"status":{"disruptionsAllowed":' + _deep(3000) + b"}}",
     "disruptionsAllowed"),
    ("topology", b'{"links":[],"x":' + _deep(3000) + b"}", "nested deeper than"),
    ("topology", b'{"links":[{"minors":[0,1],"gpuLinkType":"NVLink","nvlinks":' + _deep(3000)
     + b"}]}", "nested deeper than"),
    ("topology", _deep(5000), "nested deeper than"),
    ("partition-table", _deep(5000), "expected an object"),
    ("partition-spec", b'{"allocatePolicy":' + _deep(3000) + b"}", "allocatePolicy"),
    ("partition-table", b'{"1":[{"minors":' + _deep(3000) + b"}]}", "minors"),
    ("gang", _gang_annotation("groups", _deep(3000)), "groups"),
    ("gang", _gang_annotation("network-topology-spec", _deep(3000)), "network-topology-spec"),
    ("gang", _gang_annotation("network-topology-spec", _strategy(_deep(3000))), "strategy"),
    # a strategy that is a list (TypeError: unhashable type, testing it against a set)
    ("gang", _gang_annotation("network-topology-spec", _strategy(b"[]")), "strategy"),
    # a container named by an object, on a pod with container statuses (TypeError: unhashable
    # type, looking its status up by name)
    ("pod", b'{"metadata":{"name":"p"},"spec":{"containers":[{"name":{}}]},'
     b'"status":{"containerStatuses":[{"name":"c"}]}}', "spec.containers[0].name"),
]


@pytest.mark.parametrize(("name", "data", "message"), CASES, ids=[f"{c[0]}-{i}" for i, c in
                                                                  enumerate(CASES)])  # fmt: skip
def test_found_crash_is_now_the_declared_error(name: str, data: bytes, message: str) -> None:
    target = by_name(name)
    outcome = run_bounded(target.run, target.errors, data, seconds=30, memory_bytes=1 << 30)
    # a target that declares no error (its decoder never raises) returns; the others refuse
    expected = "refused" if target.errors else "ok"
    assert outcome.kind == expected, f"{name}: {outcome.kind}: {outcome.detail}"
    assert message in outcome.detail
