"""Hypothesis strategies of deep, huge and odd input, per input form.

Role: ``inputs(target)`` is the short pass's generator for one target: its seeds mutated
(a subtree replaced by an odd value), and for its form (``targets.Target.form``):

- deep: JSON and flow-YAML nested 10,000-60,000 levels, alone or planted inside a seed;
  protobuf start-group tags nested past the parser's limit;
- huge: multi-MB strings, 100k-key objects, 1M-element arrays, giant CSV fields, many rows;
- odd: NaN/Infinity, 1e999, 5000-digit integers, -0, duplicate keys, a UTF-8 BOM, bytes
  that are not UTF-8, lone surrogate escapes, NULs, YAML anchors/aliases ("billion laughs"),
  YAML tags and merge keys, CSV with NULs and unbalanced quotes, frames of any length with
  any name length, request type and NaN/inf floats.

Every strategy yields ``bytes``, the one currency of ``targets.Target.run``.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import yaml
from hypothesis import strategies as st

from tests.fuzz.targets import Target

__all__ = ["inputs"]

_HOLE = "\x00HOLE\x00"

# -- JSON --------------------------------------------------------------------------------------

_ODD_JSON_TEXT = [
    "NaN", "Infinity", "-Infinity", "1e999", "-1e999", "-0", "0.0", "1" * 5000,
    "-" + "9" * 5000, "1e-999", "123456789012345678901234567890", '"\\ud800"', '"\\udfff\\ud800"',
    '"\\u0000"', '"' + "\\u0000" * 10 + '"', "true", "null", "[]", "{}", '""', '"\u2028"',
    '{"a":1,"a":2}', "[[[[[]]]]]", "2147483648", "-2147483649", "9223372036854775808",
    "18446744073709551616", "4294967296", '"-1"', '"1e3"', '"0x10"', '"1Ei"', '"99999999999E"',
    '"100"', "100", "-1", "1.5", '"1.5"', '" 7 "', '"\\t"',
]  # fmt: skip


def _scalar() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=30),
        st.sampled_from(["", "gpu", "rdma", "0", "100", "50%", "1Gi", "-1", "In", "Exists",
                         "Strict", "NodeTopologyLayer", "MustGather", "koordinator.sh/gpu-core",
                         "kube-system", "unhealthy-gpu-n1", "AdmissionReview", "Pod",
                         "admission.k8s.io/v1", "metadata", "spec", "status"]),
    )


def _json_value() -> st.SearchStrategy[Any]:
    return st.recursive(
        _scalar(),
        lambda kids: st.one_of(
            st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=12), kids, max_size=4)
        ),
        max_leaves=12,
    )


def _paths(doc: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) of ``doc``, iteratively."""
    out: list[tuple[Any, Any]] = []
    stack = [doc]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(
            node, list) else ()  # fmt: skip
        for k, v in items:
            out.append((node, k))
            stack.append(v)
    return out


@st.composite
def _mutated_json(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A seed with one to three values replaced: by another JSON value, an odd literal, or a
    deep nest planted in place."""
    doc = json.loads(draw(st.sampled_from(seeds)))
    planted: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        spots = _paths(doc)
        if not spots:
            break
        node, key = draw(st.sampled_from(spots))
        how = draw(st.integers(0, 3))
        if how == 0:
            node[key] = draw(_json_value())
        elif how == 1:
            node[key] = _HOLE
            planted.append(draw(st.sampled_from(_ODD_JSON_TEXT)))
        elif how == 2:
            node[key] = _HOLE
            planted.append(draw(_deep_json_text(min_depth=2000, max_depth=20000)))
        elif isinstance(node, dict):
            del node[key]
    text = json.dumps(doc, separators=(",", ":"))
    for piece in planted:
        text = text.replace(json.dumps(_HOLE), piece, 1)
    return text.encode()


@st.composite
def _deep_json_text(draw: st.DrawFn, min_depth: int = 10_000, max_depth: int = 60_000) -> str:
    n = draw(st.integers(min_depth, max_depth))
    shape = draw(st.sampled_from(["list", "object", "mixed", "unclosed"]))
    if shape == "list":
        return "[" * n + "]" * n
    if shape == "object":
        return '{"a":' * n + "1" + "}" * n
    if shape == "mixed":
        return '[{"metadata":' * n + "{}" + "}]" * n
    return "[" * n


@st.composite
def _huge_json(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["string", "keys", "array", "seed-string", "numbers"]))
    mb = draw(st.integers(1, 6))
    if kind == "string":
        return json.dumps("x" * (mb << 20)).encode()
    if kind == "keys":
        return json.dumps({f"k{i}": i for i in range(100_000 * mb // 2)}).encode()
    if kind == "array":
        return ("[" + ",".join(["0"] * (500_000 * mb // 3)) + "]").encode()
    if kind == "numbers":
        return ("[" + ",".join(["1" * 4000] * 300) + "]").encode()
    return json.dumps({"metadata": {"name": "x" * (mb << 20), "annotations": {
        "scheduling.koordinator.sh/device-allocated": "y" * (mb << 20)}}}).encode()


_ODD_BYTES = [
    b"\xef\xbb\xbf{}", b"\xef\xbb\xbf[]", b"\xff\xfe{\x00}\x00", b"{\"a\":\"\xff\xfe\"}",
    b"\x00", b"", b" ", b"{", b"}", b"[1,]", b"{\"a\":1,}", b"'a'", b"\xc3\x28", b"\xed\xa0\x80",
    b"{\"metadata\":{\"name\":\"\xed\xa0\x80\"}}", b"{\"\":{\"\":{\"\":null}}}",
    b"{\"kind\":\"AdmissionReview\",\"request\":[]}", b"NaN", b"Infinity", b"1e999",
]  # fmt: skip


def _odd_json() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.sampled_from(_ODD_BYTES),
        st.sampled_from(_ODD_JSON_TEXT).map(str.encode),
        st.binary(max_size=200),
        _json_value().map(lambda v: json.dumps(v).encode()),
    )


def _json_inputs(seeds: list[bytes]) -> st.SearchStrategy[bytes]:
    return st.one_of(
        _mutated_json(seeds),
        _deep_json_text().map(str.encode),
        _huge_json(),
        _odd_json(),
    )


# -- YAML --------------------------------------------------------------------------------------


_LAUGH_KEYS = ["gpus", "nodes", "traces", "profiles", "apiVersion", "kind", "metadata", "spec",
               "variants", "seeds", "healthFile", "driverVersion"]  # fmt: skip


def _billion_laughs(levels: int, fan: int, keys: list[str]) -> bytes:
    """``keys`` (top-level fields of the targets' files) set to an alias of ``fan**levels``
    strings, in a few hundred bytes."""
    lines = ['a0: &a0 "lol"']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fan) + "]")
    lines += [f"{key}: *a{levels - 1}" for key in keys]
    return ("\n".join(lines) + "\n").encode()


_ODD_YAML = [
    b"!!python/object/apply:os.system ['true']\n", b"a: !!binary aGVsbG8=\n", b"a: .nan\n",
    b"a: .inf\n", b"a: 1\na: 2\n", b"<<: {a: 1}\n", b"a: &x {b: 1}\nc: {<<: *x}\n",
    b"\xef\xbb\xbfa: 1\n", b"a: \xff\n", b"\ta: 1\n", b"a: \x00\n", b"--- 1\n--- 2\n",
    b"*unknown\n", b"a: &a [*a]\n", b"? [1, 2]\n: 3\n", b"{[1]: 2}\n", b"a: 0x1F\nb: 0o17\n",
    b"a: 1e999\n", b"a: " + b"9" * 5000 + b"\n", b"- - - - -\n", b"", b"---\n", b"...\n",
    b"%YAML 9.9\n--- a\n", b"a: 2001-12-14t21:59:43.10-05:00\n", b"a: !!set {x, y}\n",
    b"a: 2001-13-45\n", b"a: 0000-00-00\n", b"a: !!float 1e99999\n", b"a: !!int 0x\n",
]  # fmt: skip


@st.composite
def _mutated_yaml(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    docs = list(yaml.safe_load_all(draw(st.sampled_from(seeds))))
    doc = docs[draw(st.integers(0, len(docs) - 1))]
    for _ in range(draw(st.integers(1, 3))):
        spots = _paths(doc)
        if not spots:
            break
        node, key = draw(st.sampled_from(spots))
        if draw(st.booleans()):
            node[key] = draw(_json_value())
        elif isinstance(node, dict):
            del node[key]
        else:
            node[key] = draw(st.sampled_from([float("nan"), float("inf"), 10**40, -1, "", []]))
    return yaml.safe_dump_all(docs).encode()


@st.composite
def _deep_yaml(draw: st.DrawFn) -> bytes:
    n = draw(st.integers(10_000, 60_000))
    shape = draw(st.sampled_from(["flow-list", "flow-map", "in-key", "block"]))
    if shape == "flow-list":
        return b"gpus: " + b"[" * n + b"]" * n + b"\n"
    if shape == "flow-map":
        return b"{a: " * n + b"1" + b"}" * n + b"\n"
    if shape == "in-key":
        return b"nodes: " + b"{a: [" * (n // 2) + b"]}" * (n // 2) + b"\n"
    depth = n // 20  # block nesting grows quadratically in bytes
    return b"".join(b" " * i + b"a:\n" for i in range(depth)) + b" " * depth + b"1\n"


@st.composite
def _huge_yaml(draw: st.DrawFn) -> bytes:
    mb = draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["scalar", "keys", "list"]))
    if kind == "scalar":
        return b"a: " + b"x" * (mb << 20) + b"\n"
    # many nodes: the pure-Python loaders (strict duplicate-key loaders) parse ~50k lines/s
    if kind == "keys":
        return b"".join(b"k%d: %d\n" % (i, i) for i in range(10_000 * mb))
    return b"gpus:\n" + b"- 1\n" * (20_000 * mb)


def _yaml_inputs(seeds: list[bytes]) -> st.SearchStrategy[bytes]:
    return st.one_of(
        _mutated_yaml(seeds),
        _deep_yaml(),
        _huge_yaml(),
        st.builds(_billion_laughs, st.integers(6, 12), st.integers(6, 12),
                  st.lists(st.sampled_from(_LAUGH_KEYS), min_size=1, max_size=3, unique=True)),
        st.sampled_from(_ODD_YAML),
        st.binary(max_size=200),
        _json_value().map(lambda v: yaml.safe_dump(v).encode()),
    )


# -- TOML --------------------------------------------------------------------------------------


@st.composite
def _deep_toml(draw: st.DrawFn) -> bytes:
    depth = draw(st.integers(500, 20_000))
    if draw(st.booleans()):
        return b"a = " + b"[" * depth + b"]" * depth + b"\n"
    return b"a = " + b"{b=" * depth + b"1" + b"}" * depth + b"\n"


_ODD_TOML = [
    b"a = 1\na = 2\n", b"[t]\n[t]\n", b"a.b = 1\na = 1\n", b"a = 1e99999\n", b"a = nan\n",
    b"a = " + b"9" * 5000 + b"\n", b'a = "' + b"x" * 500_000 + b'"\n', b"a = 1979-13-45\n",
    b"\xef\xbb\xbfa = 1\n", b"a = \"\\ud800\"\n", b"[" + b"a." * 5000 + b"b]\n",
]  # fmt: skip


def _toml_inputs(seeds: list[bytes]) -> st.SearchStrategy[bytes]:
    return st.one_of(
        _mutated_bytes(seeds),
        _deep_toml(),
        st.sampled_from(_ODD_TOML),
        st.binary(max_size=200),
        st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    )


# -- CSV ---------------------------------------------------------------------------------------


@st.composite
def _mutated_csv(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    lines = draw(st.sampled_from(seeds)).split(b"\n")
    i = draw(st.integers(0, len(lines) - 1))
    cells = lines[i].split(b",")
    j = draw(st.integers(0, len(cells) - 1))
    cells[j] = draw(st.sampled_from([
        b"\x00", b"x" * 200_000, b'"', b'"a""b"', b"\xff", b"-1", b"9" * 5000, b"1e9", b"",
        b" 1 ", b"\xef\xbb\xbfsn", b"\r", b"1.5", b"\xe2\x80\xa8", b"|||", b"\xd9\xa3",
    ]))  # fmt: skip
    lines[i] = b",".join(cells)
    if draw(st.booleans()):
        lines.extend([lines[-2] if len(lines) > 1 else b""] * draw(st.integers(0, 3)))
    return b"\n".join(lines)


@st.composite
def _huge_csv(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    header, row = draw(st.sampled_from(seeds)).split(b"\n")[:2]
    kind = draw(st.sampled_from(["rows", "columns", "field"]))
    if kind == "rows":  # same name each row: the duplicate check must stay linear
        return header + b"\n" + b"".join(
            row.replace(row.split(b",")[0], b"r%d" % i, 1) + b"\n" for i in range(100_000)
        )
    if kind == "columns":
        return header + b"," + b",".join(b"c%d" % i for i in range(50_000)) + b"\n" + row
    return header + b"\n" + b"a" * (4 << 20) + b"\n"


def _csv_inputs(seeds: list[bytes]) -> st.SearchStrategy[bytes]:
    return st.one_of(
        _mutated_csv(seeds),
        _huge_csv(seeds),
        st.sampled_from([b"", b"\x00", b"\xef\xbb\xbf", b'"\n', b"sn\n\x00", b"\r\r\r",
                         b"sn,cpu_milli,memory_mib,gpu\n" + b"\x00" * 100]),
        st.binary(max_size=300),
    )


# -- protobuf ----------------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


@st.composite
def _structured_hook(draw: st.DrawFn) -> bytes:
    from runtimehooks.api import api_pb2

    text = st.text(max_size=40)
    annotations = draw(st.dictionaries(text, text, max_size=3))
    if draw(st.booleans()):
        annotations["scheduling.koordinator.sh/device-allocated"] = draw(
            st.one_of(_mutated_json(_allocation_seeds()), _odd_json()).map(
                lambda b: b.decode("utf-8", "replace")
            )
        )
    labels = draw(st.dictionaries(text, text, max_size=3))
    if draw(st.booleans()):
        labels["koordinator.sh/gpu-isolation-provider"] = draw(st.sampled_from(["hami-core", ""]))
    int64 = st.integers(-(2**63), 2**63 - 1)
    req = api_pb2.ContainerResourceHookRequest(
        pod_meta=api_pb2.PodSandboxMetadata(
            name=draw(text), uid=draw(text), namespace=draw(text),
            attempt=draw(st.integers(0, 2**32 - 1))),
        container_meta=api_pb2.ContainerMetadata(name=draw(text), id=draw(text)),
        pod_annotations=annotations,
        pod_labels=labels,
        container_envs=draw(st.dictionaries(text, text, max_size=3)),
        container_resources=api_pb2.LinuxContainerResources(
            cpu_period=draw(int64), cpu_quota=draw(int64), memory_limit_in_bytes=draw(int64),
            unified=draw(st.dictionaries(text, text, max_size=2))),
    )  # fmt: skip
    return bytes(req.SerializeToString())


def _allocation_seeds() -> list[bytes]:
    from tests.fuzz.targets import by_name

    return by_name("allocation").seeds()


@st.composite
def _mutated_bytes(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 8))):
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        data[i] = draw(st.integers(0, 255))
    return bytes(data)


def _proto_inputs(target: Target) -> st.SearchStrategy[bytes]:
    seeds = target.seeds()
    deep_groups = st.integers(50, 20_000).map(lambda n: b"\x0b" * n + b"\x0c" * n)
    deep_length = st.integers(10, 5_000).map(
        lambda n: b"".join(b"\x0a" + _varint(2 * (n - i)) for i in range(n))
    )
    huge = st.integers(1, 6).map(lambda mb: b"\x0a" + _varint((mb << 20) + 2) + b"\x0a\x00"
                                 + b"x" * (mb << 20))  # fmt: skip
    out = [_mutated_bytes(seeds), st.binary(max_size=300), deep_groups, deep_length, huge]
    if target.name == "hook-container":
        out.append(_structured_hook())
    return st.one_of(*out)


# -- fixed-size frames -------------------------------------------------------------------------


@st.composite
def _structured_frame(draw: st.DrawFn, size: int) -> bytes:
    name_len = draw(st.one_of(st.integers(0, 80), st.integers(0, 2**64 - 1)))
    name = draw(st.binary(max_size=60))
    kind = draw(st.one_of(st.integers(0, 4), st.integers(-(2**31), 2**31 - 1)))
    req_id = draw(st.integers(-(2**31), 2**31 - 1))
    tail = draw(st.sampled_from([
        struct.pack("<dd", float("nan"), 1.0), struct.pack("<dd", float("inf"), -1.0),
        struct.pack("<d", -0.0), struct.pack("<Qi", 2**64 - 1, 7), b"",
    ]))  # fmt: skip
    body = struct.pack("<Q", name_len) + name + b"\x00" + struct.pack("<ii", req_id, kind) + tail
    return (body + b"\x00" * size)[:size]


def _frame_inputs(target: Target) -> st.SearchStrategy[bytes]:
    seeds = target.seeds()
    size = len(seeds[0])
    return st.one_of(
        _mutated_bytes(seeds),
        _structured_frame(size),
        st.binary(min_size=size, max_size=size),
        st.binary(max_size=2 * size),
    )


def inputs(target: Target) -> st.SearchStrategy[bytes]:
    """The short pass's inputs for ``target`` (see the module docstring)."""
    seeds = target.seeds()
    if target.form in ("json", "text"):
        return _json_inputs(seeds)
    if target.form == "yaml":
        return _yaml_inputs(seeds)
    if target.form == "csv":
        return _csv_inputs(seeds)
    if target.form == "toml":
        return _toml_inputs(seeds)
    if target.form == "proto":
        return _proto_inputs(target)
    if target.form == "frame":
        return _frame_inputs(target)
    raise ValueError(f"{target.name}: no strategies for form {target.form!r}")
