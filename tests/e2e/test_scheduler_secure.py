"""The secure port of ``koord-scheduler run`` on a real API server (--authorization-mode=RBAC):
HTTPS with the self-signed certificate it makes, the bearer token of each request reviewed by
the API server (TokenReview) and its user authorized for the path (SubjectAccessReview). The
scheduler runs as the ServiceAccount of config/scheduler/rbac.yaml (its ClusterRole must
suffice for the reviews), a scraper is bound to config/prometheus/rbac.yaml's ClusterRole."""

from __future__ import annotations

import http.client
import json
import ssl
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_scheduler_harness import (
    REPO_ROOT,
    Kube,
    SchedulerProcess,
    free_port,
    scheduler_config,
)

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e

SA_USER = "system:serviceaccount:koordinator-system:koord-scheduler"
SA_GROUPS = ["system:serviceaccounts", "system:serviceaccounts:koordinator-system"]
READER, NOBODY = "metrics-scraper", "nobody-special"
COLLECTIONS = {
    "Namespace": "/api/v1/namespaces",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
}


def _apply(kube: Kube, path: Path, *, subjects: list[dict[str, str]] | None = None) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in sorted(docs, key=lambda d: list(COLLECTIONS).index(d["kind"])):
        if subjects is not None and doc["kind"] == "ClusterRoleBinding":
            doc["subjects"] = subjects
        kube.post(COLLECTIONS[doc["kind"]].format(ns=doc["metadata"].get("namespace", "")), doc)


@pytest.fixture(scope="module")
def secure(
    make_apiserver_module: Callable[..., ApiServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ApiServer, SchedulerProcess, int]]:
    tmp = tmp_path_factory.mktemp("secure")
    server = make_apiserver_module(
        authorization_mode="RBAC", extra_users={SA_USER: SA_GROUPS, READER: [], NOBODY: []}
    )
    admin = Kube(server.url, server.admin_token)
    admin.ensure_device_crd()
    _apply(admin, REPO_ROOT / "config/scheduler/rbac.yaml")
    _apply(
        admin,
        REPO_ROOT / "config/prometheus/rbac.yaml",
        subjects=[{"kind": "User", "name": READER, "apiGroup": "rbac.authorization.k8s.io"}],
    )
    port = free_port()
    proc = SchedulerProcess(
        server.kubeconfig_path(server.token_for(SA_USER)),
        scheduler_config(tmp / "sched.yaml", "koord-secure"),
        tmp,
        extra_args=[f"--secure-port={port}"],
    ).start()
    try:
        proc.wait_ready(timeout=60)
        yield server, proc, port
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def make_apiserver_module(
    kube_binaries: tuple[str, str],
) -> Iterator[Callable[..., ApiServer]]:
    from apiserver import ApiServer

    started: list[ApiServer] = []

    def make(**kwargs: Any) -> ApiServer:
        srv = ApiServer(*kube_binaries, **kwargs)
        started.append(srv)
        return srv.start()

    try:
        yield make
    finally:
        for srv in started:
            srv.stop()


def _context(port: int) -> ssl.SSLContext:
    """Trusts exactly the certificate the scheduler serves (hostname checked)."""
    pem = ssl.get_server_certificate(("127.0.0.1", port))
    return ssl.create_default_context(cadata=pem)


def _get(port: int, path: str, token: str | None = None) -> tuple[int, str]:
    conn = http.client.HTTPSConnection("localhost", port, context=_context(port), timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def test_probe_paths_are_open_over_https(
    secure: tuple[ApiServer, SchedulerProcess, int],
) -> None:
    _, proc, port = secure
    for path in ("/healthz", "/livez", "/readyz"):
        assert _get(port, path) == (200, "ok\n"), path
    (line,) = [e for e in proc.log_lines() if "self-signed" in str(e.get("event"))]
    assert "localhost" in line["hosts"]


def test_a_token_bound_to_the_metrics_reader_role_scrapes(
    secure: tuple[ApiServer, SchedulerProcess, int],
) -> None:
    server, proc, port = secure
    code, body = _get(port, "/metrics", server.token_for(READER))
    assert code == 200, body
    assert "# TYPE scheduler_pending_pods gauge" in body
    # The role grants /metrics only.
    code, body = _get(port, "/debug/memory", server.token_for(READER))
    assert code == 403
    assert json.loads(body)["message"] == (
        f'forbidden: User "{READER}" cannot get path "/debug/memory"'
    )
    # The scheduler's own reviews were allowed by its ClusterRole.
    assert not [e for e in proc.log_lines() if "cannot authenticate" in str(e.get("event"))]


def test_other_tokens_are_refused(secure: tuple[ApiServer, SchedulerProcess, int]) -> None:
    server, _, port = secure
    code, body = _get(port, "/metrics", server.token_for(NOBODY))
    assert code == 403
    doc = json.loads(body)
    assert (doc["reason"], doc["code"]) == ("Forbidden", 403)
    assert doc["message"] == f'forbidden: User "{NOBODY}" cannot get path "/metrics"'
    code, body = _get(port, "/metrics")
    assert code == 403
    assert json.loads(body)["message"] == (
        'forbidden: User "system:anonymous" cannot get path "/metrics"'
    )
    code, body = _get(port, "/metrics", "not-a-token-the-api-server-knows")
    assert code == 401 and json.loads(body)["reason"] == "Unauthorized"


def test_the_plain_port_is_only_there_when_asked_for(
    secure: tuple[ApiServer, SchedulerProcess, int],
) -> None:
    _, proc, port = secure
    assert proc.http("/healthz")[0] == 200  # the harness asks for --port
    warned = [e for e in proc.log_lines() if "plain HTTP" in str(e.get("event"))]
    assert warned and warned[0]["port"] == proc.port
    plain = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:  # and the secure port never answers plain HTTP
        with pytest.raises((http.client.HTTPException, OSError)):
            plain.request("GET", "/healthz")
            plain.getresponse().read()
    finally:
        plain.close()
