"""scheduler.webhook.server over real loopback HTTPS (HealthServer with the webhook's routes):
verdicts, hostile bodies answered with one line while the server keeps serving, metrics by
webhook, operation and verdict, and the drain of reviews in flight."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from scheduler.observability.health import Check, HealthServer
from scheduler.observability.tls import issue_serving, load_server_context
from scheduler.webhook.policy import WebhookPolicy
from scheduler.webhook.server import AdmissionRoutes, WebhookMetrics
from tests.deepjson import with_deep_managed_fields
from tests.unit.webhook.reviews import body, patch_of, pod, response, review_doc

MAX_BODY = 64 << 10


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    ca, cert, key = issue_serving(["localhost", "127.0.0.1"])
    for name, data in (("ca.crt", ca), ("tls.crt", cert), ("tls.key", key)):
        (out / name).write_bytes(data)
    return out


@pytest.fixture
def served(certs: Path) -> Iterator[tuple[int, AdmissionRoutes, ssl.SSLContext]]:
    routes = AdmissionRoutes(WebhookPolicy(), WebhookMetrics())
    srv = HealthServer(
        "127.0.0.1",
        0,
        live=[Check("ping", lambda: None)],
        metrics=routes.metrics.write,
        tls=load_server_context(str(certs / "tls.crt"), str(certs / "tls.key")),
        post=routes.routes(),
        max_body=MAX_BODY,
    )
    srv.start()
    client = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    yield srv.port, routes, client
    srv.stop()


def _post(port: int, ctx: ssl.SSLContext, path: str, data: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        conn.request("POST", path, data, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _get(port: int, ctx: ssl.SSLContext, path: str) -> tuple[int, str]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


GPU = pod(limits={"nvidia.com/gpu": "1"})
BAD = pod(limits={"koordinator.sh/gpu-core": "30"})
HELD = pod(annotations={"scheduling.koordinator.sh/device-allocated": "{}"}, node="n")


def test_the_three_webhooks_answer(served: tuple[int, AdmissionRoutes, ssl.SSLContext]) -> None:
    port, _, ctx = served
    code, out = _post(port, ctx, "/mutate", body(GPU))
    assert code == 200 and patch_of(response(out))[0]["value"] == "koord-scheduler"
    code, out = _post(port, ctx, "/validate", body(BAD))
    resp = response(out)
    assert code == 200 and resp["allowed"] is False and resp["status"]["code"] == 400
    assert resp["status"]["message"].startswith("spec.containers[0] (main).resources: ")
    resp = response(_post(port, ctx, "/validate", body(GPU))[1])
    assert resp["allowed"] is True
    resp = response(_post(port, ctx, "/guard", body(HELD, user="alice"))[1])
    assert resp["allowed"] is False and resp["status"]["code"] == 403
    assert response(_post(port, ctx, "/guard", body(GPU))[1])["allowed"] is True


def test_hostile_bodies_get_one_line_and_the_server_keeps_serving(
    served: tuple[int, AdmissionRoutes, ssl.SSLContext],
) -> None:
    port, _, ctx = served
    for data, code, text in [
        (b"{not json", 400, b"request body is not JSON"),
        (b"[" * 50_000, 400, b"request body is JSON nested too deeply"),
        (json.dumps({"kind": "Pod"}).encode(), 400, b"kind: expected AdmissionReview"),
        (b"x" * (MAX_BODY + 1), 413, b"over the limit"),
    ]:
        got, out = _post(port, ctx, "/validate", data)
        assert (got, out.count(b"\n")) == (code, 1) and text in out, (got, out)
        assert b"Traceback" not in out
    assert _post(port, ctx, "/nowhere", b"{}")[0] == 404
    assert _get(port, ctx, "/healthz") == (200, "ok\n")
    assert response(_post(port, ctx, "/mutate", body(GPU))[1])["allowed"] is True


def deep(obj: dict[str, Any], levels: int = 1_500, **kw: Any) -> bytes:
    """``body(obj)`` with the pod's (and an UPDATE's old pod's) managedFields ``levels``
    deep, as the API server sends a tenant's pod (it accepts and stores them)."""
    doc = review_doc(obj, **kw)
    text = json.dumps(doc)
    for key in ("object", "oldObject"):
        if doc["request"][key] is not None:
            text = text.replace(
                json.dumps(doc["request"][key]),
                with_deep_managed_fields(doc["request"][key], levels),
            )
    return text.encode()


def test_a_pod_with_deep_managed_fields_is_reviewed_like_any(
    served: tuple[int, AdmissionRoutes, ssl.SSLContext],
) -> None:
    """Issue 45: a tenant's pod whose managedFields nest 1,500 levels (the API server accepts
    it) is mutated, validated and guarded as any pod, not refused as a bad request."""
    port, _, ctx = served
    code, out = _post(port, ctx, "/mutate", deep(GPU))
    assert code == 200 and patch_of(response(out))[0]["value"] == "koord-scheduler"
    resp = response(_post(port, ctx, "/validate", deep(BAD))[1])
    assert resp["allowed"] is False and resp["status"]["message"].startswith("spec.containers[0]")
    resp = response(
        _post(port, ctx, "/guard", deep(HELD, operation="UPDATE", old=GPU, user="alice"))[1]
    )
    assert resp["allowed"] is False and resp["status"]["code"] == 403


def test_a_body_without_length_is_refused(
    served: tuple[int, AdmissionRoutes, ssl.SSLContext],
) -> None:
    port, _, ctx = served
    for head in (b"Transfer-Encoding: chunked\r\n", b""):
        with (
            socket.create_connection(("127.0.0.1", port)) as raw,
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n")
            status = tls.recv(4096).split(b"\r\n", 1)[0]
        assert status == b"HTTP/1.1 411 Length Required", (head, status)


def test_metrics_count_by_webhook_operation_and_verdict(
    served: tuple[int, AdmissionRoutes, ssl.SSLContext],
) -> None:
    port, _, ctx = served
    _post(port, ctx, "/mutate", body(GPU))
    _post(port, ctx, "/mutate", body(pod()))
    _post(port, ctx, "/validate", body(BAD))
    _post(port, ctx, "/guard", body(HELD, operation="UPDATE", old=pod()))
    _post(port, ctx, "/guard", b"nope")
    code, text = _get(port, ctx, "/metrics")
    assert code == 200
    for series in [
        'koord_webhook_requests_total{operation="CREATE",verdict="patched",webhook="mutate"} 1.0',
        'koord_webhook_requests_total{operation="CREATE",verdict="allowed",webhook="mutate"} 1.0',
        'koord_webhook_requests_total{operation="CREATE",verdict="denied",webhook="validate"} 1.0',
        'koord_webhook_requests_total{operation="UPDATE",verdict="denied",webhook="guard"} 1.0',
        'koord_webhook_requests_total{operation="unknown",verdict="invalid",webhook="guard"} 1.0',
        'koord_webhook_request_duration_seconds_count{operation="CREATE",verdict="patched",'
        'webhook="mutate"} 1.0',
    ]:
        assert series in text, series
    assert "_created" not in text  # as every other component exposes its metrics


def test_concurrent_reviews_all_answer(
    served: tuple[int, AdmissionRoutes, ssl.SSLContext],
) -> None:
    port, routes, ctx = served
    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(lambda _: _post(port, ctx, "/mutate", body(GPU))[0], range(64)))
    assert codes == [200] * 64
    assert routes.in_flight == 0 and routes.drain(0.1)


def test_drain_waits_for_a_review_in_flight() -> None:
    gate, entered = threading.Event(), threading.Event()

    class Slow(WebhookPolicy):
        def asks_for_gpu(self, spec: object) -> bool:  # type: ignore[override]
            entered.set()
            gate.wait(5)
            return False

    routes = AdmissionRoutes(Slow(), WebhookMetrics())
    worker = threading.Thread(target=routes.routes()["/mutate"], args=(body(GPU),))
    worker.start()
    assert entered.wait(5)
    assert routes.in_flight == 1 and not routes.drain(0.05)
    gate.set()
    assert routes.drain(5) and routes.in_flight == 0
    worker.join(5)
