"""The chaos tier's forger (tests/e2e/chaos/webhook.py): what it sends and how it counts the
answers; a 2xx to any forgery is recorded as admitted."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from tests.e2e.chaos.webhook import FORGED_PREFIX, Forger
from tests.e2e.test_scheduler_harness import ALLOCATED, KubeError


class FakeUser:
    """The user's client: every write answered ``status`` (2xx: accepted)."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.sent: list[tuple[str, str, Any]] = []

    def _answer(self, method: str, path: str, body: Any) -> dict[str, Any]:
        self.sent.append((method, path, body))
        if self.status >= 300:
            raise KubeError(self.status, "{}")
        return {}

    def post(self, path: str, body: Any) -> dict[str, Any]:
        return self._answer("POST", path, body)

    def patch(self, path: str, body: Any) -> dict[str, Any]:
        return self._answer("PATCH", path, body)


@pytest.mark.parametrize(
    ("status", "admitted"),
    [pytest.param(403, 0, id="guard-refuses"), pytest.param(500, 0, id="webhook-down"),
     pytest.param(201, 2, id="admitted")],
)  # fmt: skip
def test_every_forgery_is_sent_with_an_allocation_and_counted(status: int, admitted: int) -> None:
    user = FakeUser(status)
    forger = Forger(user, "chaos", ["n0", "n1"], random.Random(1))  # type: ignore[arg-type]
    forger.attempt(["p-00001"])
    (m1, create, pod), (m2, patch, body) = user.sent
    assert (m1, create) == ("POST", "/api/v1/namespaces/chaos/pods")
    assert pod["metadata"]["name"].startswith(FORGED_PREFIX)
    assert pod["spec"]["nodeName"] in ("n0", "n1")
    assert json.loads(pod["metadata"]["annotations"][ALLOCATED])["gpu"][0]["minor"] == 0
    assert m2 == "PATCH" and patch.startswith("/api/v1/namespaces/chaos/pods/p-00001")
    assert ALLOCATED in body["metadata"]["annotations"]
    assert len(forger.admitted) == admitted
    assert sum(forger.answers.values()) == 2
    assert forger.answers[status] == 2


def test_no_live_pod_no_patch() -> None:
    user = FakeUser(403)
    forger = Forger(user, "chaos", ["n0"], random.Random(1))  # type: ignore[arg-type]
    forger.attempt([])
    assert [m for m, _, _ in user.sent] == ["POST"]
