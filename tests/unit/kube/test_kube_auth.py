"""scheduler.kube.auth: delegated authentication (TokenReview) and authorization
(SubjectAccessReview) over RestClient, their brief caches, and the secure port of
``HealthServer`` guarded by them (the API server faked at the transport)."""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from scheduler.kube.auth import (
    ALLOWED_TTL,
    DENIED_TTL,
    SUBJECT_ACCESS_REVIEWS,
    TOKEN_REVIEWS,
    SubjectAccessReviewAuthorizer,
    TokenReviewAuthenticator,
)
from scheduler.kube.rest import ApiError, RestClient, TransportError
from scheduler.kube.transport import RawResponse
from scheduler.observability.health import Access, HealthServer, User
from scheduler.observability.tls import self_signed, server_context

USERS = {
    "reader-token": {"username": "reader", "uid": "u1", "groups": ["readers"],
                     "extra": {"scopes": ["a"]}},
    "other-token": {"username": "other", "groups": ["system:authenticated"]},
}  # fmt: skip
ALLOWED = {("reader", "/metrics"), ("reader", "/debug/memory")}


class ApiServer:
    """The two review endpoints of an API server, answering from USERS and ALLOWED."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, Any]] = []
        self.fail = False

    def request(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes | None,
        timeout: float,
    ) -> RawResponse:  # fmt: skip
        doc = json.loads(body or b"{}")
        self.bodies.append((path, doc))
        if self.fail:
            raise TransportError("connection refused")
        assert method == "POST" and headers["Authorization"] == "Bearer scheduler"
        if path == TOKEN_REVIEWS:
            user = USERS.get(doc["spec"]["token"])
            status: dict[str, Any] = {"authenticated": True, "user": user} if user else {
                "authenticated": False, "error": "invalid bearer token"}  # fmt: skip
        elif path == SUBJECT_ACCESS_REVIEWS:
            spec = doc["spec"]
            allowed = (spec["user"], spec["nonResourceAttributes"]["path"]) in ALLOWED
            status = {"allowed": allowed}
        else:
            return RawResponse(404, b"{}")
        return RawResponse(201, json.dumps({**doc, "status": status}).encode())

    def stream(self, *args: Any) -> Any:
        raise AssertionError("no watches")

    def close(self) -> None:
        pass

    def count(self, path: str) -> int:
        return sum(1 for p, _ in self.bodies if p == path)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api() -> ApiServer:
    return ApiServer()


def rest(api: ApiServer) -> RestClient:
    return RestClient(api, token=lambda: "Bearer scheduler")


def test_token_review_asks_the_api_server_and_maps_the_user(api: ApiServer) -> None:
    authn = TokenReviewAuthenticator(rest(api))
    user = authn("reader-token")
    assert user == User("reader", ("readers",), "u1", (("scopes", ("a",)),))
    ((path, body),) = api.bodies
    assert path == TOKEN_REVIEWS
    assert body == {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": "reader-token"},
    }
    assert authn("nobody-token") is None


def test_token_reviews_are_cached_briefly_denials_more_briefly(api: ApiServer) -> None:
    clock = Clock()
    authn = TokenReviewAuthenticator(rest(api), clock=clock)
    assert DENIED_TTL < ALLOWED_TTL == 10.0
    for _ in range(3):
        assert authn("reader-token") is not None
        assert authn("bad-token") is None
    assert api.count(TOKEN_REVIEWS) == 2  # one review per token
    clock.now += DENIED_TTL + 0.01
    assert authn("reader-token") is not None and authn("bad-token") is None
    assert api.count(TOKEN_REVIEWS) == 3  # only the denial expired
    clock.now += ALLOWED_TTL
    authn("reader-token")
    assert api.count(TOKEN_REVIEWS) == 4
    # The cache never holds the token itself.
    assert all("reader-token" not in repr(k) for k in authn._cache._entries)


def test_failed_reviews_raise_and_are_not_cached(api: ApiServer) -> None:
    authn = TokenReviewAuthenticator(rest(api))
    authz = SubjectAccessReviewAuthorizer(rest(api))
    api.fail = True
    with pytest.raises(TransportError):
        authn("reader-token")
    with pytest.raises(TransportError):
        authz(User("reader"), "get", "/metrics")
    api.fail = False
    assert authn("reader-token") is not None
    assert authz(User("reader"), "get", "/metrics") == (True, "")


def test_subject_access_review_for_a_non_resource_path(api: ApiServer) -> None:
    clock = Clock()
    authz = SubjectAccessReviewAuthorizer(rest(api), clock=clock)
    reader = User("reader", ("readers",), "u1", (("scopes", ("a",)),))
    assert authz(reader, "get", "/metrics") == (True, "")
    assert authz(User("other", ("system:authenticated",)), "get", "/metrics") == (False, "")
    path, body = api.bodies[0]
    assert path == SUBJECT_ACCESS_REVIEWS
    assert body == {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": "reader",
            "uid": "u1",
            "groups": ["readers"],
            "extra": {"scopes": ["a"]},
            "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
        },
    }
    authz(reader, "get", "/metrics")
    authz(User("other", ("system:authenticated",)), "get", "/metrics")
    assert api.count(SUBJECT_ACCESS_REVIEWS) == 2  # both answers cached
    clock.now += DENIED_TTL + 0.01
    authz(reader, "get", "/metrics")
    authz(User("other", ("system:authenticated",)), "get", "/metrics")
    assert api.count(SUBJECT_ACCESS_REVIEWS) == 3  # the denial expired first


def test_an_api_server_error_status_raises(api: ApiServer) -> None:
    class Refusing(ApiServer):
        def request(self, *args: Any, **kwargs: Any) -> RawResponse:
            doc = {"kind": "Status", "code": 403, "reason": "Forbidden", "message": "no"}
            return RawResponse(403, json.dumps(doc).encode())

    with pytest.raises(ApiError):
        TokenReviewAuthenticator(rest(Refusing()))("reader-token")


@pytest.fixture
def secure(api: ApiServer) -> Iterator[HealthServer]:
    cert, key = self_signed(["localhost"])
    client = rest(api)
    srv = HealthServer(
        "127.0.0.1",
        0,
        metrics=lambda out: out.write(b"x 1.0\n"),
        tls=server_context(cert, key),
        access=Access(TokenReviewAuthenticator(client), SubjectAccessReviewAuthorizer(client)),
    )
    srv.cafile = cert  # type: ignore[attr-defined]
    srv.start()
    yield srv
    srv.stop()


def get(srv: HealthServer, path: str, token: str | None = None) -> tuple[int, str]:
    ctx = ssl.create_default_context(cadata=srv.cafile.decode())  # type: ignore[attr-defined]
    conn = http.client.HTTPSConnection("localhost", srv.port, context=ctx, timeout=5)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def test_the_secure_port_with_the_api_servers_reviews(secure: HealthServer, api: ApiServer) -> None:
    assert get(secure, "/metrics", "reader-token") == (200, "x 1.0\n")
    code, body = get(secure, "/metrics", "other-token")
    assert code == 403
    assert json.loads(body)["message"] == 'forbidden: User "other" cannot get path "/metrics"'
    assert get(secure, "/metrics", "forged-token")[0] == 401
    code, body = get(secure, "/metrics")
    assert code == 403 and "system:anonymous" in body
    assert get(secure, "/healthz")[0] == 200
    # The second scrape is answered from the caches: no new review.
    before = len(api.bodies)
    assert get(secure, "/metrics", "reader-token")[0] == 200
    assert len(api.bodies) == before
    anonymous = [b for p, b in api.bodies if p == SUBJECT_ACCESS_REVIEWS and
                 b["spec"]["user"] == "system:anonymous"]  # fmt: skip
    assert anonymous[0]["spec"]["groups"] == ["system:unauthenticated"]
    # The API server unreachable: tokens cannot be checked (401), probes still answer.
    api.fail = True
    assert get(secure, "/metrics", "other2-token")[0] == 401
    assert get(secure, "/healthz")[0] == 200
