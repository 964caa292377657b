"""The admission wire format: ``admission.k8s.io/v1`` (and ``v1beta1``) ``AdmissionReview``.

Role: decode what the API server POSTs to a webhook into a ``Review`` and encode the answer
(``AdmissionReview`` with ``response``: ``uid``, ``allowed``, a ``status`` for a refusal, a
base64 ``JSONPatch`` for a mutation). Pure: bytes in, records out, no I/O.

Facts kept: the answer echoes the request's ``apiVersion`` and ``uid`` (the API server drops
an answer whose uid differs); ``patchType`` is ``JSONPatch`` and ``patch`` is the base64 of a
JSON array; a refusal's ``status.message`` is what the user sees after ``admission webhook
"<name>" denied the request:``.

Invariants: a body that is not an AdmissionReview with a request (bad JSON, JSON nested
deeper than ``apis.jsonload.MAX_DEPTH``, wrong kind or version, a missing uid) raises
``ReviewError`` with one line naming the field, answered 400; nothing here guesses a value
that was not sent. Anything the API server sends decodes: a tenant's pod with managedFields
nested 1,500 levels (the API server stores it) is reviewed like any pod, its
``metadata.managedFields`` dropped from ``object`` and ``oldObject`` (no webhook reads it).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from apis.core import drop_managed_fields
from apis.jsonload import MAX_DEPTH, JSONDecodeDepthError, loads

__all__ = [
    "API_VERSIONS",
    "Review",
    "ReviewError",
    "UserInfo",
    "decode_review",
    "encode_response",
]

API_VERSIONS: Final = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")


class ReviewError(ValueError):
    """A request body the API server would never send (answered 400)."""


@dataclass(frozen=True, slots=True)
class UserInfo:
    username: str
    groups: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Review:
    """One admission request, as much of it as the webhooks read."""

    api_version: str
    uid: str
    operation: str
    resource: str
    """``group/version/resource`` (``/v1/pods`` for the core group)."""
    sub_resource: str = ""
    namespace: str = ""
    name: str = ""
    user: UserInfo = field(default_factory=lambda: UserInfo(""))
    object: Mapping[str, Any] | None = None
    old_object: Mapping[str, Any] | None = None

    @property
    def is_pod(self) -> bool:
        return self.resource == "/v1/pods"


def _obj(value: Any, path: str) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ReviewError(f"{path}: expected an object, got {type(value).__name__}")
    return value


def _str(value: Any, path: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ReviewError(f"{path}: expected a string, got {type(value).__name__}")
    return value


def decode_review(body: bytes) -> Review:
    """The review of ``body``; raises ``ReviewError``."""
    try:
        doc = loads(body)
    except JSONDecodeDepthError:  # a hostile body: [[[[...]]]] 100,000 deep
        raise ReviewError(
            f"request body is JSON nested too deeply (over {MAX_DEPTH} levels)"
        ) from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise ReviewError(f"request body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ReviewError(f"expected an AdmissionReview object, got {type(doc).__name__}")
    if doc.get("kind") != "AdmissionReview":
        raise ReviewError(f"kind: expected AdmissionReview, got {doc.get('kind')!r}")
    api_version = doc.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise ReviewError(
            f"apiVersion: expected one of {', '.join(API_VERSIONS)}, got {api_version!r}"
        )
    req = _obj(doc.get("request"), "request")
    if req is None:
        raise ReviewError("request: missing")
    uid = _str(req.get("uid"), "request.uid")
    if not uid:
        raise ReviewError("request.uid: missing")
    res = _obj(req.get("resource"), "request.resource") or {}
    resource = "/".join(
        _str(res.get(k), f"request.resource.{k}") for k in ("group", "version", "resource")
    )
    user = _obj(req.get("userInfo"), "request.userInfo") or {}
    groups = user.get("groups") or []
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise ReviewError("request.userInfo.groups: expected a list of strings")
    return Review(
        api_version=str(api_version),
        uid=uid,
        operation=_str(req.get("operation"), "request.operation"),
        resource=resource,
        sub_resource=_str(req.get("subResource"), "request.subResource"),
        namespace=_str(req.get("namespace"), "request.namespace"),
        name=_str(req.get("name"), "request.name"),
        user=UserInfo(_str(user.get("username"), "request.userInfo.username"), tuple(groups)),
        object=_obj(drop_managed_fields(req.get("object")), "request.object"),
        old_object=_obj(drop_managed_fields(req.get("oldObject")), "request.oldObject"),
    )


def encode_response(
    review: Review,
    *,
    allowed: bool = True,
    code: int = 0,
    message: str = "",
    patch: Sequence[Mapping[str, Any]] = (),
) -> bytes:
    """The AdmissionReview answering ``review``: allowed (with ``patch`` when not empty), or
    refused with ``code`` and ``message``."""
    response: dict[str, Any] = {"uid": review.uid, "allowed": allowed}
    if not allowed:
        reason = {400: "BadRequest", 403: "Forbidden"}.get(code, "")
        response["status"] = {"status": "Failure", "code": code, "message": message}
        if reason:
            response["status"]["reason"] = reason
    elif patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(
            json.dumps(list(patch), separators=(",", ":")).encode()
        ).decode()
    doc = {"apiVersion": review.api_version, "kind": "AdmissionReview", "response": response}
    return json.dumps(doc, separators=(",", ":")).encode()
