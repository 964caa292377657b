"""apis.allocation held to its exact contract: whole error messages (not fragments), the
int32/int64 bounds on both sides, what a reading records of the VFs an entry names.

The fragment checks of test_apis_allocation.py let a wrong path or a dropped reason through
(mutation testing, issue 45); these compare the whole line an operator reads.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.allocation import (
    ANNOTATION_DEVICE_ALLOCATED,
    AllocatedVF,
    AllocationExtension,
    AllocationReading,
    DeviceAllocation,
    GoJSONError,
    JSONNumber,
    decode_allocations,
    encode_allocations,
    encode_int_allocations,
    go_json_dumps,
    go_json_loads,
    read_allocations,
    read_int,
)
from apis.quantity import BINARY_SI, DECIMAL_SI, Quantity

# Equivalent mutants (make mutation MODULE=apis/allocation.py): no input tells them apart.
# mutmut-equivalent: apis.allocation.x__escape_char__mutmut_9
#   `<= 0xDFFF` -> `<= 57344` (0xE000): _escape_char only sees what _NEEDS_ESCAPE matched,
#   and U+E000 is not among it.
# mutmut-equivalent: apis.allocation.x__json_kind__mutmut_2
# mutmut-equivalent: apis.allocation.x__json_kind__mutmut_3
#   "null" -> "XXnullXX" / "NULL": nothing asks the kind of None (every read_* returns for
#   null before raising; _decode_one words its own null error).
# mutmut-equivalent: apis.allocation.x_decode_allocations__mutmut_3
#   read_object(..., "") -> (..., None): both paths are falsy, so the message is the bare
#   reason either way, and decode_allocations keeps only the message.
# mutmut-equivalent: apis.allocation.x_read_allocations__mutmut_50
#   whole[key] = None -> "": `whole` is an ordered set, only its keys are read.

PREFIX = f"invalid {ANNOTATION_DEVICE_ALLOCATED} annotation: "
CORE = "koordinator.sh/gpu-core"
RDMA = "koordinator.sh/rdma"

# (id, annotation, the whole message after the prefix)
DECODE_ERRORS = [
    ("top-array", "[]", "expected an object, got array"),
    ("top-string", '"x"', "expected an object, got string"),
    ("bare-nan", '{"gpu":[{"minor":NaN}]}', "invalid JSON: invalid JSON value NaN"),
    ("vfs-number", '{"gpu":[{"extension":{"vfs":5}}]}',
     "gpu[0].extension.vfs: expected an array, got number"),
    ("vf-string", '{"gpu":[{"extension":{"vfs":[{},"x"]}}]}',
     "gpu[0].extension.vfs[1]: expected an object, got string"),
    ("vf-bus-id-number", '{"rdma":[{"extension":{"vfs":[{"busID":1}]}}]}',
     "rdma[0].extension.vfs[0].busID: expected a string, got number"),
    ("template-bool", '{"gpu":[{},{"extension":{"gpuSharedResourceTemplate":true}}]}',
     "gpu[1].extension.gpuSharedResourceTemplate: expected a string, got boolean"),
    ("minor-int32", '{"gpu":[{"minor":2147483648}]}',
     "gpu[0].minor: integer 2147483648 out of int32 range"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "reason"), [d[1:] for d in DECODE_ERRORS], ids=[d[0] for d in DECODE_ERRORS]
)
def test_decode_error_is_one_exact_line(text: str, reason: str) -> None:
    with pytest.raises(ValueError) as info:
        decode_allocations(text)
    assert str(info.value) == PREFIX + reason
    # read_allocations reports the same reason, the annotation's name taken off once
    assert read_allocations(text) == AllocationReading(unreadable=True, problems=(reason,))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (b"{}", "expected JSON text, got bytes"),
        ("{", "invalid JSON: Expecting property name enclosed in double quotes: line 1 column 2 "
              "(char 1)"),
        ("[" * 100000 + "]" * 100000, "invalid JSON: nested too deeply"),
    ],
    ids=["not-text", "truncated", "too-deep"],
)  # fmt: skip
def test_go_json_loads_errors_name_the_document_itself(text: str, reason: str) -> None:
    with pytest.raises(GoJSONError) as info:
        go_json_loads(text)  # type: ignore[arg-type]  # bytes on purpose
    # path "" is the document: the message is the bare reason, no ": " in front
    assert (info.value.path, info.value.reason, str(info.value)) == ("", reason, reason)


def test_go_json_error_carries_path_and_reason() -> None:
    err = GoJSONError("gpu[0].minor", "expected an integer, got string")
    assert (err.path, err.reason) == ("gpu[0].minor", "expected an integer, got string")
    assert str(err) == "gpu[0].minor: expected an integer, got string"


def test_go_json_dumps_names_what_it_cannot_encode() -> None:
    with pytest.raises(TypeError) as info:
        go_json_dumps({"a": [1.5]})
    assert str(info.value) == "cannot encode float as Go JSON"


def test_lone_low_surrogate_encodes_as_replacement() -> None:
    # the last code point of the surrogate block is as unrepresentable as the first
    assert go_json_dumps("a\udfffb") == '"a\\ufffdb"'


def test_null_vf_decodes_as_go_zero_value() -> None:
    # Go decodes null into a struct as the zero struct; it is no error
    decoded = decode_allocations('{"rdma":[{"minor":1,"extension":{"vfs":[null,{"minor":2}]}}]}')
    assert decoded["rdma"][0].extension == AllocationExtension(
        vfs=(AllocatedVF(), AllocatedVF(minor=2))
    )


# -- int32 minors: the reference encoder, the hot-path encoder and the decoder agree ---------

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


@pytest.mark.parametrize("minor", [INT32_MIN - 1, INT32_MAX + 1, -(2**32), 2**32, 3**31])
def test_both_encoders_reject_a_minor_outside_int32(minor: int) -> None:
    with pytest.raises(ValueError) as ref:
        encode_allocations({"gpu": [DeviceAllocation(minor, {})]})
    with pytest.raises(ValueError) as fast:
        encode_int_allocations({"gpu": [(minor, (), "")]})
    assert str(ref.value) == str(fast.value) == f"minor {minor} out of int32 range"


@pytest.mark.parametrize("minor", [INT32_MIN, -(2**31) + 1, -62, -1, 0, INT32_MAX])
def test_both_encoders_accept_every_int32_minor(minor: int) -> None:
    # a negative minor is no device, but it is an int32: Go marshals it, and so do we
    expect = f'{{"gpu":[{{"minor":{minor},"resources":{{}}}}]}}'
    assert encode_allocations({"gpu": [DeviceAllocation(minor, {})]}) == expect
    assert encode_int_allocations({"gpu": [(minor, (), "")]}) == expect


@given(st.integers(INT32_MIN - 2**33, INT32_MAX + 2**33))
def test_the_encoders_agree_on_which_minors_are_int32(minor: int) -> None:
    def outcome(encode: object) -> str:
        try:
            return encode()  # type: ignore[operator, no-any-return]
        except ValueError as err:
            return f"error: {err}"

    ref = outcome(lambda: encode_allocations({"gpu": [DeviceAllocation(minor, {})]}))
    fast = outcome(lambda: encode_int_allocations({"gpu": [(minor, (), "")]}))
    assert ref == fast
    assert ref.startswith("error") == (not INT32_MIN <= minor <= INT32_MAX)


@pytest.mark.parametrize(
    ("literal", "bits", "expect"),
    [
        (str(2**63 - 1), 64, 2**63 - 1),
        (str(-(2**63)), 64, -(2**63)),
        (str(2**63), 64, None),
        (str(-(2**63) - 1), 64, None),
        ("-129", 8, None),
        ("-128", 8, -128),
        (str(-(2**31) - 1), 32, None),
    ],
)
def test_read_int_bounds_are_signed_bits(literal: str, bits: int, expect: int | None) -> None:
    if expect is not None:
        assert read_int(JSONNumber(literal), "x", bits) == expect
        if bits == 64:  # 64 is the default width
            assert read_int(JSONNumber(literal), "x") == expect
        return
    with pytest.raises(GoJSONError) as info:
        read_int(JSONNumber(literal), "x", bits)
    assert str(info.value) == f"x: integer {literal} out of int{bits} range"
    if bits == 64:
        with pytest.raises(GoJSONError):
            read_int(JSONNumber(literal), "x")


def test_from_ints_defaults_and_extension() -> None:
    plain = DeviceAllocation.from_ints(3, {CORE: 50, "koordinator.sh/gpu-memory": 1024})
    assert (plain.id, plain.extension) == ("", None)
    assert plain.resources == {
        CORE: Quantity.of(50, DECIMAL_SI),
        "koordinator.sh/gpu-memory": Quantity.of(1024, BINARY_SI),
    }
    ext = AllocationExtension(vfs=(AllocatedVF(4, "0000:09:00.4"),))
    with_vf = DeviceAllocation.from_ints(1, {RDMA: 1}, "nic-1", ext)
    assert (with_vf.id, with_vf.extension) == ("nic-1", ext)
    assert decode_allocations(encode_allocations({"rdma": [with_vf]})) == {"rdma": [with_vf]}


# -- read_allocations: exact problems and the VFs each valid entry holds ----------------------


def _rdma(minor: int, amount: str, *vfs: tuple[int, str]) -> str:
    named = ",".join(f'{{"minor":{m},"busID":"{b}"}}' for m, b in vfs)
    ext = f',"extension":{{"vfs":[{named}]}}' if vfs else ""
    return f'{{"minor":{minor},"resources":{{"{RDMA}":"{amount}"}}{ext}}}'


# (id, annotation, amounts, whole, problems, vfs)
READINGS = [
    ("vfs-of-valid-entries",
     f'{{"rdma":[{_rdma(0, "1", (3, "0000:09:00.3"), (5, "0000:09:00.5"))},'
     f'{_rdma(1, "1")}]}}',
     (("rdma", 0, ((RDMA, 1),)), ("rdma", 1, ((RDMA, 1),))), (), (),
     (("rdma", 0, ((3, "0000:09:00.3"), (5, "0000:09:00.5"))),)),
    ("a-later-duplicate-takes-the-first-entrys-vfs-too",
     f'{{"rdma":[{_rdma(0, "1", (3, "0000:09:00.3"))},{_rdma(0, "1", (4, "0000:09:00.4"))}]}}',
     (), (("rdma", 0),), ("rdma[1].minor: device 0 named twice",), ()),
    ("invalid-entry-names-no-vfs",
     f'{{"rdma":[{_rdma(0, "-1", (3, "0000:09:00.3"))},{_rdma(2, "1", (7, "b"))}]}}',
     (("rdma", 2, ((RDMA, 1),)),), (("rdma", 0),),
     ('rdma[0].resources["koordinator.sh/rdma"]: negative amount -1',),
     (("rdma", 2, ((7, "b"),)),)),
    ("problems-name-entry-and-resource",
     f'{{"gpu":[{{"minor":0,"resources":{{"{CORE}":"50"}}}},'
     f'{{"minor":1,"resources":{{"{CORE}":"101","x\\"y":"-2"}}}}]}}',
     (("gpu", 0, ((CORE, 50),)),), (("gpu", 1),),
     ('gpu[1].resources["koordinator.sh/gpu-core"]: 101 is more than one device has',
      'gpu[1].resources["x\\"y"]: negative amount -2'), ()),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "amounts", "whole", "problems", "vfs"),
    [r[1:] for r in READINGS],
    ids=[r[0] for r in READINGS],
)
def test_read_allocations_exactly(
    text: str,
    amounts: tuple[object, ...],
    whole: tuple[object, ...],
    problems: tuple[str, ...],
    vfs: tuple[object, ...],
) -> None:
    assert read_allocations(text) == AllocationReading(amounts, whole, False, problems, vfs)


_vf = st.tuples(st.integers(0, 2**31 - 1), st.text("0123456789abcdef:.", max_size=12))


@given(st.lists(st.tuples(st.integers(0, 3), st.booleans(), st.lists(_vf, max_size=3)),
                max_size=5))  # fmt: skip
def test_a_reading_holds_the_vfs_of_exactly_its_valid_entries(
    entries: list[tuple[int, bool, list[tuple[int, str]]]],
) -> None:
    allocs = [
        DeviceAllocation.from_ints(
            minor,
            {RDMA: 1 if valid else 0},
            extension=AllocationExtension(vfs=tuple(AllocatedVF(m, b) for m, b in named)),
        )
        for minor, valid, named in entries
    ]
    reading = read_allocations(encode_allocations({"rdma": allocs}))
    minors = [minor for minor, _, _ in entries]
    expect = tuple(
        ("rdma", minor, tuple(named))
        for minor, valid, named in entries
        if valid and named and minors.count(minor) == 1
    )
    assert reading.vfs == expect
    assert {m for _, m, _ in reading.vfs} <= {m for _, m, _ in reading.amounts}
