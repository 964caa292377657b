"""Where the API server is and how to authenticate: ``--kubeconfig`` / ``--master`` / the
in-cluster service account turned into ``Credentials``.

Role: the only module of the scheduler that imports the ``kubernetes`` package (its config
loaders), and only for kubeconfigs this module does not read itself: a plain kubeconfig (a
static token or client certificate files, a CA) is read with ``yaml`` directly, since
importing the package was ~0.7 s of start-up CPU. Invariants: one clear ``CredentialsError``
line for anything unusable; a loader's bearer token is reused for ``TOKEN_CACHE_S`` (its
refresh hook re-applies the whole configuration on every call).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.kube.errors import CredentialsError

__all__ = ["TOKEN_CACHE_S", "Credentials", "kubernetes_credentials", "load_credentials"]

TOKEN_CACHE_S = 1.0
"""Seconds a bearer token from the kubeconfig/in-cluster loader is reused before asking the
loader again (its refresh hook runs then)."""


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
