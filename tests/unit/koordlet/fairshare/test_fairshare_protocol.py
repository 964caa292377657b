"""Golden bytes of SPEC section 11's messages, built by hand from the layout, and bad frames."""

from __future__ import annotations

import struct
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koordlet.fairshare.protocol import (
    REQUEST_SIZE,
    RESPONSE_SIZE,
    MemLimitRequest,
    MemLimitResponse,
    MemUpdateRequest,
    MemUpdateResponse,
    ProtocolError,
    QuotaRequest,
    QuotaResponse,
    Request,
    RequestType,
    Response,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    max_name_length,
)

pytestmark = pytest.mark.skipif(sys.byteorder != "little", reason="golden bytes are x86-64's")


def _pad(b: bytes, size: int) -> bytes:
    return b + bytes(size - len(b))


# Built from the SPEC text with literal little-endian bytes, not with the codec's structs.
GOLDEN_REQUESTS = [
    pytest.param(
        QuotaRequest("pod-a", 7, overuse_ms=1.5, burst_ms=20.0),
        _pad(
            bytes.fromhex("0500000000000000")  # size_t name_len = 5
            + b"pod-a\x00"
            + bytes.fromhex("07000000")  # int32 req_id = 7
            + bytes.fromhex("00000000")  # int32 type = REQ_QUOTA
            + bytes.fromhex("000000000000f83f")  # double 1.5
            + bytes.fromhex("0000000000003440"),  # double 20.0
            80,
        ),
        id="quota",
    ),
    pytest.param(
        MemLimitRequest("p", -2),
        _pad(bytes.fromhex("0100000000000000") + b"p\x00" + bytes.fromhex("feffffff01000000"), 80),
        id="mem-limit-negative-id",
    ),
    pytest.param(
        MemUpdateRequest("ab", 3, nbytes=2**33, is_allocate=True),
        _pad(
            bytes.fromhex("0200000000000000")
            + b"ab\x00"
            + bytes.fromhex("0300000002000000")
            + bytes.fromhex("0000000002000000")  # size_t 2**33
            + bytes.fromhex("01000000"),  # int32 is_allocate = 1
            80,
        ),
        id="mem-update-allocate",
    ),
    pytest.param(
        MemUpdateRequest("", 0, nbytes=4096, is_allocate=False),
        _pad(
            bytes(8)
            + b"\x00"
            + bytes.fromhex("0000000002000000")
            + bytes.fromhex("0010000000000000"),
            80,
        ),
        id="mem-update-free-empty-name",
    ),
]

GOLDEN_RESPONSES = [
    pytest.param(
        QuotaResponse(7, 250.0),
        RequestType.REQ_QUOTA,
        _pad(bytes.fromhex("07000000") + bytes.fromhex("0000000000406f40"), 40),
        id="quota-250ms",
    ),
    pytest.param(
        MemLimitResponse(1, used=0, limit=8 * 2**30),
        RequestType.REQ_MEM_LIMIT,
        _pad(bytes.fromhex("01000000") + bytes(8) + bytes.fromhex("0000000002000000"), 40),
        id="mem-limit-8Gi",
    ),
    pytest.param(
        MemUpdateResponse(9, allowed=False),
        RequestType.REQ_MEM_UPDATE,
        _pad(bytes.fromhex("09000000") + bytes(4), 40),
        id="mem-update-refused",
    ),
    pytest.param(
        MemUpdateResponse(9, allowed=True),
        RequestType.REQ_MEM_UPDATE,
        _pad(bytes.fromhex("09000000") + bytes.fromhex("01000000"), 40),
        id="mem-update-allowed",
    ),
]


@pytest.mark.parametrize(("message", "frame"), GOLDEN_REQUESTS)
def test_request_golden_bytes(message: Request, frame: bytes) -> None:
    assert len(frame) == REQUEST_SIZE
    assert encode_request(message) == frame
    assert decode_request(frame) == message


@pytest.mark.parametrize(("message", "kind", "frame"), GOLDEN_RESPONSES)
def test_response_golden_bytes(message: Response, kind: RequestType, frame: bytes) -> None:
    assert len(frame) == RESPONSE_SIZE
    assert encode_response(message) == frame
    assert decode_response(frame, kind) == message


def test_quota_request_with_trailing_window_of_a_later_hook_decodes() -> None:
    frame = bytearray(encode_request(QuotaRequest("x", 1, 0.0, 5.0)))
    struct.pack_into("<d", frame, 8 + 2 + 8 + 16, 3000.0)  # window_ms after the payload
    assert decode_request(bytes(frame)) == QuotaRequest("x", 1, 0.0, 5.0)


def _frame(name_len: int, body: bytes) -> bytes:
    return _pad(struct.pack("<Q", name_len) + body, 80)


BAD_FRAMES = [
    pytest.param(b"", "0 bytes", id="empty"),
    pytest.param(bytes(79), "79 bytes", id="truncated"),
    pytest.param(bytes(81), "81 bytes", id="too-long"),
    pytest.param(_frame(2**63, b""), "runs past", id="huge-name-length"),
    pytest.param(_frame(70, b"a" * 70), "runs past", id="name-past-header"),
    pytest.param(_frame(2, b"abc" + bytes(8)), "not terminated", id="no-terminator"),
    pytest.param(_frame(2, b"\xff\xfe\x00" + bytes(8)), "not UTF-8", id="bad-utf8"),
    pytest.param(
        _frame(1, b"a\x00" + struct.pack("<ii", 1, 3)), "unknown request type 3", id="type-3"
    ),
    pytest.param(
        _frame(1, b"a\x00" + struct.pack("<ii", 1, -1)), "unknown request type", id="type-neg"
    ),
    pytest.param(
        _frame(1, b"a\x00" + struct.pack("<iidd", 1, 0, float("nan"), 1.0)),
        "overuse",
        id="nan-overuse",
    ),
    pytest.param(
        _frame(1, b"a\x00" + struct.pack("<iidd", 1, 0, 0.0, -5.0)), "burst", id="negative-burst"
    ),
    pytest.param(
        _frame(60, b"n" * 60 + b"\x00" + struct.pack("<ii", 1, 0)),
        "payload runs past",
        id="no-room-for-payload",
    ),
]


@pytest.mark.parametrize(("frame", "message"), BAD_FRAMES)
def test_bad_request_frames_raise_protocol_error(frame: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        decode_request(frame)


def test_bad_response_frame_raises_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="39 bytes"):
        decode_response(bytes(39), RequestType.REQ_QUOTA)


@pytest.mark.parametrize("kind", list(RequestType), ids=lambda k: k.name)
def test_name_too_long_for_the_frame_cannot_be_encoded(kind: RequestType) -> None:
    longest = "n" * max_name_length(kind)
    build = {
        RequestType.REQ_QUOTA: lambda n: QuotaRequest(n, 1),
        RequestType.REQ_MEM_LIMIT: lambda n: MemLimitRequest(n, 1),
        RequestType.REQ_MEM_UPDATE: lambda n: MemUpdateRequest(n, 1, 1, True),
    }[kind]
    assert decode_request(encode_request(build(longest))) == build(longest)
    with pytest.raises(ProtocolError, match="too long"):
        encode_request(build(longest + "n"))


def test_out_of_range_fields_cannot_be_encoded() -> None:
    with pytest.raises(ProtocolError, match="int32"):
        encode_request(MemLimitRequest("a", 2**31))
    with pytest.raises(ProtocolError, match="size_t"):
        encode_response(MemLimitResponse(1, used=-1, limit=0))


_names = st.text(st.characters(exclude_characters="\0", codec="utf-8"), max_size=10)
_ids = st.integers(-(2**31), 2**31 - 1)
_ms = st.floats(0, 1e9, allow_nan=False)
_requests = st.one_of(
    st.builds(QuotaRequest, _names, _ids, _ms, _ms),
    st.builds(MemLimitRequest, _names, _ids),
    st.builds(MemUpdateRequest, _names, _ids, st.integers(0, 2**64 - 1), st.booleans()),
)


@given(_requests)
def test_every_request_round_trips(req: Request) -> None:
    assert decode_request(encode_request(req)) == req


@given(st.binary(min_size=80, max_size=80))
def test_any_80_bytes_decode_or_raise_protocol_error(frame: bytes) -> None:
    try:
        req = decode_request(frame)
    except ProtocolError:
        return
    assert decode_request(encode_request(req)) == req
