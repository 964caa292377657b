"""The extender's HTTP server over real loopback HTTP: kube-scheduler's paths and gpushare's."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from scheduler.extender.server import ExtenderServer
from tests.adversarial_cluster import AdversarialCluster
from tests.builders import make_pod
from tests.deepjson import with_deep_managed_fields
from tests.unit.extender.harness import Running, gpu_cluster, running

OBSERVED: list[tuple[str, int]] = []


@contextmanager
def serving(v120_lagging: bool = False) -> Iterator[tuple[Running, str]]:
    """``v120_lagging``: the core reaches the cluster through an ``AdversarialCluster`` that
    binds by name (a v1.20 API server) and delivers no change made after the start."""
    cluster = gpu_cluster({"n": ["16Gi", "16Gi"]})
    port = None
    if v120_lagging:
        port = AdversarialCluster(cluster)
        port.ignore_binding_uid = True
    with running(cluster, port=port) as r:
        server = ExtenderServer(
            "127.0.0.1",
            0,
            r.engine,
            version="9.9.9",
            view=lambda: SimpleNamespace(
                nodes=dict(cluster.nodes),
                devices=list(cluster.devices.values()),
                pods=list(cluster.pods.values()),
            ),
            observe=lambda verb, code, s: OBSERVED.append((verb, code)),
        )
        server.start()
        try:
            yield r, f"http://127.0.0.1:{server.port}"
        finally:
            server.stop()


def call(url: str, body: Any = None, raw: bytes | None = None) -> tuple[int, bytes]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_gpushare_paths_filter_bind_and_inspect() -> None:
    with serving() as (r, base):
        pod = make_pod("p").req(cpu="1").limit({"aliyun.com/gpu-mem": "3"}).obj()
        stored = r.cluster.apply_pod(pod)
        code, body = call(f"{base}/gpushare-scheduler/filter", {"pod": pod, "nodenames": ["n"]})
        assert code == 200 and json.loads(body)["nodenames"] == ["n"]
        args = {"PodName": "p", "PodNamespace": "default", "PodUID": stored.uid, "Node": "n"}
        code, body = call(f"{base}/gpushare-scheduler/bind", args)
        assert (code, json.loads(body)) == (200, {"Error": ""})
        code, body = call(f"{base}/gpushare-scheduler/bind", args)
        assert code == 500 and "already" in json.loads(body)["Error"]
        code, body = call(f"{base}/gpushare-scheduler/inspect/n")
        node = json.loads(body)["nodes"][0]
        assert (node["name"], node["totalGPU"], node["usedGPU"]) == ("n", 32, 3)
        assert any(
            p == {"name": "p", "namespace": "default", "usedGPU": 3}
            for d in node["devs"]
            for p in d["pods"]
        )
        assert call(f"{base}/version") == (200, b"9.9.9")


def test_root_paths_prioritize_and_a_standby() -> None:
    with serving() as (r, base):
        pod = make_pod("q").req(cpu="1").obj()
        r.cluster.apply_pod(pod)
        code, body = call(f"{base}/prioritize", {"pod": pod, "nodenames": ["n"]})
        assert code == 200 and json.loads(body) == [{"host": "n", "score": 10}]
        r.leading[0] = False
        code, body = call(f"{base}/filter", {"pod": pod, "nodenames": ["n"]})
        assert code == 200 and "not the leader" in json.loads(body)["error"]
        code, _ = call(f"{base}/prioritize", {"pod": pod, "nodenames": ["n"]})
        assert code == 503


def test_bad_requests_get_one_line_and_the_server_keeps_serving() -> None:
    with serving() as (_, base):
        code, body = call(f"{base}/filter", raw=b"{not json")
        assert code == 400 and body.decode().startswith("request body is not JSON")
        assert call(f"{base}/nothing", {})[0] == 404
        assert call(f"{base}/filter")[0] == 405
        assert call(f"{base}/version")[0] == 200
    assert ("filter", 400) in OBSERVED


def test_a_bind_for_a_uid_re_created_since_its_filter_answers_an_error() -> None:
    """The bind names the UID kube-scheduler filtered; the pod of that name is another one now
    (our informer has not seen it yet). Binding would land on the successor: an error, no
    write."""
    with serving(v120_lagging=True) as (r, base):
        pod = make_pod("p").uid("old").req(cpu="1").limit({"aliyun.com/gpu-mem": "3"}).obj()
        r.cluster.apply_pod(pod)
        code, body = call(f"{base}/gpushare-scheduler/filter", {"pod": pod, "nodenames": ["n"]})
        assert code == 200 and json.loads(body)["nodenames"] == ["n"]
        r.cluster.delete_pod("default/p")
        r.cluster.apply_pod(make_pod("p").uid("new").req(cpu="1").obj())
        args = {"PodName": "p", "PodNamespace": "default", "PodUID": "old", "Node": "n"}
        code, body = call(f"{base}/gpushare-scheduler/bind", args)
    assert (code, json.loads(body)) == (
        500,
        {"Error": "pod default/p was re-created (uid new, not old): not bound"},
    )
    assert r.cluster.binds == 0
    assert not r.cluster.pods["default/p"].node_name


def test_json_nested_too_deep_is_a_400_not_a_500() -> None:
    with serving() as (_, url):
        deep = b"[" * 100_000 + b"]" * 100_000
        code, body = call(url + "/filter", raw=deep)
        assert code == 400, body
        assert b"nested too deeply" in body


def test_a_pod_with_deep_managed_fields_is_filtered_like_any() -> None:
    """Issue 45: kube-scheduler sends the pod as the API server serves it; a tenant's pod
    whose managedFields nest 1,500 levels is filtered and prioritized, not refused."""
    with serving() as (r, base):
        pod = make_pod("deep").req(cpu="1").limit({"aliyun.com/gpu-mem": "3"}).obj()
        r.cluster.apply_pod(pod)
        pod_text = with_deep_managed_fields(pod, 1_500)
        for path in ("/gpushare-scheduler/filter", "/filter"):
            code, body = call(base + path, raw=b'{"pod":%s,"nodenames":["n"]}' % pod_text.encode())
            assert code == 200 and json.loads(body)["nodenames"] == ["n"], body
        nodes = '{"items":[' + with_deep_managed_fields(r.cluster.nodes["n"].raw, 1_500) + "]}"
        code, body = call(
            base + "/prioritize", raw=f'{{"pod":{pod_text},"nodes":{nodes}}}'.encode()
        )
        assert code == 200 and json.loads(body) == [{"host": "n", "score": 10}], body


def test_many_concurrent_clients_are_all_answered() -> None:
    """kube-scheduler sends filter/bind from many goroutines at once: 64 clients connecting
    together must all be answered (a listen backlog of 5 reset 37 of 64 connections)."""
    import socket
    import threading

    with serving() as (_, url):
        port = int(url.rsplit(":", 1)[1])
        start = threading.Barrier(64)
        answers: list[bytes] = []
        failures: list[str] = []

        def client() -> None:
            try:
                start.wait(10)
                with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
                    s.sendall(b"GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    data = b""
                    while chunk := s.recv(4096):
                        data += chunk
                answers.append(data)
            except OSError as exc:
                failures.append(repr(exc))

        threads = [threading.Thread(target=client) for _ in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not failures, failures[:5]
        assert len(answers) == 64 and all(a.startswith(b"HTTP/1.1 200") for a in answers)
