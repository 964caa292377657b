"""scheduler.webhook.review: the AdmissionReview codec, and every malformed body refused with
one line naming the field."""

from __future__ import annotations

import json

import pytest

from scheduler.webhook.review import ReviewError, UserInfo, decode_review, encode_response
from tests.unit.webhook.reviews import patch_of, pod, response, review, review_doc


def test_decodes_what_the_api_server_sends() -> None:
    r = review(pod(), user="alice", groups=["team", "system:authenticated"])
    assert (r.uid, r.operation, r.resource, r.namespace, r.name) == (
        "705ab4f5-6393-11e8-b7cc-42010a800002",
        "CREATE",
        "/v1/pods",
        "team-a",
        "p",
    )
    assert r.user == UserInfo("alice", ("team", "system:authenticated"))
    assert r.is_pod and r.old_object is None and r.object is not None
    status = review(pod(), sub_resource="status", operation="UPDATE", old=pod())
    assert status.sub_resource == "status" and status.old_object is not None
    device = review({}, resource=("scheduling.koordinator.sh", "v1alpha1", "devices"))
    assert device.resource == "scheduling.koordinator.sh/v1alpha1/devices" and not device.is_pod


@pytest.mark.parametrize("version", ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])
def test_the_answer_echoes_version_and_uid(version: str) -> None:
    r = review(pod(), api_version=version, uid="u-1")
    doc = json.loads(encode_response(r))
    assert doc == {
        "apiVersion": version,
        "kind": "AdmissionReview",
        "response": {"uid": "u-1", "allowed": True},
    }


def test_a_refusal_carries_code_reason_and_message() -> None:
    resp = response(encode_response(review(pod()), allowed=False, code=403, message="no"))
    assert resp["allowed"] is False
    assert resp["status"] == {
        "status": "Failure",
        "code": 403,
        "reason": "Forbidden",
        "message": "no",
    }
    assert "patch" not in resp


def test_a_patch_is_base64_jsonpatch() -> None:
    ops = [{"op": "add", "path": "/spec/schedulerName", "value": "koord-scheduler"}]
    resp = response(encode_response(review(pod()), patch=ops))
    assert resp["allowed"] is True and patch_of(resp) == ops


def _doc(**changes: object) -> bytes:
    doc = review_doc(pod())
    for key, value in changes.items():
        if key.startswith("request_"):
            doc["request"][key.removeprefix("request_")] = value
        else:
            doc[key] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "request body is not JSON"),
        (b"{nope", "request body is not JSON"),
        (b"\xff\xfe", "request body is not JSON"),
        (b"[" * 100_000, "nested too deeply"),
        (b"[]", "expected an AdmissionReview object, got list"),
        (_doc(kind="Pod"), "kind: expected AdmissionReview, got 'Pod'"),
        (_doc(apiVersion="admission.k8s.io/v2"), "apiVersion: expected one of"),
        (_doc(request=None), "request: missing"),
        (_doc(request=[1]), "request: expected an object, got list"),
        (_doc(request_uid=""), "request.uid: missing"),
        (_doc(request_uid=7), "request.uid: expected a string, got int"),
        (_doc(request_userInfo={"groups": "x"}), "request.userInfo.groups: expected a list"),
        (_doc(request_object="pod"), "request.object: expected an object, got str"),
        (_doc(request_operation=["CREATE"]), "request.operation: expected a string"),
    ],
    ids=[
        "empty",
        "garbage",
        "not-utf8",
        "deep",
        "list",
        "kind",
        "version",
        "no-request",
        "request-list",
        "no-uid",
        "uid-int",
        "groups",
        "object",
        "operation",
    ],
)
def test_malformed_bodies_are_one_line(body: bytes, message: str) -> None:
    with pytest.raises(ReviewError) as err:
        decode_review(body)
    assert message in str(err.value) and "\n" not in str(err.value)
