"""scheduler.kube.cluster: the Cluster port's writes (bind, condition, events) and its caches."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from apis.core import Pod, decode_pod
from scheduler.framework.events import Change
from scheduler.framework.interfaces import BindError
from scheduler.kube.cluster import (
    DEVICES_PATH,
    FENCED_WRITE_TIMEOUT,
    NODES_PATH,
    PODS_PATH,
    KubeCluster,
    bind_permission_problem,
    device_spec,
    fetch_view,
    node_spec,
    pdb_spec,
    pod_spec,
)
from scheduler.kube.informer import Informer
from scheduler.kube.ratelimit import Backoff
from scheduler.kube.rest import ApiError, RestClient, TransportError
from tests.unit.kube.kube_fakes import (
    FakeStream,
    FakeTransport,
    json_response,
    object_list,
    status_response,
)

POD_PATH = "/api/v1/namespaces/ns/pods/p"


def raw_pod(conditions: list[dict[str, Any]] | None = None, node: str = "") -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "3"},
        "spec": {"schedulerName": "koord-scheduler", "nodeName": node},
        "status": {"phase": "Pending", "conditions": conditions or []},
    }


def make_cluster(t: FakeTransport, bind_mode: str = "binding") -> KubeCluster:
    rest = RestClient(t)

    def informer(spec: Any) -> Informer:
        return Informer(rest, spec, backoff=Backoff(0.01, 0.02, rng=random.Random(0)))

    return KubeCluster(
        rest,
        None,
        bind_mode=bind_mode,
        informers=(informer(node_spec()), informer(device_spec()), informer(pod_spec())),
    )


@pytest.fixture
def transport() -> FakeTransport:
    t = FakeTransport()
    t.on(
        "GET", NODES_PATH, object_list([{"metadata": {"name": "n1", "resourceVersion": "1"}}], "3")
    )
    t.on("GET", DEVICES_PATH, object_list([], "3"))
    t.on("GET", PODS_PATH, object_list([raw_pod()], "3"))
    return t


@pytest.fixture
def cluster(transport: FakeTransport) -> Iterator[KubeCluster]:
    c = make_cluster(transport)
    c.start()
    assert c.wait_for_sync(5)
    yield c
    c.stop()


def pod() -> Pod:
    return decode_pod(raw_pod())


def test_bind_is_one_binding_post_carrying_the_annotations(
    transport: FakeTransport, cluster: KubeCluster
) -> None:
    transport.on("POST", f"{POD_PATH}/binding", json_response({"status": "Success"}, 201))
    cluster.bind(pod(), "n1", {"scheduling.koordinator.sh/device-allocated": '{"gpu":[]}'})
    (req,) = transport.sent("POST", f"{POD_PATH}/binding")
    assert req.body == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "annotations": {"scheduling.koordinator.sh/device-allocated": '{"gpu":[]}'},
        },
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
    }
    assert not transport.sent("PATCH", POD_PATH)
    assert cluster.binds == 1


def test_patch_mode_patches_the_annotation_then_binds(transport: FakeTransport) -> None:
    transport.on("PATCH", POD_PATH, json_response({}))
    transport.on("POST", f"{POD_PATH}/binding", json_response({}, 201))
    cluster = make_cluster(transport, bind_mode="patch")
    cluster.bind(pod(), "n1", {"a": "b"})
    (patch,) = transport.sent("PATCH", POD_PATH)
    assert patch.body == {"metadata": {"annotations": {"a": "b"}, "uid": "u1"}}
    assert patch.headers["Content-Type"] == "application/merge-patch+json"
    (binding,) = transport.sent("POST", f"{POD_PATH}/binding")
    assert "annotations" not in binding.body["metadata"]
    methods = [r.method for r in transport.requests]
    assert methods.index("PATCH") < methods.index("POST")


@pytest.mark.parametrize(
    ("answer", "gone", "uncertain"),
    [
        (status_response(409, "Conflict", "pod p is already assigned to node n2"), False, True),
        (status_response(404, "NotFound", 'pods "p" not found'), True, False),
        (status_response(500, "InternalError", "etcd timeout"), False, True),
        (status_response(429, "TooManyRequests", "slow down"), False, False),
        (status_response(403, "Forbidden", "no"), False, False),
        (TransportError("read timed out"), False, True),
    ],
    ids=["409", "404", "500", "429", "403", "transport"],
)
def test_bind_failures(transport: FakeTransport, answer: Any, gone: bool, uncertain: bool) -> None:
    """404 is certain (gone); 409, 5xx and a lost answer may hide an applied write: the
    scheduler reads the pod back; 403/429 certainly did nothing: reported, backed off."""
    transport.on("POST", f"{POD_PATH}/binding", answer)
    cluster = make_cluster(transport)
    with pytest.raises(BindError) as exc:
        cluster.bind(pod(), "n1", {})
    assert (exc.value.gone, exc.value.uncertain, exc.value.fenced) == (gone, uncertain, False)
    assert "ns/p" in str(exc.value)


class FenceFlippingLimiter:
    """A rate limiter whose wait outlasts the lease: the fence closes while we queue."""

    def __init__(self, fence: list[bool]) -> None:
        self.fence = fence
        self.acquired = 0

    def acquire(self) -> None:
        self.acquired += 1
        self.fence[0] = False


@pytest.mark.parametrize("bind_mode", ["binding", "patch"])
def test_a_closed_fence_sends_nothing(transport: FakeTransport, bind_mode: str) -> None:
    """The fence is checked after the rate limiter's wait, immediately before the write."""
    fence = [True]
    limiter = FenceFlippingLimiter(fence)
    rest = RestClient(transport, limiter=limiter)  # type: ignore[arg-type]
    cluster = KubeCluster(rest, None, bind_mode=bind_mode, fence=lambda: fence[0])
    with pytest.raises(BindError) as exc:
        cluster.bind(pod(), "n1", {"a": "b"})
    assert exc.value.fenced and not exc.value.uncertain
    assert limiter.acquired == 1
    assert not [r for r in transport.requests if r.method in ("POST", "PATCH")]


def test_an_open_fence_lets_the_bind_through(transport: FakeTransport) -> None:
    transport.on("POST", f"{POD_PATH}/binding", json_response({}, 201))
    cluster = KubeCluster(RestClient(transport), None, fence=lambda: True)
    cluster.bind(pod(), "n1", {})
    assert len(transport.sent("POST", f"{POD_PATH}/binding")) == 1


def test_the_quorum_list_asks_for_one_pod_without_a_resource_version(
    transport: FakeTransport,
) -> None:
    """No resourceVersion: a consistent read from etcd (never the watch cache); limit=1 keeps
    it cheap: a paginated list still carries the list's (etcd's current) resourceVersion."""
    transport.replace("GET", PODS_PATH, object_list([raw_pod()], rv="4711", cont="next"))
    assert KubeCluster(RestClient(transport), None).quorum_pods_rv() == "4711"
    (sent,) = transport.sent("GET", PODS_PATH)
    assert sent.query == {"limit": "1"}


@pytest.mark.parametrize(
    ("write", "path"),
    [
        (lambda c: c.bind(pod(), "n1", {}), f"{POD_PATH}/binding"),
        (lambda c: c.delete_pod(pod()), POD_PATH),
        (lambda c: c.annotate_pod(pod(), {"a": "b"}), POD_PATH),
        (lambda c: c.set_nominated_node(pod(), "n1"), f"{POD_PATH}/status"),
    ],
    ids=["bind", "delete", "annotate", "nominate"],
)
def test_fenced_writes_have_a_finite_timeout_of_their_own(
    transport: FakeTransport, write: Any, path: str
) -> None:
    """The bound a new leader waits out after taking over an expired lease (leader.py)."""
    for method in ("POST", "DELETE", "PATCH"):
        transport.on(method, path, json_response({}, 200))
    rest = RestClient(transport, timeout=60.0)
    write(KubeCluster(rest, None, fence=lambda: True, write_timeout=7.5))
    assert [r.timeout for r in transport.requests] == [7.5]


def test_the_default_write_timeout_is_the_documented_one() -> None:
    assert KubeCluster(RestClient(FakeTransport()), None).write_timeout == FENCED_WRITE_TIMEOUT
    assert FENCED_WRITE_TIMEOUT == 10.0  # docs/failure-model.md, leader.py state this bound


def test_lookup_pod_reads_the_api_server(transport: FakeTransport) -> None:
    transport.on("GET", POD_PATH, json_response(raw_pod(node="n1")))
    transport.on("GET", POD_PATH, status_response(404, "NotFound", "gone"))
    cluster = make_cluster(transport)
    found = cluster.lookup_pod(pod())
    assert found is not None and (found.uid, found.node_name) == ("u1", "n1")
    assert cluster.lookup_pod(pod()) is None


SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


@pytest.mark.parametrize(
    ("bind_mode", "answers", "problem"),
    [
        pytest.param(
            "patch",
            [{"status": {"allowed": False}}],
            "--bind-mode patch needs permission to patch pods; grant it (see "
            "config/scheduler/rbac.yaml) or use --bind-mode binding",
            id="patch-without-patch",
        ),
        pytest.param(
            "patch",
            [{"status": {"allowed": True}}, {"status": {"allowed": True}}],
            None,
            id="patch-allowed",
        ),
        pytest.param(
            "binding",
            [{"status": {"allowed": False}}],
            "--bind-mode binding needs permission to create pods/binding; apply "
            "config/scheduler/rbac.yaml",
            id="binding-without-binding",
        ),
        pytest.param("binding", [], None, id="review-unavailable-is-not-fatal"),
    ],
)
def test_bind_permission_problem(
    transport: FakeTransport, bind_mode: str, answers: list[Any], problem: str | None
) -> None:
    if answers:
        transport.on("POST", SSAR, *[json_response(a, 201) for a in answers])
    else:
        transport.on("POST", SSAR, status_response(403, "Forbidden", "no reviews"))
    assert bind_permission_problem(RestClient(transport), bind_mode) == problem
    first = transport.sent("POST", SSAR)[0].body["spec"]["resourceAttributes"]
    assert first["verb"] == ("patch" if bind_mode == "patch" else "create")


def test_condition_patch_is_conditional_on_the_checked_version(
    transport: FakeTransport, cluster: KubeCluster
) -> None:
    """The failure report carries the resourceVersion of the unbound record it was checked
    against; a 409 (the pod changed — e.g. was bound — since) drops it without an error."""
    transport.on(
        "PATCH", f"{POD_PATH}/status", status_response(409, "Conflict", "object was modified")
    )
    cluster.set_pod_scheduled_condition(pod(), "False", "Unschedulable", "0/1 nodes")
    (req,) = transport.sent("PATCH", f"{POD_PATH}/status")
    assert req.body["metadata"] == {"resourceVersion": "3"}


def test_condition_is_patched_once_per_change(
    transport: FakeTransport, cluster: KubeCluster
) -> None:
    transport.on("PATCH", f"{POD_PATH}/status", json_response({}))
    cluster.set_pod_scheduled_condition(pod(), "False", "Unschedulable", "0/1 nodes")
    (req,) = transport.sent("PATCH", f"{POD_PATH}/status")
    assert req.headers["Content-Type"] == "application/strategic-merge-patch+json"
    (cond,) = req.body["status"]["conditions"]
    assert cond["type"] == "PodScheduled" and cond["status"] == "False"
    assert cond["reason"] == "Unschedulable" and cond["message"] == "0/1 nodes"
    assert cond["lastProbeTime"] is None and cond["lastTransitionTime"]


def test_condition_already_shown_is_not_written_again(transport: FakeTransport) -> None:
    shown = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/1 nodes",
        "lastTransitionTime": "2024-01-01T00:00:00Z",
    }
    transport.replace("GET", PODS_PATH, object_list([raw_pod([shown])], "3"))
    transport.on("PATCH", f"{POD_PATH}/status", json_response({}))
    cluster = make_cluster(transport)
    cluster.start()
    try:
        assert cluster.wait_for_sync(5)
        cluster.set_pod_scheduled_condition(pod(), "False", "Unschedulable", "0/1 nodes")
        assert not transport.sent("PATCH", f"{POD_PATH}/status")
        cluster.set_pod_scheduled_condition(pod(), "False", "Unschedulable", "0/2 nodes")
        (req,) = transport.sent("PATCH", f"{POD_PATH}/status")
        # Same status: the transition time stays.
        assert req.body["status"]["conditions"][0]["lastTransitionTime"] == "2024-01-01T00:00:00Z"
    finally:
        cluster.stop()


def test_no_condition_for_pods_gone_recreated_or_bound(
    transport: FakeTransport, cluster: KubeCluster
) -> None:
    import dataclasses

    cluster.set_pod_scheduled_condition(
        dataclasses.replace(pod(), uid="other"), "False", "Unschedulable", "x"
    )
    cluster.set_pod_scheduled_condition(
        dataclasses.replace(pod(), name="absent"), "False", "Unschedulable", "x"
    )
    assert not [r for r in transport.requests if r.method == "PATCH"]


def test_subscribe_delivers_nodes_devices_then_pods(cluster: KubeCluster) -> None:
    got: list[Change] = []
    cluster.subscribe(got.append)
    assert [c.kind for c in got] == ["Node", "Pod"]
    assert cluster.synced() and cluster.unhealthy() == []
    view = cluster.view()
    assert list(view.nodes) == ["n1"] and [p.key for p in view.pods] == ["ns/p"]


def test_fetch_view_lists_everything_once(transport: FakeTransport) -> None:
    view = fetch_view(RestClient(transport))
    assert list(view.nodes) == ["n1"] and view.devices == [] and len(view.pods) == 1
    assert not transport.watches


def test_record_event_goes_to_the_recorder(transport: FakeTransport) -> None:
    class Recorder:
        def __init__(self) -> None:
            self.got: list[tuple[str, str, str, str]] = []

        def record(self, p: Pod, t: str, r: str, m: str) -> None:
            self.got.append((p.key, t, r, m))

    rec = Recorder()
    cluster = KubeCluster(RestClient(transport), rec)  # type: ignore[arg-type]
    cluster.record_event(pod(), "Normal", "Scheduled", "ok")
    assert rec.got == [("ns/p", "Normal", "Scheduled", "ok")]


def test_bad_bind_mode() -> None:
    with pytest.raises(ValueError):
        KubeCluster(RestClient(FakeTransport()), None, bind_mode="nope")


# -- preemption's writes ------------------------------------------------------------------------


def test_a_victim_is_deleted_with_its_uid_as_precondition(transport: FakeTransport) -> None:
    transport.on("DELETE", POD_PATH, json_response({}, 200))
    KubeCluster(RestClient(transport), None, fence=lambda: True).delete_pod(pod())
    (sent,) = transport.sent("DELETE", POD_PATH)
    assert sent.body["preconditions"] == {"uid": "u1"}


@pytest.mark.parametrize("status", [404, 409])
def test_a_victim_already_gone_or_recreated_is_not_an_error(
    transport: FakeTransport, status: int
) -> None:
    transport.on("DELETE", POD_PATH, status_response(status, "Conflict", "uid mismatch"))
    KubeCluster(RestClient(transport), None).delete_pod(pod())


def test_a_victim_delete_is_fenced(transport: FakeTransport) -> None:
    """Only the lease holder evicts: a closed fence sends nothing."""
    cluster = KubeCluster(RestClient(transport), None, fence=lambda: False)
    with pytest.raises(BindError) as exc:
        cluster.delete_pod(pod())
    assert exc.value.fenced
    assert not transport.sent("DELETE", POD_PATH)


def test_a_failed_victim_delete_raises(transport: FakeTransport) -> None:
    transport.on("DELETE", POD_PATH, status_response(403, "Forbidden", "no"))
    with pytest.raises(ApiError):
        KubeCluster(RestClient(transport), None).delete_pod(pod())


@pytest.mark.parametrize(("node", "value"), [("n1", "n1"), ("", None)])
def test_the_nomination_is_a_status_patch(
    transport: FakeTransport, node: str, value: str | None
) -> None:
    transport.on("PATCH", f"{POD_PATH}/status", json_response({}, 200))
    KubeCluster(RestClient(transport), None).set_nominated_node(pod(), node)
    (sent,) = transport.sent("PATCH", f"{POD_PATH}/status")
    assert sent.body == {"metadata": {"uid": "u1"}, "status": {"nominatedNodeName": value}}


@pytest.mark.parametrize("node", ["n1", ""], ids=["nominate", "clear"])
def test_a_nomination_is_fenced(transport: FakeTransport, node: str) -> None:
    """A deposed replica's nominatedNodeName would make the next leader keep room for it: a
    closed fence (checked after the rate limiter's wait) sends nothing, and the caller's
    failure report is not broken by it (no exception)."""
    transport.on("PATCH", f"{POD_PATH}/status", json_response({}, 200))
    fence = [True]
    limiter = FenceFlippingLimiter(fence)
    rest = RestClient(transport, limiter=limiter)  # type: ignore[arg-type]
    KubeCluster(rest, None, fence=lambda: fence[0]).set_nominated_node(pod(), node)
    assert limiter.acquired == 1
    assert not transport.sent("PATCH", f"{POD_PATH}/status")


def test_an_open_fence_lets_the_nomination_through(transport: FakeTransport) -> None:
    transport.on("PATCH", f"{POD_PATH}/status", json_response({}, 200))
    KubeCluster(RestClient(transport), None, fence=lambda: True).set_nominated_node(pod(), "n1")
    assert len(transport.sent("PATCH", f"{POD_PATH}/status")) == 1


V1_PDBS = "/apis/policy/v1/poddisruptionbudgets"
V1BETA1_PDBS = "/apis/policy/v1beta1/poddisruptionbudgets"
NOT_FOUND = status_response(404, "NotFound", "the server could not find the requested resource")


def _pdb_informer(transport: FakeTransport) -> Informer:
    """The informer ``run`` watches PDBs with (KubeCluster's own), with a fast retry."""
    default = KubeCluster(RestClient(transport), None).pdbs
    assert default is not None
    spec = pdb_spec()
    assert (default.spec.path, default.spec.alternatives, default.spec.optional) == (
        spec.path,
        spec.alternatives,
        spec.optional,
    )
    return Informer(RestClient(transport), pdb_spec(), backoff=Backoff(0.01, 0.02))


@pytest.mark.parametrize(
    ("served", "path"),
    [
        pytest.param({V1_PDBS}, V1_PDBS, id="v1.25+-serves-v1-only"),
        pytest.param({V1_PDBS, V1BETA1_PDBS}, V1_PDBS, id="v1.21-serves-both"),
        pytest.param({V1BETA1_PDBS}, V1BETA1_PDBS, id="v1.20-serves-v1beta1-only"),
    ],
)
def test_pdbs_are_watched_in_the_version_served(served: set[str], path: str) -> None:
    transport = FakeTransport()
    for candidate in (V1_PDBS, V1BETA1_PDBS):
        answer = object_list([], rv="7") if candidate in served else NOT_FOUND
        transport.on("GET", candidate, answer)
        transport.on_watch(candidate, FakeStream([], end=False))
    pdbs = _pdb_informer(transport)
    pdbs.start()
    try:
        assert pdbs.wait_for_sync(5)
        assert pdbs.spec.path == path
    finally:
        pdbs.stop()


def test_a_failed_first_call_never_picks_a_version_the_server_does_not_serve() -> None:
    """Kubernetes >= 1.25 serves PDBs only as policy/v1. A 503 on the first call (an API server
    starting) must be retried, not read as "v1 is not served": v1beta1 would never sync and
    the scheduler would stay not ready for ever."""
    transport = FakeTransport()
    transport.on(
        "GET",
        V1_PDBS,
        status_response(503, "ServiceUnavailable", "the server is currently unable to handle it"),
        object_list([], rv="7"),
    )
    transport.on("GET", "/apis/policy/v1", status_response(503, "ServiceUnavailable", "busy"))
    transport.on("GET", V1BETA1_PDBS, NOT_FOUND)
    transport.on_watch(V1_PDBS, FakeStream([], end=False))
    pdbs = _pdb_informer(transport)
    pdbs.start()
    try:
        assert pdbs.wait_for_sync(5), pdbs.last_error
        assert pdbs.spec.path == V1_PDBS
    finally:
        pdbs.stop()


def test_a_server_without_pdbs_leaves_preemption_without_them() -> None:
    """Neither version served (a stripped-down API server): the PDB informer is empty, synced
    and healthy (preemption sees no budget) instead of keeping the scheduler not ready."""
    transport = FakeTransport()
    transport.on("GET", "/apis/policy/v1", NOT_FOUND)
    for candidate in (V1_PDBS, V1BETA1_PDBS):
        transport.on("GET", candidate, NOT_FOUND)
    pdbs = _pdb_informer(transport)
    pdbs.start()
    try:
        assert pdbs.wait_for_sync(5)
        assert pdbs.healthy and pdbs.items() == []
    finally:
        pdbs.stop()


def test_the_pod_cache_keeps_a_slim_raw() -> None:
    """The informer keeps only the PodScheduled condition of a pod's object (memory at tens of
    thousands of pods); ``inspect``/``explain`` lists get full records."""
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "m"}
    obj = raw_pod([cond, {"type": "Ready", "status": "False"}])
    obj["metadata"]["annotations"] = {"a": "b"}
    slim = pod_spec().decode(obj)
    full = pod_spec(full=True).decode(obj)
    assert slim.raw == {"status": {"conditions": [cond]}}
    assert full.raw == obj
    assert dataclasses.replace(slim, raw=obj) == full  # only raw differs


# -- a timed-out gang's mark --------------------------------------------------------------------


def test_the_timeout_mark_is_a_merge_patch_with_the_uid_as_precondition(
    transport: FakeTransport,
) -> None:
    transport.on("PATCH", POD_PATH, json_response({}, 200))
    mark = {"gang.scheduling.koordinator.sh/timeout": "true"}
    KubeCluster(RestClient(transport), None, fence=lambda: True).annotate_pod(pod(), mark)
    (sent,) = transport.sent("PATCH", POD_PATH)
    assert sent.body == {"metadata": {"annotations": mark, "uid": "u1"}}
    assert sent.headers["Content-Type"] == "application/merge-patch+json"


@pytest.mark.parametrize("status", [404, 409], ids=["gone", "re-created"])
def test_the_mark_of_a_gone_pod_is_dropped(transport: FakeTransport, status: int) -> None:
    transport.on("PATCH", POD_PATH, status_response(status, "Conflict", "uid mismatch"))
    KubeCluster(RestClient(transport), None).annotate_pod(pod(), {"a": "b"})


def test_the_mark_is_fenced(transport: FakeTransport) -> None:
    """Only the lease holder marks pods: a closed fence sends nothing."""
    cluster = KubeCluster(RestClient(transport), None, fence=lambda: False)
    with pytest.raises(BindError) as exc:
        cluster.annotate_pod(pod(), {"a": "b"})
    assert exc.value.fenced
    assert not transport.sent("PATCH", POD_PATH)


def test_pod_groups_are_watched_by_default() -> None:
    cluster = KubeCluster(RestClient(FakeTransport()), None)
    assert cluster.pod_groups is not None
    assert cluster.pod_groups.spec.path == "/apis/scheduling.sigs.k8s.io/v1alpha1/podgroups"
    assert cluster.pod_groups.spec.optional
    assert cluster.pod_groups in cluster.informers


def test_readiness_says_why_a_cache_is_not_synced() -> None:
    """An informer that cannot list says why on /readyz (not only its kind), so an operator
    sees "PodDisruptionBudget (503 ...)" instead of a bare name that never changes."""
    transport = FakeTransport()
    transport.on("GET", V1_PDBS, status_response(503, "ServiceUnavailable", "etcd is not ready"))
    rest = RestClient(transport)
    pdbs = Informer(rest, pdb_spec(), backoff=Backoff(0.01, 0.02))
    others = (
        Informer(rest, node_spec()),
        Informer(rest, device_spec()),
        Informer(rest, pod_spec()),
    )
    cluster = KubeCluster(rest, None, informers=others, pdbs=pdbs, pod_groups=None)
    assert "Node" in cluster.not_synced()  # not started: the kind alone
    pdbs.start()
    try:
        deadline = time.monotonic() + 5
        while "503" not in " ".join(cluster.not_synced()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "PodDisruptionBudget (503 ServiceUnavailable: etcd is not ready)" in (
            cluster.not_synced()
        )
    finally:
        pdbs.stop()


def test_the_default_informers_include_gpushare_unhealthy_gpu_configmaps() -> None:
    cluster = KubeCluster(RestClient(FakeTransport()), None)
    assert cluster.unhealthy_gpus is not None
    assert cluster.unhealthy_gpus.spec.path == "/api/v1/namespaces/kube-system/configmaps"
    assert [i.kind for i in cluster.informers][-1] == "UnhealthyGPUs"


class _StalledTransport(FakeTransport):
    """An API server that accepts every request and never answers (until ``release``)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.waiting = threading.Semaphore(0)

    def request(self, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        self.waiting.release()
        self.release.wait(60)
        raise TransportError(f"{method} {path}: read timed out")


def test_stop_waits_for_all_informers_against_one_deadline() -> None:
    """Found by the chaos soak (seed 2117134558): a SIGTERM while the API server restarted left
    every informer in a LIST; ``stop`` joined them one after another, 5 s each, and the
    scheduler overran kubelet's 30 s grace period. Now they are joined against one deadline."""
    t = _StalledTransport()
    cluster = KubeCluster(RestClient(t), None)
    assert len(cluster.informers) == 6
    cluster.start()
    try:
        for _ in cluster.informers:  # every informer is inside its LIST
            assert t.waiting.acquire(timeout=10)
        start = time.monotonic()
        cluster.stop(timeout=2.0)
        # One deadline: about 2 s. One per informer: 12 s. The bound sits between them with
        # room for a loaded machine (the threads stopping must get the CPU to say so).
        assert time.monotonic() - start < 6.0
    finally:
        t.release.set()


# -- what 1.37's kube-scheduler writes beside the delete and the condition ----------------------


def test_a_victim_is_marked_disruption_target_before_its_delete(transport: FakeTransport) -> None:
    """As kube-scheduler (PodDisruptionConditions): DisruptionTarget=True, reason
    PreemptionByScheduler, on exactly this incarnation (its UID a precondition), then the
    delete; a Job's podFailurePolicy reads it."""
    transport.on("PATCH", f"{POD_PATH}/status", json_response({}))
    transport.on("DELETE", POD_PATH, json_response({}, 200))
    cluster = KubeCluster(RestClient(transport), None, fence=lambda: True)
    preemptor = dataclasses.replace(pod(), name="big", uid="u9", scheduler_name="koord-scheduler")
    cluster.delete_pod(pod(), preemptor=preemptor)
    (mark,) = transport.sent("PATCH", f"{POD_PATH}/status")
    assert mark.headers["Content-Type"] == "application/strategic-merge-patch+json"
    assert mark.body["metadata"] == {"uid": "u1"}
    (cond,) = mark.body["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        "DisruptionTarget",
        "True",
        "PreemptionByScheduler",
    )
    assert cond["message"] == "koord-scheduler: preempting to accommodate a higher priority pod"
    assert cond["lastTransitionTime"]
    assert "observedGeneration" not in cond  # a pod without metadata.generation (1.20)
    writes = [r.method for r in transport.requests if r.method in ("PATCH", "DELETE")]
    assert writes == ["PATCH", "DELETE"]


@pytest.mark.parametrize("status", [404, 409])
def test_a_victim_gone_before_its_mark_is_not_deleted(
    transport: FakeTransport, status: int
) -> None:
    transport.on("PATCH", f"{POD_PATH}/status", status_response(status, "NotFound", "gone"))
    cluster = KubeCluster(RestClient(transport), None, fence=lambda: True)
    cluster.delete_pod(pod(), preemptor=pod())
    assert not transport.sent("DELETE", POD_PATH)


def test_a_failed_mark_stops_the_delete(transport: FakeTransport) -> None:
    transport.on("PATCH", f"{POD_PATH}/status", status_response(403, "Forbidden", "no"))
    cluster = KubeCluster(RestClient(transport), None, fence=lambda: True)
    with pytest.raises(ApiError):
        cluster.delete_pod(pod(), preemptor=pod())
    assert not transport.sent("DELETE", POD_PATH)


def test_a_fenced_replica_neither_marks_nor_deletes(transport: FakeTransport) -> None:
    cluster = KubeCluster(RestClient(transport), None, fence=lambda: False)
    with pytest.raises(BindError):
        cluster.delete_pod(pod(), preemptor=pod())
    assert not transport.sent("PATCH", f"{POD_PATH}/status")
    assert not transport.sent("DELETE", POD_PATH)


@pytest.mark.parametrize(("generation", "expected"), [(3, {"observedGeneration": 3}), (None, {})])
def test_conditions_carry_the_pods_generation_where_the_server_keeps_one(
    transport: FakeTransport, generation: int | None, expected: dict[str, int]
) -> None:
    """PodObservedGenerationTracking (GA since 1.35): kube-scheduler's conditions carry the
    pod's metadata.generation; a 1.20 pod has none, and none is written."""
    obj = raw_pod()
    if generation is not None:
        obj["metadata"]["generation"] = generation
    victim = decode_pod(obj)
    transport.on("PATCH", f"{POD_PATH}/status", json_response({}))
    transport.on("DELETE", POD_PATH, json_response({}, 200))
    KubeCluster(RestClient(transport), None).delete_pod(victim, preemptor=victim)
    (cond,) = transport.sent("PATCH", f"{POD_PATH}/status")[0].body["status"]["conditions"]
    assert {k: v for k, v in cond.items() if k == "observedGeneration"} == expected
