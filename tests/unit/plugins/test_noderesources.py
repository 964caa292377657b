"""NodeResourcesFit: kube's fit_test / least_allocated_test / most_allocated_test tables."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import (
    ASSIGNED_POD_DELETE,
    ASSIGNED_POD_UPDATE,
    NODE_ADD,
    NODE_UPDATE,
)
from scheduler.framework.interfaces import (
    BatchFilterPlugin,
    BatchScorePlugin,
    EnqueueExtensions,
    PluginArgsError,
    PreFilterPlugin,
    PreScorePlugin,
    ScoreNormalizer,
)
from scheduler.framework.status import Code
from scheduler.plugins.noderesources import (
    NodeResourcesFit,
    is_extended_resource_name,
    is_scalar_resource_name,
    parse_args,
)
from tests.builders import NodeBuilder, PodBuilder, make_node, make_pod, make_snapshot

EXT_A = "example.com/aaa"
EXT_B = "example.com/bbb"
K8S_A = "kubernetes.io/something"
K8S_B = "subdomain.kubernetes.io/something"
HUGE_A = "hugepages-2Mi"


def _kube_node(pods: int = 32) -> NodeBuilder:
    """kube's makeAllocatableResources(10, 20, 32, 5, 20, 5)."""
    return make_node("n").resources(
        {"cpu": "10m", "memory": "20", "pods": pods, EXT_A: 5, "ephemeral-storage": 20, HUGE_A: 5}
    )


def _res(cpu: int = 0, mem: int = 0, **scalars: int) -> dict[str, str]:
    out = {"cpu": f"{cpu}m", "memory": str(mem)}
    out.update({k.replace("__", "/").replace("_", "-"): str(v) for k, v in scalars.items()})
    return out


def _pod(*containers: dict[str, str], inits: tuple[dict[str, str], ...] = ()) -> PodBuilder:
    """kube's newResourcePod / newResourceInitPod: one container per resource list."""
    p = make_pod("p")
    for i, c in enumerate(containers):
        if i == 0:
            p.req(c)
        else:
            p.container(c)
    for c in inits:
        p.init_container(c)
    return p


def _existing(*containers: dict[str, str]) -> PodBuilder:
    return _pod(*containers).node("n").uid("existing")


def _pod_ext(cpu: int, mem: int, scalars: dict[str, int]) -> dict[str, str]:
    out = _res(cpu, mem)
    out.update({k: str(v) for k, v in scalars.items()})
    return out


INS = "Insufficient "
ENOUGH_CASES = [
    pytest.param(make_pod("p"), _existing(_res(10, 20)), {}, None, id="no-resources-requested"),
    pytest.param(
        _pod(_res(1, 1)),
        _existing(_res(10, 20)),
        {},
        [INS + "cpu", INS + "memory"],
        id="too-many-resources",
    ),
    pytest.param(
        _pod(_res(1, 1), inits=(_res(3, 1),)),
        _existing(_res(8, 19)),
        {},
        [INS + "cpu"],
        id="init-container-cpu",
    ),
    pytest.param(
        _pod(_res(1, 1), inits=(_res(3, 1), _res(2, 1))),
        _existing(_res(8, 19)),
        {},
        [INS + "cpu"],
        id="highest-init-container-cpu",
    ),
    pytest.param(
        _pod(_res(1, 1), inits=(_res(1, 3),)),
        _existing(_res(9, 19)),
        {},
        [INS + "memory"],
        id="init-container-memory",
    ),
    pytest.param(
        _pod(_res(1, 1), inits=(_res(1, 1),)),
        _existing(_res(9, 19)),
        {},
        None,
        id="init-is-max-not-sum",
    ),
    pytest.param(_pod(_res(1, 1)), _existing(_res(5, 5)), {}, None, id="both-fit"),
    pytest.param(_pod(_res(2, 1)), _existing(_res(9, 5)), {}, [INS + "cpu"], id="memory-fits"),
    pytest.param(_pod(_res(1, 2)), _existing(_res(5, 19)), {}, [INS + "memory"], id="cpu-fits"),
    pytest.param(_pod(_res(5, 1)), _existing(_res(5, 19)), {}, None, id="equal-edge-case"),
    pytest.param(
        _pod(_res(4, 1), inits=(_res(5, 1),)),
        _existing(_res(5, 19)),
        {},
        None,
        id="equal-edge-case-init",
    ),
    pytest.param(_pod({EXT_A: "1"}), _existing({}), {}, None, id="extended-fits"),
    pytest.param(
        _pod(_pod_ext(1, 1, {EXT_A: 10})),
        _existing({}),
        {},
        [INS + EXT_A],
        id="extended-capacity-enforced",
    ),
    pytest.param(
        _pod(_pod_ext(1, 1, {EXT_A: 1})),
        _existing({EXT_A: "5"}),
        {},
        [INS + EXT_A],
        id="extended-allocatable-enforced",
    ),
    pytest.param(
        _pod(_pod_ext(1, 1, {EXT_A: 3}), _pod_ext(1, 1, {EXT_A: 3})),
        _existing({EXT_A: "2"}),
        {},
        [INS + EXT_A],
        id="extended-multiple-containers",
    ),
    pytest.param(
        _pod({}, inits=(_pod_ext(1, 1, {EXT_A: 3}), _pod_ext(1, 1, {EXT_A: 3}))),
        _existing({EXT_A: "2"}),
        {},
        None,
        id="extended-multiple-init-containers",
    ),
    pytest.param(
        _pod(_pod_ext(1, 1, {EXT_B: 1})),
        _existing({}),
        {},
        [INS + EXT_B],
        id="extended-unknown-resource",
    ),
    pytest.param(
        _pod(_pod_ext(1, 1, {K8S_A: 10})),
        _existing({}),
        {},
        [INS + K8S_A],
        id="kubernetes-io-resource",
    ),
    pytest.param(
        _pod({}, inits=(_pod_ext(1, 1, {K8S_B: 10}),)),
        _existing({}),
        {},
        [INS + K8S_B],
        id="kubernetes-io-subdomain-init",
    ),
    pytest.param(
        _pod(_pod_ext(1, 1, {HUGE_A: 10})),
        _existing({}),
        {},
        [INS + HUGE_A],
        id="hugepages-capacity",
    ),
    pytest.param(
        _pod(_pod_ext(1, 1, {HUGE_A: 3}), _pod_ext(1, 1, {HUGE_A: 3})),
        _existing({HUGE_A: "2"}),
        {},
        [INS + HUGE_A],
        id="hugepages-multiple-containers",
    ),
    pytest.param(
        _pod(_pod_ext(1, 1, {EXT_B: 1})),
        _existing({}),
        {"ignoredResources": [EXT_B]},
        None,
        id="ignored-extended-resource",
    ),
    pytest.param(
        _pod(_res(1, 1)).overhead({"cpu": "3m", "memory": "13"}),
        _existing(_res(5, 5)),
        {},
        None,
        id="overhead-fits",
    ),
    pytest.param(
        _pod(_res(1, 1)).overhead({"cpu": "1m", "memory": "15"}),
        _existing(_res(5, 5)),
        {},
        [INS + "memory"],
        id="overhead-does-not-fit-memory",
    ),
    pytest.param(
        _pod(_pod_ext(1, 1, {EXT_B: 1, K8S_A: 1})),
        _existing({}),
        {"ignoredResourceGroups": ["example.com"]},
        [INS + K8S_A],
        id="ignored-resource-group",
    ),
    pytest.param(
        _pod(_pod_ext(1, 1, {EXT_A: 0})),
        _existing({EXT_A: "6"}),
        {},
        None,
        id="zero-extended-request-skipped",
    ),
    pytest.param(
        _pod({EXT_A: "1"}),
        _existing({"cpu": "20m", "memory": "30", EXT_A: "1"}),
        {},
        None,
        id="zero-cpu-memory-request-skipped",
    ),
    pytest.param(_pod(_res(1, 1)), _existing(_res(2, 10)), {}, None, id="empty-storage-fits"),
    pytest.param(
        _pod({"ephemeral-storage": "25"}),
        _existing(_res(2, 2)),
        {},
        [INS + "ephemeral-storage"],
        id="ephemeral-storage-exceeds",
    ),
    pytest.param(
        _pod({"ephemeral-storage": "10"}),
        _existing(_res(2, 2)),
        {},
        None,
        id="ephemeral-storage-fits",
    ),
    pytest.param(
        _pod({"storage": "100", "pods": "5"}),
        _existing({}),
        {},
        None,
        id="non-scalar-native-names-ignored",
    ),
]


def _run_filter(
    pod: PodBuilder, existing: list[PodBuilder], node: NodeBuilder, args: dict[str, Any]
) -> tuple[list[str] | None, Code | None, bool]:
    snapshot = make_snapshot([node], existing)
    plugin = NodeResourcesFit(parse_args(args))
    p = pod.build()
    state = CycleState()
    assert plugin.pre_filter(state, p) is None
    info = snapshot.get("n")
    assert info is not None
    status = plugin.filter(state, p, info)
    batch = bool(plugin.filter_nodes(state, p, snapshot)[info.slot])
    if status is None:
        return None, None, batch
    return list(status.reasons), status.code, batch


@pytest.mark.parametrize(("pod", "existing", "args", "want"), ENOUGH_CASES)
def test_enough_requests(
    pod: PodBuilder, existing: PodBuilder, args: dict[str, Any], want: list[str] | None
) -> None:
    reasons, code, batch = _run_filter(pod, [existing], _kube_node(), args)
    assert reasons == want
    if want is not None:
        assert code == Code.UNSCHEDULABLE
    assert batch is (want is None)


@pytest.mark.parametrize(
    ("pod", "existing"),
    [
        pytest.param(make_pod("p"), _existing(_res(10, 20)), id="no-requests"),
        pytest.param(_pod(_res(1, 1)), _existing(_res(5, 5)), id="resources-fit"),
        pytest.param(_pod(_res(5, 1)), _existing(_res(5, 19)), id="equal-edge-case"),
        pytest.param(
            _pod(_res(5, 1), inits=(_res(5, 1),)), _existing(_res(5, 19)), id="equal-edge-case-init"
        ),
    ],
)
def test_not_enough_pods(pod: PodBuilder, existing: PodBuilder) -> None:
    reasons, code, batch = _run_filter(pod, [existing], _kube_node(pods=1), {})
    assert (reasons, code, batch) == (["Too many pods"], Code.UNSCHEDULABLE, False)


def test_all_reasons_in_kube_order() -> None:
    node = _kube_node(pods=1).resource("koordinator.sh/gpu-core", 100)
    pod = _pod(
        _pod_ext(
            11,
            21,
            {
                "ephemeral-storage": 21,
                EXT_B: 1,
                EXT_A: 6,
                HUGE_A: 6,
                "koordinator.sh/gpu-core": 101,
            },
        )
    )
    reasons, _, batch = _run_filter(pod, [_existing({})], node, {})
    assert reasons == [
        "Too many pods",
        INS + "cpu",
        INS + "memory",
        INS + "ephemeral-storage",
        INS + EXT_A,
        INS + EXT_B,
        INS + HUGE_A,
        INS + "koordinator.sh/gpu-core",
    ]
    assert batch is False


def test_node_without_pods_allocatable_fits_nothing() -> None:
    reasons, _, _ = _run_filter(make_pod("p"), [], make_node("n").pods(None), {})
    assert reasons == ["Too many pods"]


def test_filter_without_pre_filter_is_an_error() -> None:
    snapshot = make_snapshot([make_node("n")])
    info = snapshot.get("n")
    assert info is not None
    status = NodeResourcesFit().filter(CycleState(), make_pod("p").build(), info)
    assert status is not None and status.code == Code.ERROR
    assert "PreFilterNodeResourcesFit" in status.message


@pytest.mark.parametrize(
    ("name", "extended", "scalar"),
    [
        ("cpu", False, False),
        ("pods", False, False),
        ("storage", False, False),
        (EXT_A, True, True),
        ("koordinator.sh/gpu.shared", True, True),
        ("nvidia.com/gpu", True, True),
        (K8S_A, False, True),
        (K8S_B, False, True),
        (HUGE_A, False, True),
        ("attachable-volumes-aws-ebs", False, True),
        ("requests.example.com/x", False, False),
        ("bad name/x", False, False),
    ],
)
def test_resource_name_classes(name: str, extended: bool, scalar: bool) -> None:
    assert is_extended_resource_name(name) is extended
    assert is_scalar_resource_name(name) is scalar


# -- scoring -------------------------------------------------------------------------------------

DEFAULT = [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}]
EXT_RES = "abc.com/xyz"
EXT_SET = [*DEFAULT, {"name": EXT_RES, "weight": 1}]


def _n(name: str, cpu: str, memory: str, **ext: str) -> NodeBuilder:
    node = make_node(name).cpu(cpu).memory(memory)
    if ext:
        node.resource(EXT_RES, ext["x"])
    return node


TWO_CONTAINERS = _pod({"cpu": "1000", "memory": "2000"}, {"cpu": "2000", "memory": "3000"})
ONE_EXT = _pod({"cpu": "3000", "memory": "5000", EXT_RES: "2"})

# (strategy, pod, nodes, existing pods, resources, want raw scores)
SCORE_CASES = [
    pytest.param(
        "LeastAllocated",
        TWO_CONTAINERS,
        [_n("node1", "4000", "10000"), _n("node2", "6000", "10000")],
        [],
        DEFAULT,
        [37, 50],
        id="least-differently-sized-nodes",
    ),
    pytest.param(
        "LeastAllocated",
        make_pod("p"),
        [make_node("node1"), make_node("node2")],
        [_pod({"cpu": "3000"}).node("node1").uid("e1")],
        DEFAULT,
        [0, 0],
        id="least-zero-node-resources",
    ),
    pytest.param(
        "LeastAllocated",
        TWO_CONTAINERS,
        [_n("node1", "4000", "10000"), _n("node2", "6000", "10000")],
        [],
        [{"name": "memory", "weight": 2}, {"name": "cpu", "weight": 1}],
        [41, 50],
        id="least-weighted",
    ),
    pytest.param(
        "LeastAllocated",
        TWO_CONTAINERS,
        [_n("node1", "6000", "10000"), _n("node2", "6000", "10000", x="4")],
        [],
        EXT_SET,
        [50, 50],
        id="least-bypass-unrequested-extended",
    ),
    pytest.param(
        "LeastAllocated",
        ONE_EXT,
        [_n("node1", "6000", "10000", x="4"), _n("node2", "6000", "10000", x="10")],
        [],
        EXT_SET,
        [50, 60],
        id="least-honor-requested-extended",
    ),
    pytest.param(
        "LeastAllocated",
        _pod({"cpu": "3000", "memory": "4000"}),
        [_n("node1", "6000", "10000"), _n("node2", "6000", "10000", x="4")],
        [],
        [{"name": EXT_RES, "weight": 2}, *DEFAULT],
        [55, 55],
        id="least-node-without-resource",
    ),
    pytest.param(
        "MostAllocated",
        TWO_CONTAINERS,
        [_n("node1", "4000", "10000"), _n("node2", "6000", "10000")],
        [],
        DEFAULT,
        [62, 50],
        id="most-differently-sized-nodes",
    ),
    pytest.param(
        "MostAllocated",
        _pod({"cpu": "2000", "memory": "4000"}, {"cpu": "3000", "memory": "5000"}),
        [_n("node1", "5000", "10000"), _n("node2", "10000", "9000")],
        [],
        DEFAULT,
        [95, 75],
        id="most-requested-equals-capacity",
    ),
    pytest.param(
        "MostAllocated",
        TWO_CONTAINERS,
        [_n("node1", "4000", "10000"), _n("node2", "6000", "10000")],
        [],
        [{"name": "memory", "weight": 2}, {"name": "cpu", "weight": 1}],
        [58, 50],
        id="most-weighted",
    ),
    pytest.param(
        "MostAllocated",
        make_pod("p"),
        [_n("node1", "250m", "1000Mi"), _n("node2", "250m", "1000Mi")],
        [make_pod("e1").node("node1"), make_pod("e2").node("node1")],
        DEFAULT,
        [80, 30],
        id="most-nonzero-defaults",
    ),
    pytest.param(
        "MostAllocated",
        TWO_CONTAINERS,
        [_n("node1", "6000", "10000"), _n("node2", "6000", "10000", x="4")],
        [],
        EXT_SET,
        [50, 50],
        id="most-bypass-unrequested-extended",
    ),
    pytest.param(
        "MostAllocated",
        ONE_EXT,
        [_n("node1", "6000", "10000", x="4"), _n("node2", "6000", "10000", x="10")],
        [],
        EXT_SET,
        [50, 40],
        id="most-honor-requested-extended",
    ),
    pytest.param(
        "MostAllocated",
        _pod({"cpu": "3000", "memory": "4000"}),
        [_n("node1", "6000", "10000"), _n("node2", "6000", "10000", x="4")],
        [],
        [{"name": EXT_RES, "weight": 2}, *DEFAULT],
        [45, 45],
        id="most-node-without-resource",
    ),
    pytest.param(
        "LeastAllocated",
        _pod({"cpu": "3"}),
        [_n("node1", "4", "1Gi"), _n("node2", "4", "1Gi")],
        # node1: cpu 6 > 4 -> 0; memory 2x200Mi of 1Gi -> 60; (0 + 60) / 2
        # node2: cpu (4 - 3) / 4 -> 25; memory 200Mi of 1Gi -> 80; (25 + 80) / 2
        [_pod({"cpu": "3"}).node("node1").uid("e1")],
        DEFAULT,
        [30, 52],
        id="least-over-capacity-scores-zero",
    ),
    pytest.param(
        "LeastAllocated",
        _pod({"ephemeral-storage": "10"}),
        [make_node("node1").ephemeral_storage("40"), make_node("node2")],
        [_pod({"ephemeral-storage": "10"}).node("node1").uid("e1")],
        [{"name": "ephemeral-storage", "weight": 1}],
        [50, 0],
        id="least-ephemeral-storage",
    ),
]


@pytest.mark.parametrize(("strategy", "pod", "nodes", "existing", "resources", "want"), SCORE_CASES)
def test_score(
    strategy: str,
    pod: PodBuilder,
    nodes: list[NodeBuilder],
    existing: list[PodBuilder],
    resources: list[dict[str, Any]],
    want: list[int],
) -> None:
    args = {"scoringStrategy": {"type": strategy, "resources": resources}}
    plugin = NodeResourcesFit(parse_args(args))
    snapshot = make_snapshot(nodes, existing)
    p = pod.build()
    state = CycleState()
    infos = list(snapshot.node_infos())
    assert plugin.pre_score(state, p, infos) is None
    assert [plugin.score(state, p, i) for i in infos] == want
    assert plugin.score_nodes(state, p, snapshot, snapshot.live_slots()).tolist() == want
    assert plugin.score(CycleState(), p, infos[0]) == want[0]  # without PreScore


# kube applies the scoring defaults per container whose request is *missing*
# (NonMissingContainerRequests); an explicit 0 stays 0.


def test_score_explicit_zero_memory_is_zero_in_kube() -> None:
    # kube: cpu (10000-2000)*100/10000 = 80, memory (1000Mi-100Mi)/1000Mi = 90 -> 85
    plugin = NodeResourcesFit()
    snapshot = make_snapshot(
        [_n("n", "10", "1000Mi")], [_pod({"cpu": "1", "memory": "0"}).node("n").uid("e")]
    )
    pod = _pod({"cpu": "1", "memory": "100Mi"}).build()
    info = snapshot.get("n")
    assert info is not None
    assert plugin.score(CycleState(), pod, info) == 85


def test_score_defaults_apply_per_container_in_kube() -> None:
    # kube: two containers without cpu -> 200m non-zero cpu: (1000-200)*100/1000 = 80
    plugin = NodeResourcesFit(
        parse_args(
            {
                "scoringStrategy": {
                    "type": "LeastAllocated",
                    "resources": [{"name": "cpu", "weight": 1}],
                }
            }
        )
    )
    snapshot = make_snapshot([_n("n", "1", "1Gi")])
    pod = make_pod("p").container().build()
    info = snapshot.get("n")
    assert info is not None
    assert plugin.score(CycleState(), pod, info) == 80


# -- args ----------------------------------------------------------------------------------------


def test_default_args() -> None:
    args = parse_args({})
    assert args.strategy == "LeastAllocated"
    assert args.resources == (("cpu", 1), ("memory", 1))
    assert NodeResourcesFit().args == args


def test_zero_or_missing_weight_defaults_to_one() -> None:
    args = parse_args(
        {
            "scoringStrategy": {
                "type": "MostAllocated",
                "resources": [{"name": "cpu", "weight": 0}, {"name": "memory"}],
            }
        }
    )
    assert args.resources == (("cpu", 1), ("memory", 1))


def test_empty_resources_default_to_cpu_memory() -> None:
    assert parse_args({"scoringStrategy": {"type": "MostAllocated"}}).resources == (
        ("cpu", 1),
        ("memory", 1),
    )


@pytest.mark.parametrize(
    ("args", "match"),
    [
        pytest.param({"ignoredResource": []}, "unknown field.*ignoredResource", id="unknown-key"),
        pytest.param(
            {"ignoredResources": "x"}, r"ignoredResources: expected a list", id="not-a-list"
        ),
        pytest.param(
            {"ignoredResources": ["bad name"]}, r"ignoredResources\[0\]", id="bad-ignored-resource"
        ),
        pytest.param(
            {"ignoredResourceGroups": ["example.com/x"]},
            r"ignoredResourceGroups\[0\]: resource group name can't contain '/'",
            id="group-with-slash",
        ),
        pytest.param(
            {"scoringStrategy": {"type": "RequestedToCapacityRatio"}},
            "RequestedToCapacityRatio is not supported",
            id="rtcr-not-supported",
        ),
        pytest.param(
            {"scoringStrategy": {"type": "Balanced"}},
            r"scoringStrategy\.type",
            id="unknown-strategy",
        ),
        pytest.param(
            {"scoringStrategy": {"resources": DEFAULT}},
            r"scoringStrategy\.type",
            id="missing-strategy-type",
        ),
        pytest.param(
            {"scoringStrategy": {"type": "LeastAllocated", "shape": []}},
            r"scoringStrategy: unknown field\(s\) shape",
            id="unknown-strategy-key",
        ),
        pytest.param(
            {
                "scoringStrategy": {
                    "type": "LeastAllocated",
                    "resources": [{"name": "memory", "weight": -1}, {"name": "cpu", "weight": 1}],
                }
            },
            r"scoringStrategy\.resources\[0\]\.weight",
            id="negative-weight",
        ),
        pytest.param(
            {
                "scoringStrategy": {
                    "type": "LeastAllocated",
                    "resources": [{"name": "memory", "weight": 1}, {"name": "cpu", "weight": 101}],
                }
            },
            r"scoringStrategy\.resources\[1\]\.weight.*\(0, 100\]",
            id="weight-over-100",
        ),
        pytest.param(
            {
                "scoringStrategy": {
                    "type": "LeastAllocated",
                    "resources": [{"name": "cpu", "weight": True}],
                }
            },
            r"resources\[0\]\.weight",
            id="bool-weight",
        ),
        pytest.param(
            {"scoringStrategy": {"type": "LeastAllocated", "resources": [{"weight": 1}]}},
            r"resources\[0\]\.name",
            id="missing-name",
        ),
        pytest.param(
            {
                "scoringStrategy": {
                    "type": "LeastAllocated",
                    "resources": [{"name": "cpu", "weigth": 1}],
                }
            },
            r"resources\[0\]: unknown field",
            id="typo",
        ),
    ],
)
def test_args_errors(args: dict[str, Any], match: str) -> None:
    with pytest.raises(PluginArgsError, match=match):
        parse_args(args)


def test_protocols_and_events() -> None:
    plugin = NodeResourcesFit()
    for proto in (
        PreFilterPlugin,
        BatchFilterPlugin,
        PreScorePlugin,
        BatchScorePlugin,
        EnqueueExtensions,
    ):
        assert isinstance(plugin, proto)
    assert not isinstance(plugin, ScoreNormalizer)
    assert plugin.pre_filter_extensions() is None
    assert set(plugin.events_to_register()) == {
        NODE_ADD,
        NODE_UPDATE,
        ASSIGNED_POD_DELETE,
        ASSIGNED_POD_UPDATE,
    }
