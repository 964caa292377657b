"""The pure codec of Gemini's token-scheduler wire protocol (SPEC section 11).

Role: bytes <-> typed messages for the hook library's requests (80 bytes) and the
scheduler's responses (40 bytes). No I/O; the server (``koordlet.fairshare.server``) reads
exact-size frames and hands them here.

Layout (host byte order, little-endian on x86-64; fields packed with no padding):

- request, 80 bytes: ``size_t name_len`` (8) . name . ``\\0`` . ``int32 req_id`` .
  ``int32 type`` . payload, zero-filled to 80. Types: ``0 REQ_QUOTA`` (``double overuse_ms``,
  ``double burst_ms``), ``1 REQ_MEM_LIMIT`` (none), ``2 REQ_MEM_UPDATE`` (``size_t bytes``,
  ``int32 is_allocate``).
- response, 40 bytes: ``int32 req_id`` . payload, zero-filled: ``REQ_QUOTA`` ->
  ``double quota_ms``; ``REQ_MEM_LIMIT`` -> ``size_t used``, ``size_t limit``;
  ``REQ_MEM_UPDATE`` -> ``int32 verdict`` (non-zero = allowed).

Invariants:

- ``encode_*`` always returns exactly ``REQUEST_SIZE`` / ``RESPONSE_SIZE`` bytes and raises
  ``ProtocolError`` for a message that does not fit (a name too long for its payload).
- ``decode_request`` raises ``ProtocolError`` (never another exception) for a frame of the
  wrong size, a name length that runs past the frame, a missing terminator, a name that is not
  UTF-8, an unknown type, a non-finite or negative time. Bytes after the payload are ignored:
  a later Gemini hook appends a ``double window_ms`` to ``REQ_QUOTA`` there.
- Responses carry no type: ``decode_response`` needs the type of the request it answers.
"""

from __future__ import annotations

import math
import struct
import sys
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

__all__ = [
    "BYTE_ORDER",
    "REQUEST_SIZE",
    "RESPONSE_SIZE",
    "MemLimitRequest",
    "MemLimitResponse",
    "MemUpdateRequest",
    "MemUpdateResponse",
    "ProtocolError",
    "QuotaRequest",
    "QuotaResponse",
    "Request",
    "RequestType",
    "Response",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "max_name_length",
]

REQUEST_SIZE: Final = 80
RESPONSE_SIZE: Final = 40
BYTE_ORDER: Final = "<" if sys.byteorder == "little" else ">"
"""Host byte order, as the C structs are sent (x86-64 and arm64 hosts: little-endian)."""

_SIZE_T: Final = struct.Struct(BYTE_ORDER + "Q")
_HEADER_TAIL: Final = struct.Struct(BYTE_ORDER + "ii")  # req_id, type
_QUOTA_REQ: Final = struct.Struct(BYTE_ORDER + "dd")
_MEM_UPDATE_REQ: Final = struct.Struct(BYTE_ORDER + "Qi")
_RSP_ID: Final = struct.Struct(BYTE_ORDER + "i")
_QUOTA_RSP: Final = struct.Struct(BYTE_ORDER + "d")
_MEM_LIMIT_RSP: Final = struct.Struct(BYTE_ORDER + "QQ")
_MEM_UPDATE_RSP: Final = struct.Struct(BYTE_ORDER + "i")


class ProtocolError(ValueError):
    """A frame that is not a valid message of SPEC section 11 (or one that cannot be sent)."""


class RequestType(IntEnum):
    """The ``int32 type`` of a request."""

    REQ_QUOTA = 0
    REQ_MEM_LIMIT = 1
    REQ_MEM_UPDATE = 2


_PAYLOAD_SIZE: Final = {
    RequestType.REQ_QUOTA: _QUOTA_REQ.size,
    RequestType.REQ_MEM_LIMIT: 0,
    RequestType.REQ_MEM_UPDATE: _MEM_UPDATE_REQ.size,
}


@dataclass(frozen=True, slots=True)
class QuotaRequest:
    """Ask for a time quota; ``overuse_ms`` of the last quota is charged to its grant."""

    name: str
    req_id: int
    overuse_ms: float = 0.0
    burst_ms: float = 0.0
    type: RequestType = RequestType.REQ_QUOTA


@dataclass(frozen=True, slots=True)
class MemLimitRequest:
    """Ask for the memory used by the client's pod and its limit."""

    name: str
    req_id: int
    type: RequestType = RequestType.REQ_MEM_LIMIT


@dataclass(frozen=True, slots=True)
class MemUpdateRequest:
    """Report an allocation (``is_allocate``) or a free of ``nbytes`` of GPU memory."""

    name: str
    req_id: int
    nbytes: int
    is_allocate: bool
    type: RequestType = RequestType.REQ_MEM_UPDATE


Request = QuotaRequest | MemLimitRequest | MemUpdateRequest


@dataclass(frozen=True, slots=True)
class QuotaResponse:
    req_id: int
    quota_ms: float


@dataclass(frozen=True, slots=True)
class MemLimitResponse:
    req_id: int
    used: int
    limit: int


@dataclass(frozen=True, slots=True)
class MemUpdateResponse:
    req_id: int
    allowed: bool


Response = QuotaResponse | MemLimitResponse | MemUpdateResponse


def max_name_length(kind: RequestType) -> int:
    """The longest client name (in UTF-8 bytes) a request of ``kind`` can carry."""
    return REQUEST_SIZE - _SIZE_T.size - 1 - _HEADER_TAIL.size - _PAYLOAD_SIZE[kind]


def _check_int32(value: int, what: str) -> None:
    if not -(2**31) <= value < 2**31:
        raise ProtocolError(f"{what} {value} does not fit an int32")


def _check_size_t(value: int, what: str) -> None:
    if not 0 <= value < 2**64:
        raise ProtocolError(f"{what} {value} does not fit a size_t")


def encode_request(req: Request) -> bytes:
    """The 80-byte frame of ``req``."""
    name = req.name.encode("utf-8")
    if len(name) > max_name_length(req.type):
        raise ProtocolError(
            f"client name of {len(name)} bytes is too long for a {req.type.name} request "
            f"(at most {max_name_length(req.type)})"
        )
    _check_int32(req.req_id, "req_id")
    buf = bytearray(REQUEST_SIZE)
    pos = 0
    _SIZE_T.pack_into(buf, pos, len(name))
    pos += _SIZE_T.size
    buf[pos : pos + len(name)] = name
    pos += len(name) + 1  # the terminator is already zero
    _HEADER_TAIL.pack_into(buf, pos, req.req_id, int(req.type))
    pos += _HEADER_TAIL.size
    if isinstance(req, QuotaRequest):
        _QUOTA_REQ.pack_into(buf, pos, req.overuse_ms, req.burst_ms)
    elif isinstance(req, MemUpdateRequest):
        _check_size_t(req.nbytes, "bytes")
        _MEM_UPDATE_REQ.pack_into(buf, pos, req.nbytes, 1 if req.is_allocate else 0)
    return bytes(buf)


def _time(value: float, what: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise ProtocolError(f"{what} must be a finite, non-negative number of ms, got {value}")
    return value


def decode_request(frame: bytes) -> Request:
    """The request in an 80-byte frame; ``ProtocolError`` for anything else."""
    if len(frame) != REQUEST_SIZE:
        raise ProtocolError(f"request frame of {len(frame)} bytes, expected {REQUEST_SIZE}")
    (name_len,) = _SIZE_T.unpack_from(frame, 0)
    start = _SIZE_T.size
    end = start + name_len
    if name_len > REQUEST_SIZE - start - 1 - _HEADER_TAIL.size:
        raise ProtocolError(f"name length {name_len} runs past the {REQUEST_SIZE}-byte frame")
    if frame[end] != 0:
        raise ProtocolError("client name is not terminated by a NUL byte")
    try:
        name = frame[start:end].decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("client name is not UTF-8") from None
    if "\0" in name:
        raise ProtocolError("client name contains a NUL byte")
    pos = end + 1
    req_id, raw_type = _HEADER_TAIL.unpack_from(frame, pos)
    pos += _HEADER_TAIL.size
    try:
        kind = RequestType(raw_type)
    except ValueError:
        raise ProtocolError(f"unknown request type {raw_type}") from None
    if pos + _PAYLOAD_SIZE[kind] > REQUEST_SIZE:
        raise ProtocolError(f"{kind.name} payload runs past the frame (name of {name_len} bytes)")
    if kind is RequestType.REQ_QUOTA:
        overuse, burst = _QUOTA_REQ.unpack_from(frame, pos)
        return QuotaRequest(name, req_id, _time(overuse, "overuse"), _time(burst, "burst"))
    if kind is RequestType.REQ_MEM_UPDATE:
        nbytes, is_allocate = _MEM_UPDATE_REQ.unpack_from(frame, pos)
        return MemUpdateRequest(name, req_id, nbytes, is_allocate != 0)
    return MemLimitRequest(name, req_id)


def encode_response(rsp: Response) -> bytes:
    """The 40-byte frame of ``rsp``."""
    _check_int32(rsp.req_id, "req_id")
    buf = bytearray(RESPONSE_SIZE)
    _RSP_ID.pack_into(buf, 0, rsp.req_id)
    pos = _RSP_ID.size
    if isinstance(rsp, QuotaResponse):
        _QUOTA_RSP.pack_into(buf, pos, rsp.quota_ms)
    elif isinstance(rsp, MemLimitResponse):
        _check_size_t(rsp.used, "used")
        _check_size_t(rsp.limit, "limit")
        _MEM_LIMIT_RSP.pack_into(buf, pos, rsp.used, rsp.limit)
    else:
        _MEM_UPDATE_RSP.pack_into(buf, pos, 1 if rsp.allowed else 0)
    return bytes(buf)


def decode_response(frame: bytes, kind: RequestType) -> Response:
    """The response in a 40-byte frame, read as the answer to a ``kind`` request."""
    if len(frame) != RESPONSE_SIZE:
        raise ProtocolError(f"response frame of {len(frame)} bytes, expected {RESPONSE_SIZE}")
    (req_id,) = _RSP_ID.unpack_from(frame, 0)
    pos = _RSP_ID.size
    if kind is RequestType.REQ_QUOTA:
        (quota,) = _QUOTA_RSP.unpack_from(frame, pos)
        return QuotaResponse(req_id, quota)
    if kind is RequestType.REQ_MEM_LIMIT:
        used, limit = _MEM_LIMIT_RSP.unpack_from(frame, pos)
        return MemLimitResponse(req_id, used, limit)
    (verdict,) = _MEM_UPDATE_RSP.unpack_from(frame, pos)
    return MemUpdateResponse(req_id, verdict != 0)
