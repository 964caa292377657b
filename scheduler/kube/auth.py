"""Delegated authentication and authorization of the scheduler's secure port, as kube
components do them: a bearer token is reviewed by the API server (``TokenReview``), and the
user it names is checked for the request's non-resource path (``SubjectAccessReview``).

Role: the adapter behind ``scheduler.observability.health.Access`` (built by
``scheduler.commands.run``, which hands its bound methods to ``HealthServer``). Invariants:
answers are cached briefly to spare the API server (``ALLOWED_TTL`` for a valid token or an
allowed request, as kube's delegated authenticator and authorizer do, ``DENIED_TTL`` for the
others), keyed by the token's SHA-256 (the token itself is never kept); a failed review raises
(``KubeError``) and is not cached; the caches are bounded (``CACHE_ENTRIES``).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar

from scheduler.kube.rest import RestClient
from scheduler.observability.health import User

__all__ = [
    "ALLOWED_TTL",
    "DENIED_TTL",
    "SUBJECT_ACCESS_REVIEWS",
    "TOKEN_REVIEWS",
    "SubjectAccessReviewAuthorizer",
    "TokenReviewAuthenticator",
]

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
ALLOWED_TTL = 10.0
"""Seconds a valid token's user, or an allowed request, is remembered (kube's delegated 10 s)."""
DENIED_TTL = 2.0
"""Seconds an invalid token, or a denied request, is remembered (shorter: a fixed RBAC binding
or a new token takes effect soon)."""
REVIEW_TIMEOUT = 10.0
"""Seconds one review may take (kube's webhook timeout)."""
CACHE_ENTRIES = 4096

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _TTLCache(Generic[K, V]):
    """Answers that expire; the oldest entry goes when full. Thread-safe."""

    def __init__(self, clock: Callable[[], float], entries: int = CACHE_ENTRIES) -> None:
        self._clock = clock
        self._max = entries
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> tuple[V] | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            if found[0] <= self._clock():
                del self._entries[key]
                return None
            return (found[1],)

    def put(self, key: K, value: V, ttl: float) -> None:
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = (self._clock() + ttl, value)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _user(doc: Mapping[str, Any]) -> User | None:
    name = doc.get("username")
    if not isinstance(name, str) or not name:
        return None
    extra = doc.get("extra")
    items = extra.items() if isinstance(extra, dict) else ()
    pairs = sorted((str(k), _strings(v)) for k, v in items)
    return User(name, _strings(doc.get("groups")), str(doc.get("uid") or ""), tuple(pairs))


class _Review:
    """What both reviews share: the API server, the answer's cache lifetimes (allowed,
    denied), the request timeout, the clock."""

    def __init__(
        self,
        rest: RestClient,
        *,
        allowed_ttl: float = ALLOWED_TTL,
        denied_ttl: float = DENIED_TTL,
        timeout: float = REVIEW_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rest = rest
        self._ttl = (allowed_ttl, denied_ttl)
        self._timeout = timeout
        self._clock = clock


class TokenReviewAuthenticator(_Review):
    """``authenticate(token)`` of ``Access``: the token's user per the API server, or None."""

    def __init__(self, rest: RestClient, **options: Any) -> None:
        super().__init__(rest, **options)
        self._cache: _TTLCache[bytes, User | None] = _TTLCache(self._clock)

    def __call__(self, token: str) -> User | None:
        key = hashlib.sha256(token.encode()).digest()
        hit = self._cache.get(key)
        if hit is not None:
            return hit[0]
        review = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        doc = self._rest.request("POST", TOKEN_REVIEWS, body=review, timeout=self._timeout)
        status = doc.get("status")
        user = None
        if isinstance(status, dict) and status.get("authenticated") is True:
            found = status.get("user")
            user = _user(found) if isinstance(found, dict) else None
        self._cache.put(key, user, self._ttl[0] if user is not None else self._ttl[1])
        return user


class SubjectAccessReviewAuthorizer(_Review):
    """``authorize(user, verb, path)`` of ``Access``: may ``user`` ``verb`` the non-resource
    ``path``, per the API server's authorizers; (allowed, the reviewer's reason)."""

    def __init__(self, rest: RestClient, **options: Any) -> None:
        super().__init__(rest, **options)
        self._cache: _TTLCache[tuple[User, str, str], tuple[bool, str]] = _TTLCache(self._clock)

    def __call__(self, user: User, verb: str, path: str) -> tuple[bool, str]:
        key = (user, verb, path)
        hit = self._cache.get(key)
        if hit is not None:
            return hit[0]
        spec: dict[str, Any] = {"user": user.name}
        if user.uid:
            spec["uid"] = user.uid
        spec["groups"] = list(user.groups)
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        spec["nonResourceAttributes"] = {"path": path, "verb": verb}
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        }
        doc = self._rest.request("POST", SUBJECT_ACCESS_REVIEWS, body=review, timeout=self._timeout)
        status = doc.get("status")
        status = status if isinstance(status, dict) else {}
        allowed = status.get("allowed") is True and status.get("denied") is not True
        answer = (allowed, str(status.get("reason") or ""))
        self._cache.put(key, answer, self._ttl[0] if allowed else self._ttl[1])
        return answer
