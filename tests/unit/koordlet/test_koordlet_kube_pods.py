"""koordlet.kube: which of the node's pods the scheduler accounts from their own annotations."""

from __future__ import annotations

from typing import Any

from koordlet.kube import KubeNodeAPI


class _Listing(KubeNodeAPI):
    def __init__(self, items: list[dict[str, Any]]) -> None:
        super().__init__(api_client=None)
        self.items = items

    def _request(self, method: str, path: str, **_: Any) -> Any:
        assert (method, path) == ("GET", "/api/v1/pods")
        return {"items": self.items}


def _pod(uid: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": "ns", "annotations": annotations},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


def test_gpushare_placed_pods_are_accounted_by_the_scheduler_not_published() -> None:
    api = _Listing(
        [
            _pod("koord", {"scheduling.koordinator.sh/device-allocated": "{}"}),
            _pod("gpushare", {"ALIYUN_COM_GPU_MEM_IDX": "1", "ALIYUN_COM_GPU_MEM_POD": "2"}),
            _pod("broken", {"ALIYUN_COM_GPU_MEM_IDX": "x", "ALIYUN_COM_GPU_MEM_POD": "2"}),
            _pod("plain", {}),
        ]
    )
    pods = api.list_node_pods("n")
    assert pods.uids == {"koord", "gpushare", "broken", "plain"}
    # a malformed gpushare placement is not accounted by the scheduler: its card is published
    assert pods.allocated == {"koord", "gpushare"}


def test_the_hook_admission_and_fair_share_read_one_record_per_pod() -> None:
    gemini = {"koordinator.sh/gpu-isolation-provider": "Gemini"}
    items = [
        {**_pod("a", {"scheduling.koordinator.sh/device-allocated": "{}"}),
         "metadata": {"uid": "a", "name": "a", "namespace": "ns", "labels": gemini,
                      "annotations": {"scheduling.koordinator.sh/device-allocated": "{}",
                                      "koordinator.sh/gpu-core-limit": "50"}}},
        {**_pod("done", {}), "status": {"phase": "Succeeded"}},
        _pod("", {}),
    ]  # fmt: skip
    api = _Listing(items)
    listed = api.list_node_pods("n").records
    assert list(listed) == ["a"]  # terminal and uid-less pods are not the node's
    (record,) = api.list_node_pod_records("n")
    assert record == listed["a"]
    assert record.labels == gemini
    assert record.annotations["koordinator.sh/gpu-core-limit"] == "50"
    assert record.allocation == "{}"
    assert [c.name for c in record.containers] == ["c"] and record.started


def test_a_pod_with_an_init_container_asking_gpu_mem_counts_as_gpushare_counts_it() -> None:
    """Issue 27 item 5: the scheduler writes ``ALIYUN_COM_GPU_MEM_POD`` = the app containers'
    units (gpushare's rule); the device plugin serves both containers, each its own units,
    and tells every container that same pod total."""
    from collections import Counter

    from apis.core import decode_pod
    from koordlet.deviceplugin.gpushare import (
        ENV_CONTAINER,
        ENV_POD,
        Card,
        MemoryUnit,
        allocate_envs,
        choose_pod,
    )
    from scheduler.devices.request import parse_request

    gm = "aliyun.com/gpu-mem"
    obj = {
        "metadata": {"uid": "u", "name": "p", "namespace": "ns", "annotations": {
            "ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_ASSIGNED": "false",
        }},
        "spec": {
            "nodeName": "n",
            "initContainers": [{"name": "fetch", "resources": {"limits": {gm: "4"}}}],
            "containers": [{"name": "main", "resources": {"limits": {gm: "1"}}}],
        },
        "status": {"phase": "Pending"},
    }
    request = parse_request(decode_pod(obj))
    assert request is not None and request.gpushare_pod_units == 1
    (pod,) = _Listing([obj]).pending_gpushare_pods("n")
    assert (pod.units, pod.containers) == (request.gpushare_pod_units, (4, 1))
    cards = [Card(0, "GPU-0", 16 << 30)]
    served: dict[str, Counter[int]] = {}
    envs = []
    for units in (4, 1):  # the kubelet: the init container first, then the app container
        chosen = choose_pod([pod], [units], MemoryUnit.GiB, served)
        served[chosen.uid] = served.get(chosen.uid, Counter()) + Counter([units])
        envs += allocate_envs(chosen, [units], cards, MemoryUnit.GiB)
    assert [(e[ENV_CONTAINER], e[ENV_POD]) for e in envs] == [("4", "1"), ("1", "1")]
