"""Tests for apis.allocation: byte-exact encoding, Go-lenient decoding, the JSON toolkit."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.allocation import (
    ANNOTATION_DEVICE_ALLOCATED,
    AllocatedVF,
    AllocationDecodeError,
    AllocationExtension,
    DeviceAllocation,
    GoJSONError,
    JSONNumber,
    JSONObject,
    decode_allocations,
    encode_allocations,
    encode_int_allocations,
    go_json_dumps,
    go_json_loads,
    held_amounts,
    read_allocations,
    read_int,
)
from apis.quantity import BINARY_SI, DECIMAL_SI, Quantity

CORE = "koordinator.sh/gpu-core"
MEM = "koordinator.sh/gpu-memory"
RATIO = "koordinator.sh/gpu-memory-ratio"
RDMA = "koordinator.sh/rdma"
GI = 1024**3
UUID = "GPU-98583a5c-c155-9cf6-f955-03c189d3dbfb"

SPEC_GOLDEN = (
    '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"50",'
    '"koordinator.sh/gpu-memory":"8Gi","koordinator.sh/gpu-memory-ratio":"50"},'
    '"id":"GPU-98583a5c-c155-9cf6-f955-03c189d3dbfb"}]}'
)


def test_spec_golden_encode() -> None:
    alloc = DeviceAllocation.from_ints(0, {CORE: 50, MEM: 8 * GI, RATIO: 50}, UUID)
    assert encode_allocations({"gpu": [alloc]}) == SPEC_GOLDEN


def test_spec_golden_decode() -> None:
    decoded = decode_allocations(SPEC_GOLDEN)
    assert decoded == {
        "gpu": [DeviceAllocation.from_ints(0, {CORE: 50, MEM: 8 * GI, RATIO: 50}, UUID)]
    }
    assert decoded["gpu"][0].resources[MEM].format == BINARY_SI
    assert decoded["gpu"][0].resource_value(MEM) == 8 * GI
    assert decoded["gpu"][0].resource_value(RDMA) == 0
    assert encode_allocations(decoded) == SPEC_GOLDEN


ENCODE = [
    ("empty", {}, "{}"),
    ("empty-list", {"gpu": []}, '{"gpu":[]}'),
    (
        "types-sorted",
        {
            "rdma": [DeviceAllocation.from_ints(1, {RDMA: 100}, "0000:1f:00.0")],
            "gpu": [DeviceAllocation.from_ints(3, {CORE: 100})],
        },
        '{"gpu":[{"minor":3,"resources":{"koordinator.sh/gpu-core":"100"}}],'
        '"rdma":[{"minor":1,"resources":{"koordinator.sh/rdma":"100"},"id":"0000:1f:00.0"}]}',
    ),
    (
        "list-order-kept",
        {"gpu": [DeviceAllocation.from_ints(2, {}), DeviceAllocation.from_ints(0, {})]},
        '{"gpu":[{"minor":2,"resources":{}},{"minor":0,"resources":{}}]}',
    ),
    (
        "memory-odd",
        {"gpu": [DeviceAllocation.from_ints(0, {MEM: 85198045184, RATIO: 100})]},
        '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory":"83201216Ki",'
        '"koordinator.sh/gpu-memory-ratio":"100"}}]}',
    ),
    (
        "decimal-k",
        {"fpga": [DeviceAllocation.from_ints(0, {"koordinator.sh/fpga": 1000})]},
        '{"fpga":[{"minor":0,"resources":{"koordinator.sh/fpga":"1k"}}]}',
    ),
    (
        "extension-vfs",
        {
            "rdma": [
                DeviceAllocation.from_ints(
                    0,
                    {RDMA: 1},
                    "0000:09:00.0",
                    AllocationExtension(vfs=(AllocatedVF(0, "0000:09:00.2"), AllocatedVF(3))),
                )
            ]
        },
        '{"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"1"},"id":"0000:09:00.0",'
        '"extension":{"vfs":[{"busID":"0000:09:00.2"},{"minor":3}]}}]}',
    ),
    (
        "extension-empty",
        {"gpu": [DeviceAllocation(0, {}, extension=AllocationExtension())]},
        '{"gpu":[{"minor":0,"resources":{},"extension":{}}]}',
    ),
    (
        "extension-template",
        {"gpu": [DeviceAllocation(1, {}, extension=AllocationExtension((), "1g.10gb"))]},
        '{"gpu":[{"minor":1,"resources":{},"extension":{"gpuSharedResourceTemplate":"1g.10gb"}}]}',
    ),
    (
        "html-escaped-id",
        {"gpu": [DeviceAllocation(0, {}, id="<a&b>")]},
        '{"gpu":[{"minor":0,"resources":{},"id":"\\u003ca\\u0026b\\u003e"}]}',
    ),
]


@pytest.mark.parametrize(("allocs", "expect"), [e[1:] for e in ENCODE], ids=[e[0] for e in ENCODE])
def test_encode(allocs: dict[str, list[DeviceAllocation]], expect: str) -> None:
    assert encode_allocations(allocs) == expect
    assert decode_allocations(expect) == allocs


def test_encode_rejects_minor_outside_int32() -> None:
    with pytest.raises(ValueError, match="out of int32 range"):
        encode_allocations({"gpu": [DeviceAllocation(2**31, {})]})


STRINGS = [
    ("plain", "abc", '"abc"'),
    ("html", "<>&", '"\\u003c\\u003e\\u0026"'),
    ("quote-backslash", 'a"b\\c', '"a\\"b\\\\c"'),
    ("short-escapes", "\b\f\n\r\t", '"\\b\\f\\n\\r\\t"'),
    ("control", "\x00\x01\x1f", '"\\u0000\\u0001\\u001f"'),
    ("del-raw", "\x7f", '"\x7f"'),
    ("line-separators", "\u2028\u2029", '"\\u2028\\u2029"'),
    ("unicode-raw", "é中😀", '"é中😀"'),
    ("lone-surrogate", "\ud800", '"\\ufffd"'),
]


@pytest.mark.parametrize(("text", "expect"), [s[1:] for s in STRINGS], ids=[s[0] for s in STRINGS])
def test_go_string_escaping(text: str, expect: str) -> None:
    assert go_json_dumps(text) == expect
    if "\ud800" not in text:
        assert json.loads(expect) == text


DUMPS = [
    ("null", None, "null"),
    ("bools", [True, False], "[true,false]"),
    ("ints", [0, -1, 2**40], "[0,-1,1099511627776]"),
    ("map-sorted", {"b": 1, "a": {"d": [], "c": None}}, '{"a":{"c":null,"d":[]},"b":1}'),
    ("pairs-kept", JSONObject((("z", 1), ("a", 2))), '{"z":1,"a":2}'),
    ("quantity", Quantity.of(16 * GI, BINARY_SI), '"16Gi"'),
    ("number", JSONNumber("1e3"), "1e3"),
    ("tuple", ("x",), '["x"]'),
]


@pytest.mark.parametrize(("value", "expect"), [d[1:] for d in DUMPS], ids=[d[0] for d in DUMPS])
def test_go_json_dumps(value: object, expect: str) -> None:
    assert go_json_dumps(value) == expect


def test_go_json_dumps_rejects_floats() -> None:
    with pytest.raises(TypeError):
        go_json_dumps(1.5)


DECODE = [
    ("null", "null", {}),
    ("empty", " {} ", {}),
    ("null-list", '{"gpu":null}', {"gpu": []}),
    (
        "numbers-as-quantities",
        '{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":100,'
        '"koordinator.sh/gpu-memory":"16Gi"}}]}',
        {"gpu": [DeviceAllocation.from_ints(1, {CORE: 100, MEM: 16 * GI})]},
    ),
    (
        "exponent-number",
        '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":1e2}}]}',
        {"gpu": [DeviceAllocation(0, {CORE: Quantity.of(100)})]},
    ),
    (
        "case-insensitive-fields",
        '{"gpu":[{"MINOR":2,"Resources":{},"ID":"x","Extension":{"VFS":[{"BusId":"b"}]}}]}',
        {"gpu": [DeviceAllocation(2, {}, "x", AllocationExtension((AllocatedVF(0, "b"),)))]},
    ),
    (
        "later-key-wins",
        '{"gpu":[{"minor":1,"Minor":2,"minor":3,"resources":{}}]}',
        {"gpu": [DeviceAllocation(3, {})]},
    ),
    (
        "folded-key-last",
        '{"gpu":[{"minor":1,"Minor":2,"resources":{}}]}',
        {"gpu": [DeviceAllocation(2, {})]},
    ),
    (
        "unknown-ignored",
        '{"gpu":[{"minor":0,"resources":{},"future":[1,2]}]}',
        {"gpu": [DeviceAllocation(0, {})]},
    ),
    ("minor-absent", '{"gpu":[{}]}', {"gpu": [DeviceAllocation(0, {})]}),
    (
        "nulls-absent",
        '{"gpu":[{"minor":null,"resources":null,"id":null,"extension":null}]}',
        {"gpu": [DeviceAllocation(0, {})]},
    ),
    (
        "null-quantity-is-zero",
        '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":null}}]}',
        {"gpu": [DeviceAllocation(0, {CORE: Quantity.of(0)})]},
    ),
    (
        "quantity-blanks",
        '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":" 50 "}}]}',
        {"gpu": [DeviceAllocation.from_ints(0, {CORE: 50})]},
    ),
    ("negative-zero", '{"gpu":[{"minor":-0}]}', {"gpu": [DeviceAllocation(0, {})]}),
]


@pytest.mark.parametrize(("text", "expect"), [d[1:] for d in DECODE], ids=[d[0] for d in DECODE])
def test_decode(text: str, expect: dict[str, list[DeviceAllocation]]) -> None:
    assert decode_allocations(text) == expect


DECODE_ERRORS = [
    ("empty-string", "", "invalid JSON"),
    ("truncated", '{"gpu":[{"minor":0', "invalid JSON"),
    ("trailing", "{} x", "invalid JSON"),
    ("nan", '{"gpu":[{"minor":NaN}]}', "invalid JSON"),
    ("top-array", "[]", ": expected an object, got array"),
    ("list-object", '{"gpu":{}}', "gpu: expected an array, got object"),
    ("entry-null", '{"gpu":[null]}', "gpu[0]: expected an object, got null"),
    ("entry-string", '{"gpu":["x"]}', "gpu[0]: expected an object, got string"),
    ("minor-string", '{"gpu":[{"minor":"0"}]}', "gpu[0].minor: expected an integer, got string"),
    ("minor-float", '{"gpu":[{"minor":1.0}]}', "gpu[0].minor: expected an integer, got 1.0"),
    ("minor-exp", '{"gpu":[{"minor":1e2}]}', "gpu[0].minor: expected an integer, got 1e2"),
    ("minor-negative", '{"gpu":[{"minor":-1}]}', "gpu[0].minor: must not be negative, got -1"),
    (
        "minor-int32",
        '{"gpu":[{"minor":2147483648}]}',
        "gpu[0].minor: integer 2147483648 out of int32 range",
    ),
    (
        "bad-quantity",
        '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory":"12Zi"}}]}',
        'gpu[0].resources["koordinator.sh/gpu-memory"]: invalid quantity "12Zi"',
    ),
    (
        "quantity-bool",
        '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":true}}]}',
        'gpu[0].resources["koordinator.sh/gpu-core"]: expected a quantity, got boolean',
    ),
    (
        "resources-list",
        '{"gpu":[{"minor":0,"resources":[]}]}',
        "gpu[0].resources: expected an object, got array",
    ),
    ("id-number", '{"gpu":[{"minor":0,"id":7}]}', "gpu[0].id: expected a string, got number"),
    (
        "extension-string",
        '{"gpu":[{"minor":0,"extension":"x"}]}',
        "gpu[0].extension: expected an object, got string",
    ),
    (
        "vf-minor",
        '{"gpu":[{"extension":{"vfs":[{"minor":"1"}]}}]}',
        "gpu[0].extension.vfs[0].minor: expected an integer, got string",
    ),
]


@pytest.mark.parametrize(
    ("text", "fragment"), [d[1:] for d in DECODE_ERRORS], ids=[d[0] for d in DECODE_ERRORS]
)
def test_decode_errors(text: str, fragment: str) -> None:
    with pytest.raises(AllocationDecodeError) as info:
        decode_allocations(text)
    message = str(info.value)
    assert message.startswith(f"invalid {ANNOTATION_DEVICE_ALLOCATED} annotation: ")
    assert fragment in message


def test_go_json_loads_keeps_number_literals_and_pairs() -> None:
    value = go_json_loads('{"a":1.50,"a":2,"b":[1e3,-0]}')
    assert value == JSONObject(
        (
            ("a", JSONNumber("1.50")),
            ("a", JSONNumber("2")),
            ("b", [JSONNumber("1e3"), JSONNumber("-0")]),
        )
    )
    assert value.as_map()["a"] == JSONNumber("2")
    assert value.fields(["A"]) == {"A": JSONNumber("2")}


@pytest.mark.parametrize(
    ("literal", "bits", "expect"),
    [("127", 8, 127), ("-128", 8, -128), ("0", 32, 0)],
    ids=["max8", "min8", "zero"],
)
def test_read_int_ranges(literal: str, bits: int, expect: int) -> None:
    assert read_int(JSONNumber(literal), "x", bits) == expect


def test_read_int_rejects_out_of_range() -> None:
    with pytest.raises(GoJSONError, match="out of int8 range"):
        read_int(JSONNumber("128"), "x", 8)


def test_go_json_loads_rejects_deep_nesting() -> None:
    with pytest.raises(GoJSONError, match="invalid JSON"):
        go_json_loads("[" * 100000 + "]" * 100000)


_names = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=10)
_quantities = st.builds(
    lambda n, s, f: Quantity(Fraction(n, 10**s), f),
    st.integers(0, 10**18),
    st.integers(0, 9),
    st.sampled_from([DECIMAL_SI, BINARY_SI]),
)
_allocs = st.builds(
    DeviceAllocation,
    minor=st.integers(0, 2**31 - 1),
    resources=st.dictionaries(_names, _quantities, max_size=4),
    id=st.text(alphabet=st.characters(codec="utf-8"), max_size=20),
    extension=st.none()
    | st.builds(
        AllocationExtension,
        vfs=st.lists(
            st.builds(AllocatedVF, st.integers(0, 100), st.text(max_size=8)), max_size=2
        ).map(tuple),
        gpu_shared_resource_template=st.text(max_size=8),
    ),
)


@given(st.dictionaries(_names, st.lists(_allocs, max_size=3), max_size=3))
def test_round_trip_property(allocs: dict[str, list[DeviceAllocation]]) -> None:
    text = encode_allocations(allocs)
    assert decode_allocations(text) == allocs
    # A BinarySI integer that is no multiple of 1024 prints as plain digits and re-reads as
    # DecimalSI (Kubernetes does the same), so the text is stable from the second round on.
    again = encode_allocations(decode_allocations(text))
    assert encode_allocations(decode_allocations(again)) == again
    parsed = json.loads(text)
    assert list(parsed) == sorted(parsed)
    for items in parsed.values():
        for item in items:
            assert list(item)[:2] == ["minor", "resources"]
            assert list(item["resources"]) == sorted(item["resources"])


# -- the hot-path encoder ------------------------------------------------------------------------

_RESOURCE_NAMES = st.sampled_from(
    [
        "koordinator.sh/gpu-core",
        "koordinator.sh/gpu-memory",
        "koordinator.sh/gpu-memory-ratio",
        "koordinator.sh/rdma",
        "koordinator.sh/fpga",
    ]
)
_INT_ALLOCATION = st.tuples(
    st.integers(0, 2**31 - 1),
    st.dictionaries(_RESOURCE_NAMES, st.integers(0, 2**40), max_size=4).map(
        lambda d: tuple(sorted(d.items()))
    ),
    st.text(max_size=12),
)


@given(
    st.dictionaries(
        st.sampled_from(["gpu", "rdma", "fpga"]), st.lists(_INT_ALLOCATION, max_size=4),
        max_size=3,
    )
)
def test_the_hot_path_encoder_is_byte_identical_to_the_reference(
    allocs: dict[str, list[tuple[int, tuple[tuple[str, int], ...], str]]],
) -> None:
    reference = encode_allocations(
        {
            t: [DeviceAllocation.from_ints(m, dict(r), id=i) for m, r, i in items]
            for t, items in allocs.items()
        }
    )
    assert encode_int_allocations(allocs) == reference


# -- read_allocations / held_amounts: counting what a bound pod's annotation holds (issue 23) ---


def _gpu(resources: str, minor: str = "0") -> str:
    return f'{{"gpu":[{{"minor":{minor},"resources":{{{resources}}}}}]}}'


# (annotation, valid amounts, cards held whole, unreadable, a word of the problem)
READINGS: list[object] = [
    pytest.param(SPEC_GOLDEN, (("gpu", 0, ((CORE, 50), (MEM, 8 * GI), (RATIO, 50))),), (),
                 False, None, id="spec-golden-valid"),
    pytest.param(_gpu(f'"{CORE}":"0.5","{RATIO}":"1"'), (("gpu", 0, ((CORE, 1), (RATIO, 1))),),
                 (), False, None, id="fraction-rounds-up"),
    pytest.param(_gpu(f'"{MEM}":"1Ti"'), (("gpu", 0, ((MEM, 2**40),)),), (), False, None,
                 id="1Ti-is-the-largest-memory"),
    pytest.param('{"rdma":[{"minor":1,"resources":{"koordinator.sh/rdma":"100"}}]}',
                 (("rdma", 1, ((RDMA, 100),)),), (), False, None, id="rdma-valid"),
    pytest.param('{"xpu":[{"minor":0,"resources":{"x":"3"}}]}', (("xpu", 0, (("x", 3),)),), (),
                 False, None, id="unknown-type-valid"),
    pytest.param("{}", (), (), False, None, id="empty"),
    pytest.param(_gpu(f'"{CORE}":"-100","{RATIO}":"-100"'), (), (("gpu", 0),), False,
                 "negative amount -100", id="negative"),
    pytest.param(_gpu(f'"{CORE}":-1e2'), (), (("gpu", 0),), False, "negative amount -100",
                 id="negative-bare-exponent"),
    pytest.param(_gpu(f'"{CORE}":"-1m","{RATIO}":"50"'), (), (("gpu", 0),), False,
                 "negative amount -1m", id="negative-milli"),
    pytest.param('{"xpu":[{"minor":0,"resources":{"x":"-3"}}]}', (), (("xpu", 0),), False,
                 "negative", id="negative-unknown-type"),
    pytest.param(_gpu(f'"{RATIO}":"200"'), (), (("gpu", 0),), False,
                 "200 is more than one device has", id="percent-beyond-a-device"),
    pytest.param('{"fpga":[{"minor":0,"resources":{"koordinator.sh/fpga":"1k"}}]}', (),
                 (("fpga", 0),), False, "more than one device", id="fpga-beyond-a-device"),
    pytest.param(_gpu(f'"{MEM}":"1025Gi"'), (), (("gpu", 0),), False, "more than one device",
                 id="memory-beyond-1Ti"),
    pytest.param(_gpu(f'"{CORE}":"50","x":"1e999"'), (), (("gpu", 0),), False,
                 "more than one device", id="absurd-unknown-resource"),
    pytest.param(_gpu(f'"{CORE}":"0","{RATIO}":"0","{MEM}":"0"'), (), (("gpu", 0),), False,
                 "takes nothing", id="zero"),
    pytest.param(_gpu(""), (), (("gpu", 0),), False, "takes nothing", id="no-resources"),
    pytest.param('{"gpu":[{"minor":0}]}', (), (("gpu", 0),), False, "takes nothing",
                 id="resources-missing"),
    pytest.param(_gpu('"nvidia.com/gpu":"1"'), (), (("gpu", 0),), False, "takes nothing",
                 id="only-unknown-resources"),
    pytest.param('{"gpu":[{"minor":2,"resources":{"koordinator.sh/gpu-core":"10"}},'
                 '{"minor":3,"resources":{"koordinator.sh/gpu-core":"10"}},'
                 '{"minor":2,"resources":{"koordinator.sh/gpu-core":"10"}}]}',
                 (("gpu", 3, ((CORE, 10),)),), (("gpu", 2),), False, "device 2 named twice",
                 id="named-twice-both-entries-held-whole"),
    pytest.param(_gpu(f'"{CORE}":"NaN"'), (), (), True, "invalid quantity", id="nan"),
    pytest.param(_gpu(f'"{CORE}":"+Inf"'), (), (), True, "invalid quantity", id="inf"),
    pytest.param(_gpu(f'"{CORE}":NaN'), (), (), True, "invalid JSON", id="bare-nan"),
    pytest.param(_gpu(f'"{CORE}":"1e1000"'), (), (), True, "invalid quantity",
                 id="beyond-what-a-quantity-holds"),
    pytest.param(_gpu(f'"{CORE}":"lots"'), (), (), True, "invalid quantity", id="words"),
    pytest.param(_gpu(f'"{CORE}":[1]'), (), (), True, "expected a quantity", id="array"),
    pytest.param(_gpu(f'"{CORE}":"1"', minor="-1"), (), (), True, "must not be negative",
                 id="negative-minor"),
    pytest.param(_gpu(f'"{CORE}":"1"', minor="0.5"), (), (), True, "expected an integer",
                 id="fractional-minor"),
    pytest.param(_gpu(f'"{CORE}":"1"', minor="2147483648"), (), (), True, "int32",
                 id="minor-beyond-int32"),
    pytest.param('{"gpu":[null]}', (), (), True, "null", id="null-entry"),
    pytest.param('{"gpu":{"minor":0}}', (), (), True, "expected an array", id="not-a-list"),
    pytest.param("[]", (), (), True, "expected an object", id="top-level-array"),
    pytest.param("", (), (), True, "invalid JSON", id="empty-text"),
]


@pytest.mark.parametrize(("text", "amounts", "whole", "unreadable", "problem"), READINGS)
def test_read_allocations_never_counts_an_invalid_amount(
    text: str,
    amounts: tuple[object, ...],
    whole: tuple[object, ...],
    unreadable: bool,
    problem: str | None,
) -> None:
    reading = read_allocations(text)
    assert (reading.amounts, reading.whole, reading.unreadable) == (amounts, whole, unreadable)
    assert reading.valid == (problem is None)
    if problem is not None:
        assert any(problem in p for p in reading.problems), reading.problems
    assert all(a >= 0 for _, _, resources in reading.amounts for _, a in resources)


CARDS = [("gpu", 0, {CORE: 100, RATIO: 100, MEM: 16 * GI}),
         ("gpu", 1, {CORE: 100, RATIO: 100, MEM: 16 * GI}),
         ("rdma", 0, {RDMA: 100})]


@pytest.mark.parametrize(
    ("text", "held"),
    [
        pytest.param(_gpu(f'"{CORE}":"50"', minor="7"), [("gpu", 7, {CORE: 50})],
                     id="valid-on-a-card-the-node-lacks-counts-as-written"),
        pytest.param(
            '{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"50"}},'
            '{"minor":0,"resources":{"koordinator.sh/gpu-core":"-50"}}]}',
            [("gpu", 1, {CORE: 50}), ("gpu", 0, CARDS[0][2])], id="invalid-entry-holds-whole"),
        pytest.param(_gpu(f'"{CORE}":"-50"', minor="7"), [],
                     id="invalid-on-a-card-the-node-lacks-holds-nothing"),
        pytest.param("garbage", [(t, m, c) for t, m, c in CARDS], id="unreadable-holds-all"),
    ],
)
def test_held_amounts(text: str, held: list[object]) -> None:
    assert held_amounts(read_allocations(text), CARDS) == held


_amount = st.one_of(
    st.integers(-200, 2**41),
    st.sampled_from(["50", "-50", "8Gi", "-8Gi", "2Ti", "0.5", "NaN", "Inf", "x", "101"]),
)
_entry = st.fixed_dictionaries(
    {"minor": st.one_of(st.integers(-1, 3), st.just("0"))},
    optional={"resources": st.dictionaries(st.sampled_from([CORE, RATIO, MEM, "other"]),
                                           _amount, max_size=3)},
)
_annotation = st.dictionaries(st.sampled_from(["gpu", "rdma", "xpu"]),
                              st.lists(_entry, max_size=3), max_size=2).map(json.dumps)


@given(_annotation)
def test_what_an_annotation_holds_is_never_negative_nor_beyond_a_device(text: str) -> None:
    reading = read_allocations(text)
    assert reading.valid == (not reading.problems)
    for device_type, minor, amounts in held_amounts(reading, CARDS):
        assert all(0 <= a <= 2**40 for a in amounts.values()), (device_type, minor, amounts)
        if device_type == "gpu":  # a GPU holder always takes something of the card
            assert any(amounts.get(n, 0) > 0 for n in (CORE, RATIO, MEM)), amounts
    keys = [(t, m) for t, m, _ in reading.amounts]
    assert len(keys) == len(set(keys)) and not set(keys) & set(reading.whole)
