"""HTTP access to the Kubernetes API: credentials, one connection pool, raw JSON in and out.

Role: the bottom of the Kubernetes adapter. ``load_credentials`` turns ``--kubeconfig`` /
``--master`` / the in-cluster service account into ``Credentials`` (with the ``kubernetes``
package's own loaders: the only use of that package in the scheduler); ``Urllib3Transport``
speaks HTTPS through one pooled ``urllib3.PoolManager``; ``RestClient`` adds authentication,
JSON, the client-side QPS limit and the error mapping, and opens watch streams.

Invariants:

- Every response is read to its end and its connection released, on errors too, so the pool
  never stalls (KUBE_APISERVER.md: an unreleased response cuts binds from ~600/s to ~30/s).
- Bodies are plain JSON mappings; the client's generated models are never used.
- A non-2xx answer raises ``ApiError`` (HTTP status, the Status ``reason`` and ``message``);
  a connection-level failure (refused, reset, timeout, TLS) raises ``TransportError``. Both
  are ``KubeError``. urllib3's own retries are off: callers decide what to retry.
- Requests (not watch streams) take a token from the client's ``TokenBucket`` first. A
  request's timeout counts from its start, connecting included: no answer is waited for
  longer (the API server may still apply a write it received; see scheduler/kube/leader.py).
- The transport is injectable: tests use a fake at this HTTP boundary (``Transport``).
"""

from __future__ import annotations

import json
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, urlencode

import urllib3

from scheduler.kube.ratelimit import TokenBucket

__all__ = [
    "ApiError",
    "Credentials",
    "CredentialsError",
    "KubeError",
    "RawResponse",
    "RestClient",
    "Stream",
    "Transport",
    "TransportError",
    "Urllib3Transport",
    "WatchStream",
    "load_credentials",
    "path_segment",
]

USER_AGENT = "koord-scheduler/0.1.0"
TOKEN_CACHE_S = 1.0
"""Seconds a bearer token from the kubeconfig/in-cluster loader is reused before asking the
loader again (its refresh hook runs then)."""
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


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


def path_segment(name: str) -> str:
    """A name escaped for use as one URL path segment."""
    return quote(name, safe="")


# ---------------------------------------------------------------------------------------------
# Credentials


@dataclass(frozen=True, slots=True)
class Credentials:
    """Where the API server is and how to authenticate; ``token`` is called per request (the
    in-cluster loader refreshes the projected service-account token behind it)."""

    host: str
    verify_ssl: bool = True
    ca_file: str | None = None
    ca_data: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    tls_server_name: str | None = None
    token: Callable[[], str | None] = lambda: None


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )


_PLAIN_USER_KEYS = frozenset({"token", "client-certificate", "client-key"})
_PLAIN_CLUSTER_KEYS = frozenset(
    {
        "server",
        "certificate-authority",
        "certificate-authority-data",
        "insecure-skip-tls-verify",
        "tls-server-name",
        "extensions",
    }
)


def _named(items: Any, name: str, field: str) -> Mapping[str, Any] | None:
    if not isinstance(items, list):
        return None
    for item in items:
        if isinstance(item, Mapping) and item.get("name") == name:
            value = item.get(field)
            return value if isinstance(value, Mapping) else None
    return None


def _plain_kubeconfig(path: str, master: str | None, context: str | None) -> Credentials | None:
    """A kubeconfig that needs none of the ``kubernetes`` package's machinery, read directly:
    one context whose cluster has a server (a CA file or base64 data, or skip-verify, a TLS
    server name) and whose user has a static bearer token and/or client certificate and key
    *files*. ``None`` for anything else (exec and auth-provider plugins, token files, basic
    auth, embedded client certificates, proxies, unreadable or malformed files): the caller
    falls back to the package's loader, which also words the errors.

    Importing ``kubernetes`` (its client and config loaders) was ~0.7 s of the scheduler's
    start-up CPU on the B2 machine, and its token refresh hook ran on every request."""
    import base64

    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
        if not isinstance(doc, Mapping):
            return None
        ctx_name = context or doc.get("current-context")
        if not isinstance(ctx_name, str) or not ctx_name:
            return None
        ctx = _named(doc.get("contexts"), ctx_name, "context")
        if ctx is None:
            return None
        cluster = _named(doc.get("clusters"), str(ctx.get("cluster", "")), "cluster")
        user = _named(doc.get("users"), str(ctx.get("user", "")), "user")
        if cluster is None or user is None:
            return None
        if not set(cluster) <= _PLAIN_CLUSTER_KEYS or not set(user) <= _PLAIN_USER_KEYS:
            return None
        server = cluster.get("server")
        if not isinstance(server, str) or not server:
            return None
        base = os.path.dirname(os.path.abspath(path))

        def file_of(value: Any) -> str | None:
            if value is None:
                return None
            if not isinstance(value, str) or not value:
                raise ValueError(value)
            return value if os.path.isabs(value) else os.path.join(base, value)

        skip = cluster.get("insecure-skip-tls-verify", False)
        if not isinstance(skip, bool):
            return None
        ca_file = file_of(cluster.get("certificate-authority"))
        ca_data: str | None = None
        if cluster.get("certificate-authority-data") is not None:
            ca_data = base64.standard_b64decode(cluster["certificate-authority-data"]).decode()
        cert_file = file_of(user.get("client-certificate"))
        key_file = file_of(user.get("client-key"))
        if (cert_file is None) != (key_file is None):
            return None
        for f_ in (ca_file, cert_file, key_file):
            if f_ is not None and not os.path.isfile(f_):
                return None
        token = user.get("token")
        if token is not None and (not isinstance(token, str) or not token):
            return None
        tls_name = cluster.get("tls-server-name")
        if tls_name is not None and not isinstance(tls_name, str):
            return None
    except (OSError, ValueError, TypeError, yaml.YAMLError):
        return None
    header = f"Bearer {token}" if token else None
    return Credentials(
        host=(master or server).rstrip("/"),
        verify_ssl=not skip,
        ca_file=ca_file,
        ca_data=ca_data,
        cert_file=cert_file,
        key_file=key_file,
        tls_server_name=tls_name,
        token=lambda: header,
    )


def load_credentials(
    kubeconfig: str | None = None, master: str | None = None, context: str | None = None
) -> Credentials:
    """kube-scheduler's rules: ``kubeconfig`` if given, else in-cluster when running in a pod,
    else ``$KUBECONFIG`` or ``~/.kube/config``, else ``master`` alone (no authentication).
    ``master`` overrides the server address in every case. A plain kubeconfig (a static
    token or client certificate files) is read directly (``_plain_kubeconfig``); anything
    else goes through the ``kubernetes`` package's loaders (``kubernetes_credentials``)."""
    default_file = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    plain: Credentials | None = None
    if kubeconfig:
        plain = _plain_kubeconfig(kubeconfig, master, context)
    elif not _in_cluster() and os.path.exists(default_file.split(os.pathsep)[0]):
        plain = _plain_kubeconfig(default_file.split(os.pathsep)[0], master, context)
    if plain is not None:
        return plain
    return kubernetes_credentials(kubeconfig, master, context)


def kubernetes_credentials(
    kubeconfig: str | None = None, master: str | None = None, context: str | None = None
) -> Credentials:
    """``load_credentials`` through the ``kubernetes`` package's loaders only (every kind of
    kubeconfig, in-cluster configuration)."""
    from kubernetes import client as kclient  # the only import of the client: its loaders
    from kubernetes import config as kconfig

    cfg = kclient.Configuration()
    default_file = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    try:
        if kubeconfig:
            kconfig.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig,
                context=context,
                client_configuration=cfg,
                persist_config=False,
            )
        elif _in_cluster():
            load_incluster = kconfig.load_incluster_config
            load_incluster(client_configuration=cfg)  # type: ignore[no-untyped-call]
        elif os.path.exists(default_file.split(os.pathsep)[0]):
            kconfig.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=default_file.split(os.pathsep)[0],
                context=context,
                client_configuration=cfg,
                persist_config=False,
            )
        elif not master:
            raise CredentialsError(
                "no --kubeconfig, not running in a cluster, no $KUBECONFIG or ~/.kube/config, "
                "and no --master"
            )
    except CredentialsError:
        raise
    except Exception as exc:  # the loaders raise ConfigException, OSError, YAML errors...
        where = kubeconfig or "in-cluster configuration"
        raise CredentialsError(f"{where}: {exc}") from None
    host = (master or cfg.host or "").rstrip("/")
    if not host:
        raise CredentialsError("the configuration names no API server")

    cached: list[tuple[float, str | None]] = []

    def token() -> str | None:
        # The loader's answer is kept for TOKEN_CACHE_S: its refresh hook re-applies the whole
        # configuration on every call (the host setter reads every proxy variable of the
        # environment), which was ~9 % of the scheduler's CPU under B2 at one call per request.
        # Refreshed tokens (exec plugins, projected service-account tokens) live for minutes.
        now = time.monotonic()
        if cached and now - cached[0][0] < TOKEN_CACHE_S:
            return cached[0][1]
        value = _token()
        cached[:] = [(now, value)]
        return value

    def _token() -> str | None:
        # auth_settings() names the header whatever the client version calls the key
        # ("authorization" or "BearerToken") and runs the token refresh hook.
        settings: Mapping[str, Any] = cfg.auth_settings()
        for setting in settings.values():
            if (
                setting.get("in") == "header"
                and str(setting.get("key", "")).lower() == "authorization"
                and setting.get("value")
            ):
                return str(setting["value"])
        if cfg.username or cfg.password:
            return str(cfg.get_basic_auth_token())
        return None

    return Credentials(
        host=host,
        verify_ssl=bool(cfg.verify_ssl),
        ca_file=cfg.ssl_ca_cert,
        ca_data=getattr(cfg, "ca_cert_data", None),
        cert_file=cfg.cert_file,
        key_file=cfg.key_file,
        tls_server_name=getattr(cfg, "tls_server_name", None),
        token=token,
    )


# ---------------------------------------------------------------------------------------------
# Transport


@dataclass(frozen=True, slots=True)
class RawResponse:
    status: int
    body: bytes


class Stream(Protocol):
    """An open streaming response (a watch)."""

    status: int

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives; ends when the server closes the stream."""
        ...

    def read_all(self) -> bytes: ...

    def close(self) -> None:
        """Idempotent; may be called from another thread to end a blocked ``chunks()``."""
        ...


class Transport(Protocol):
    def request(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> RawResponse: ...

    def stream(
        self, path: str, headers: Mapping[str, str], connect_timeout: float, read_timeout: float
    ) -> Stream: ...

    def close(self) -> None: ...


_NET_ERRORS = (urllib3.exceptions.HTTPError, OSError)


class _Urllib3Stream:
    def __init__(self, resp: urllib3.BaseHTTPResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self._closed = threading.Event()

    def chunks(self) -> Iterator[bytes]:
        try:
            for chunk in self._resp.stream(amt=None, decode_content=True):
                if chunk:
                    yield chunk
        except _NET_ERRORS as exc:
            if not self._closed.is_set():
                raise TransportError(f"watch stream: {exc}") from exc

    def read_all(self) -> bytes:
        try:
            return bytes(self._resp.read())
        except _NET_ERRORS as exc:
            raise TransportError(f"reading response: {exc}") from exc
        finally:
            self._resp.release_conn()

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        shutdown = getattr(self._resp, "shutdown", None)
        try:
            if shutdown is not None:
                shutdown()  # unblocks a read in another thread (urllib3 >= 2.3)
            self._resp.close()
        except _NET_ERRORS:
            pass
        finally:
            self._resp.release_conn()


def _shared_context(creds: Credentials) -> ssl.SSLContext:
    """One TLS context for every pooled connection.

    Without it urllib3 builds a context per new connection and loads the system CA store into
    it (~ms of CPU each; B2's profile showed it at 4 % of the scheduler's busy time while the
    bind workers opened their connections). The CA file/data and client certificate are still
    passed to urllib3 as before, which loads them into this context.
    """
    verify = creds.verify_ssl
    ctx = urllib3.util.ssl_.create_urllib3_context(
        cert_reqs=ssl.CERT_REQUIRED if verify else ssl.CERT_NONE
    )
    if not verify:
        ctx.check_hostname = False
    elif not (creds.ca_file or creds.ca_data):
        ctx.load_default_certs()
    return ctx


class Urllib3Transport:
    """HTTPS to one API server through a pooled urllib3 ``PoolManager``."""

    def __init__(self, creds: Credentials, pool_size: int = 32) -> None:
        self._base = creds.host
        kwargs: dict[str, Any] = {"maxsize": pool_size, "num_pools": 4}
        if creds.host.startswith("https://"):
            if creds.verify_ssl:
                kwargs["cert_reqs"] = "CERT_REQUIRED"
                if creds.ca_file:
                    kwargs["ca_certs"] = creds.ca_file
                if creds.ca_data:
                    kwargs["ca_cert_data"] = creds.ca_data
                if creds.tls_server_name:
                    kwargs["server_hostname"] = creds.tls_server_name
            else:
                kwargs["cert_reqs"] = "CERT_NONE"
                kwargs["assert_hostname"] = False
                urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
            if creds.cert_file:
                kwargs["cert_file"] = creds.cert_file
            if creds.key_file:
                kwargs["key_file"] = creds.key_file
        if creds.host.startswith("https://"):
            kwargs["ssl_context"] = _shared_context(creds)
        self._pool = urllib3.PoolManager(**kwargs)

    def request(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> RawResponse:
        try:
            resp = self._pool.request(
                method,
                self._base + path,
                body=body,
                headers=dict(headers),
                # ``total``: connecting counts against the timeout too, so no answer
                # (status line) comes later than ``timeout`` after the request started.
                timeout=urllib3.Timeout(total=timeout, connect=min(timeout, 10.0), read=timeout),
                retries=False,
                redirect=False,
                preload_content=False,
            )
        except _NET_ERRORS as exc:
            raise TransportError(f"{method} {path}: {exc}") from exc
        try:
            data = resp.read()
        except _NET_ERRORS as exc:
            raise TransportError(f"{method} {path}: reading the response: {exc}") from exc
        finally:
            resp.release_conn()
        return RawResponse(resp.status, bytes(data))

    def stream(
        self, path: str, headers: Mapping[str, str], connect_timeout: float, read_timeout: float
    ) -> Stream:
        try:
            resp = self._pool.request(
                "GET",
                self._base + path,
                headers=dict(headers),
                timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout),
                retries=False,
                redirect=False,
                preload_content=False,
            )
        except _NET_ERRORS as exc:
            raise TransportError(f"GET {path}: {exc}") from exc
        return _Urllib3Stream(resp)

    def close(self) -> None:
        self._pool.clear()


# ---------------------------------------------------------------------------------------------
# The client


def _error_from(status: int, body: bytes) -> ApiError:
    reason, message = "", ""
    try:
        doc = json.loads(body)
        if isinstance(doc, Mapping):
            reason = str(doc.get("reason") or "")
            message = str(doc.get("message") or "")
    except ValueError:
        pass
    if not message:
        message = body[:300].decode("utf-8", "replace").strip() or f"HTTP {status}"
    return ApiError(status, reason, message)


class WatchStream:
    """Decoded watch events ``(type, object)`` of one watch request; ``close()`` from any
    thread ends the iteration."""

    def __init__(self, stream: Stream) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[tuple[str, Mapping[str, Any]]]:
        buf = b""
        for chunk in self._stream.chunks():
            buf += chunk
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    break
                line, buf = buf[:nl], buf[nl + 1 :]
                if line.strip():
                    yield _event(line)
        if buf.strip():
            yield _event(buf)

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> WatchStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _event(line: bytes) -> tuple[str, Mapping[str, Any]]:
    try:
        doc = json.loads(line)
    except ValueError as exc:
        raise TransportError(f"watch stream: undecodable event: {exc}") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("object"), Mapping):
        raise TransportError("watch stream: event without an object")
    return str(doc.get("type") or ""), doc["object"]


RequestObserver = Callable[[str, str, str, float], None]
"""Told of every request: verb, URL template (``url_template``), status code (``"<error>"``
when no answer came), seconds — client-go's ``rest_client_*`` metrics."""


def url_template(path: str) -> str:
    """A request path as client-go's metrics label it: the namespace and the object name
    replaced by ``{namespace}`` and ``{name}``, the query dropped, so the label set stays
    bounded (``/api/v1/namespaces/{namespace}/pods/{name}/binding``)."""
    parts = path.split("?", 1)[0].split("/")
    # ["", "api", "v1", ...] or ["", "apis", group, version, ...]: the rest starts after these
    start = 3 if len(parts) > 1 and parts[1] == "api" else 4
    rest = parts[start:]
    if len(rest) >= 2 and rest[0] == "namespaces":
        rest[1] = "{namespace}"
        if len(rest) >= 4:  # namespaces/{ns}/<resource>/<name>[/<subresource>]
            rest[3] = "{name}"
    elif len(rest) >= 2:  # <resource>/<name>[/<subresource>]
        rest[1] = "{name}"
    return "/".join(parts[:start] + rest)


class RestClient:
    """JSON requests and watches against one API server (see the module docstring)."""

    def __init__(
        self,
        transport: Transport,
        *,
        token: Callable[[], str | None] = lambda: None,
        limiter: TokenBucket | None = None,
        timeout: float = 30.0,
        user_agent: str = USER_AGENT,
        observe: RequestObserver | None = None,
    ) -> None:
        self.transport = transport
        self._token = token
        self.limiter = limiter
        self.timeout = timeout
        self._user_agent = user_agent
        self._observe = observe

    def with_limiter(self, limiter: TokenBucket | None) -> RestClient:
        """The same connection and credentials with another rate limit (events, leases)."""
        return RestClient(
            self.transport,
            token=self._token,
            limiter=limiter,
            timeout=self.timeout,
            user_agent=self._user_agent,
            observe=self._observe,
        )

    def _observed(self, method: str, path: str, code: str, started: float) -> None:
        if self._observe is not None:
            self._observe(method, url_template(path), code, time.monotonic() - started)

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": JSON, "User-Agent": self._user_agent}
        token = self._token()
        if token:
            headers["Authorization"] = token
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """One request; the decoded JSON answer ({} when empty). Raises ``KubeError``."""
        if self.limiter is not None:
            self.limiter.acquire()
        url = path + ("?" + urlencode(query) if query else "")
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        started = time.monotonic()
        try:
            resp = self.transport.request(
                method,
                url,
                self._headers(content_type if data is not None else None),
                data,
                self.timeout if timeout is None else timeout,
            )
        except KubeError:
            self._observed(method, path, "<error>", started)
            raise
        self._observed(method, path, str(resp.status), started)
        if not 200 <= resp.status < 300:
            raise _error_from(resp.status, resp.body)
        if not resp.body:
            return {}
        try:
            doc = json.loads(resp.body)
        except ValueError as exc:
            raise TransportError(f"{method} {path}: undecodable answer: {exc}") from None
        return doc if isinstance(doc, dict) else {"value": doc}

    def watch(
        self,
        path: str,
        query: Mapping[str, str],
        *,
        read_timeout: float,
        connect_timeout: float = 10.0,
    ) -> WatchStream:
        """Open a watch (``query`` should carry ``watch=1`` and a ``resourceVersion``)."""
        started = time.monotonic()
        try:
            stream = self.transport.stream(
                path + "?" + urlencode(query), self._headers(None), connect_timeout, read_timeout
            )
        except KubeError:
            self._observed("GET", path, "<error>", started)
            raise
        self._observed("GET", path, str(stream.status), started)
        if stream.status != 200:
            raise _error_from(stream.status, stream.read_all())
        return WatchStream(stream)

    def close(self) -> None:
        self.transport.close()
