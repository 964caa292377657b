"""koordlet.kube against deep and malformed answers (issue 45, finding 1): the node's pod list
with a tenant's 1,500-deep managedFields pod still lists every pod (the Device CR sync and
GPU admission read it), and nothing but ``ApiError`` leaves ``KubeNodeAPI``.

The fake is the ``kubernetes`` ``ApiClient`` surface ``KubeNodeAPI`` uses (``param_serialize``,
``call_api`` and the response it returns); the bodies are what the API server serves."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from apis.jsonload import MAX_DEPTH
from koordlet.kube import KubeNodeAPI
from koordlet.reporting.sync import ApiError
from tests.deepjson import chain, deep_list_page, with_deep_managed_fields


@dataclass
class _Urllib3Response:
    released: bool = False

    def release_conn(self) -> None:
        self.released = True


@dataclass
class _Response:
    status: int
    body: bytes
    reason: str = "OK"

    def __post_init__(self) -> None:
        self.response = _Urllib3Response()

    def read(self) -> bytes:
        return self.body


class FakeApiClient:
    """Answers every call with ``status`` and ``body``."""

    def __init__(self, status: int, body: bytes) -> None:
        self.answer = _Response(status, body)
        self.paths: list[str] = []

    def param_serialize(self, *, method: str, resource_path: str, **_: Any) -> tuple[Any, ...]:
        self.paths.append(resource_path)
        return method, resource_path, {}, None, None

    def call_api(self, method: str, url: str, **_: Any) -> _Response:
        return self.answer


def pod(uid: str) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": "team", "annotations": {}},
        "spec": {"nodeName": "n", "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


def test_the_node_pod_list_with_a_deep_pod_lists_every_pod() -> None:
    objects = [json.dumps(pod("a")), with_deep_managed_fields(pod("deep"), 1_500)]
    client = FakeApiClient(200, deep_list_page(objects))
    pods = KubeNodeAPI(client).list_node_pods("n")
    assert pods.uids == {"a", "deep"}
    assert client.answer.response.released


def test_a_deep_single_pod_decodes() -> None:
    client = FakeApiClient(200, with_deep_managed_fields(pod("deep"), 9_990).encode())
    assert KubeNodeAPI(client).get_pod("team", "deep", 2.0).uid == "deep"


@pytest.mark.parametrize("status", [200, 500])
@pytest.mark.parametrize(
    "body", [chain(MAX_DEPTH + 1).encode(), b"<html>"], ids=["too-deep", "garbage"]
)
def test_an_undecodable_answer_is_an_api_error(status: int, body: bytes) -> None:
    with pytest.raises(ApiError) as exc:
        KubeNodeAPI(FakeApiClient(status, body)).list_node_pods("n")
    assert exc.value.status == (0 if status == 200 else status)


def test_a_deep_error_body_is_an_api_error() -> None:
    with pytest.raises(ApiError) as exc:
        KubeNodeAPI(FakeApiClient(500, chain(1_500).encode())).list_node_pods("n")
    assert exc.value.status == 500
