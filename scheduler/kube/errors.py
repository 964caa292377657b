"""The Kubernetes adapter's errors: every failure talking to the API server is a ``KubeError``.

Role: shared by the credentials loader, the transports and the REST client (re-exported by
``scheduler.kube.rest``, where callers import them from)."""

from __future__ import annotations

__all__ = ["ApiError", "CredentialsError", "KubeError", "TransportError"]


class KubeError(Exception):
    """Any failure talking to the API server."""


class TransportError(KubeError):
    """The request did not get an HTTP answer (connection refused/reset, timeout, TLS)."""


class ApiError(KubeError):
    """The API server answered with a non-2xx status."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if reason else f"{status}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class CredentialsError(KubeError):
    """No usable way to reach the API server (one line, for the command line)."""
