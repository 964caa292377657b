"""ADAPTER: the device plugin's candidate pods from the kubelet's ``/pods`` (``--query-kubelet``).

Role: gpushare's plugin can list the node's pods from its own kubelet instead of the API server
(its ``--query-kubelet``), which large clusters use to spare the API server one pod list per
Allocate. ``KubeletPodSource`` is a ``PodSource`` that does the same: ``GET /pods`` on the
kubelet (port 10250, HTTPS with the service-account token; or the read-only port 10255 over
plain HTTP), and the same candidate rule as the API-server path
(``koordlet.deviceplugin.gpushare.pending_pods``). Writes (the ``ASSIGNED`` mark) still go to
the API server.

Invariants:

- The API server stays the source of truth: when the kubelet cannot be used — no answer, not
  200, a body over ``max_body`` bytes (never read past it), not JSON (nested deeper than
  ``apis.jsonload.MAX_DEPTH`` included), not a PodList — or lists no
  candidate (gpushare falls back then too), the API server is listed instead, with one warning
  line saying why. An Allocate is never refused because the kubelet failed.
- The kubelet's copies lag the API server. A pod this source marked ``ASSIGNED`` is never a
  candidate from the kubelet again (the last ``_MARKED_KEPT`` UIDs are remembered), so a stale
  copy cannot hand its card to the next pod; and a conflict on the mark (a stale
  resourceVersion) makes the next list, the plugin's retry, the API server's.
- The token is read from its file at every request (projected tokens are rotated on disk).
- Like gpushare's, the kubelet's serving certificate is not verified unless a CA file is given
  (kubelets mostly serve self-signed certificates); the address should be this node's kubelet.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

import structlog

from apis.core import drop_managed_fields
from apis.jsonload import loads
from koordlet.deviceplugin.gpushare import PendingPod, PodConflict, pending_pods

__all__ = [
    "DEFAULT_KUBELET_PORT",
    "DEFAULT_TOKEN_FILE",
    "KubeletPodSource",
    "KubeletPodsConfig",
    "KubeletPodsError",
]

DEFAULT_KUBELET_PORT: Final = 10250
DEFAULT_TOKEN_FILE: Final = "/var/run/secrets/kubernetes.io/serviceaccount/token"
_MARKED_KEPT: Final = 4096
_CHUNK: Final = 1 << 16
DEFAULT_MAX_BODY: Final = 64 << 20
"""A PodList of 110 pods is a few MiB at most; anything far past that is not a kubelet."""

log = structlog.get_logger("koordlet.deviceplugin")


class KubeletPodsError(Exception):
    """The kubelet's ``/pods`` could not be used (one line)."""


class PodSource(Protocol):
    def pending_gpushare_pods(self, node_name: str) -> list[PendingPod]: ...

    def mark_assigned(self, pod: PendingPod, annotations: dict[str, str]) -> None: ...


@dataclass(frozen=True, slots=True)
class KubeletPodsConfig:
    address: str = "127.0.0.1"
    port: int = DEFAULT_KUBELET_PORT
    scheme: str = "https"
    """``https`` (the authenticated port) or ``http`` (the read-only port, no token)."""
    token_file: str = DEFAULT_TOKEN_FILE
    ca_file: str = ""
    """Verify the kubelet's certificate against this CA; empty: no verification (gpushare's)."""
    timeout_s: float = 10.0
    max_body: int = DEFAULT_MAX_BODY

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}:{self.port}/pods"


class KubeletPodSource:
    """``PodSource`` over the kubelet's ``/pods``, falling back to ``api``; see the module."""

    def __init__(self, config: KubeletPodsConfig, api: PodSource) -> None:
        if config.scheme not in ("https", "http"):
            raise ValueError(f"kubelet scheme must be https or http, not {config.scheme!r}")
        self.config = config
        self._api = api
        self._lock = threading.Lock()
        self._stale = False
        self._marked: OrderedDict[str, None] = OrderedDict()

    def pending_gpushare_pods(self, node_name: str) -> list[PendingPod]:
        with self._lock:
            stale, self._stale = self._stale, False
        if stale:
            return self._api.pending_gpushare_pods(node_name)
        try:
            items = self.kubelet_pods()
        except KubeletPodsError as exc:
            log.warning("kubelet /pods unusable: listing the API server", error=str(exc))
            return self._api.pending_gpushare_pods(node_name)
        with self._lock:
            pending = [p for p in pending_pods(items, node_name) if p.uid not in self._marked]
        if not pending:
            log.warning("kubelet /pods lists no pending gpushare pod: listing the API server")
            return self._api.pending_gpushare_pods(node_name)
        return pending

    def mark_assigned(self, pod: PendingPod, annotations: dict[str, str]) -> None:
        try:
            self._api.mark_assigned(pod, annotations)
        except PodConflict:
            with self._lock:
                self._stale = True
            raise
        with self._lock:
            self._marked[pod.uid] = None
            while len(self._marked) > _MARKED_KEPT:
                self._marked.popitem(last=False)

    # -- the kubelet ------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        c = self.config
        if c.scheme == "http":
            return http.client.HTTPConnection(c.address, c.port, timeout=c.timeout_s)
        context = ssl.create_default_context(cafile=c.ca_file or None)
        if not c.ca_file:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return http.client.HTTPSConnection(c.address, c.port, timeout=c.timeout_s, context=context)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.config.scheme == "https":
            try:
                token = Path(self.config.token_file).read_text().strip()
            except OSError as exc:
                raise KubeletPodsError(f"cannot read the token {self.config.token_file}: "
                                       f"{exc.strerror or exc}") from None  # fmt: skip
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _body(self, resp: http.client.HTTPResponse) -> bytes:
        """The answer's body, bounded in size and in time: one system call per chunk (each
        within the socket's timeout) and the deadline checked between them, so a kubelet that
        trickles bytes holds the Allocate for at most about twice the timeout."""
        url, limit = self.config.url, self.config.max_body
        deadline = time.monotonic() + self.config.timeout_s
        chunks: list[bytes] = []
        size = 0
        while chunk := resp.read1(_CHUNK):
            size += len(chunk)
            if size > limit:
                raise KubeletPodsError(f"{url}: answer over {limit} bytes")
            if time.monotonic() > deadline:
                raise KubeletPodsError(f"{url}: no complete answer in {self.config.timeout_s:g} s")
            chunks.append(chunk)
        return b"".join(chunks)

    def kubelet_pods(self) -> list[object]:
        """The ``items`` of the kubelet's ``/pods``; raises ``KubeletPodsError``."""
        url, limit = self.config.url, self.config.max_body
        conn = self._connection()
        try:
            conn.request("GET", "/pods", headers=self._headers())
            resp = conn.getresponse()
            if resp.status != 200:
                raise KubeletPodsError(f"{url}: HTTP {resp.status} {resp.reason}")
            declared = resp.getheader("Content-Length")
            if declared and declared.isdigit() and int(declared) > limit:
                raise KubeletPodsError(f"{url}: answer of {declared} bytes, over {limit}")
            body = self._body(resp)
        except (OSError, http.client.HTTPException) as exc:
            raise KubeletPodsError(f"{url}: {exc}") from None
        finally:
            conn.close()
        try:  # any depth a Go server serves: a tenant nests managedFields 1,500 levels
            doc = drop_managed_fields(loads(body))
        except ValueError as exc:
            raise KubeletPodsError(f"{url}: not JSON: {exc}") from None
        if (
            not isinstance(doc, dict)
            or doc.get("kind", "PodList") != "PodList"
            or not isinstance(doc.get("items"), list | None)
        ):
            raise KubeletPodsError(f"{url}: not a PodList")
        return list(doc.get("items") or [])
