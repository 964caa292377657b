"""A blocking client of Gemini's protocol: what the hook library sends, in Python.

Role: the benchmark's synthetic pods (``bench/b4_fairshare.py``), the tests and a person
debugging a node use it to talk to a card's scheduler or a pod's relay exactly as Gemini's
hook library does (80-byte requests, 40-byte responses, one request in flight per socket).

Invariants: one instance per socket and thread; request ids count up from 0 like the hook
library's; a response whose id does not match the request, or a connection closed mid-frame,
raises ``ProtocolError``; socket errors propagate as ``OSError``.
"""

from __future__ import annotations

import socket
from typing import Final

from koordlet.fairshare.protocol import (
    RESPONSE_SIZE,
    MemLimitRequest,
    MemLimitResponse,
    MemUpdateRequest,
    MemUpdateResponse,
    ProtocolError,
    QuotaRequest,
    QuotaResponse,
    Request,
    Response,
    decode_response,
    encode_request,
)

__all__ = ["GeminiClient"]

_DEFAULT_TIMEOUT: Final = 60.0


class GeminiClient:
    """A connection to a scheduler or relay speaking as client ``name``."""

    def __init__(self, host: str, port: int, name: str, timeout_s: float = _DEFAULT_TIMEOUT):
        self.name = name
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._next_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> GeminiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, req: Request) -> Response:
        self.sock.sendall(encode_request(req))
        buf = bytearray()
        while len(buf) < RESPONSE_SIZE:
            chunk = self.sock.recv(RESPONSE_SIZE - len(buf))
            if not chunk:
                raise ProtocolError(f"connection closed after {len(buf)} response bytes")
            buf += chunk
        rsp = decode_response(bytes(buf), req.type)
        if rsp.req_id != req.req_id:
            raise ProtocolError(f"response to request {rsp.req_id}, expected {req.req_id}")
        return rsp

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def quota(self, overuse_ms: float = 0.0, burst_ms: float = 0.0) -> float:
        """Ask for a token; blocks until granted; the quota in ms."""
        rsp = self._call(QuotaRequest(self.name, self._id(), overuse_ms, burst_ms))
        assert isinstance(rsp, QuotaResponse)
        return rsp.quota_ms

    def mem_limit(self) -> tuple[int, int]:
        """(bytes used by the pod, its limit)."""
        rsp = self._call(MemLimitRequest(self.name, self._id()))
        assert isinstance(rsp, MemLimitResponse)
        return rsp.used, rsp.limit

    def mem_update(self, nbytes: int, allocate: bool) -> bool:
        """Report an allocation or free; whether it is allowed."""
        rsp = self._call(MemUpdateRequest(self.name, self._id(), nbytes, allocate))
        assert isinstance(rsp, MemUpdateResponse)
        return rsp.allowed
