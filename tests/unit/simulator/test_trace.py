"""openb trace rows -> Nodes, Device CRs and Pods (SPEC §9), and the readers' errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apis.core import decode_node, decode_pod
from apis.device import Device
from apis.resources import device_requests
from scheduler.simulator.trace import (
    TraceError,
    TraceNode,
    TracePod,
    device_object,
    node_object,
    pod_object,
    read_nodes,
    read_pods,
)

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("row", "requests", "affinity"),
    [
        pytest.param(
            TracePod("frac", 3152, 10240, 1, 810),
            {
                "cpu": 3152,
                "memory": 10240 * 2**20,
                "koordinator.sh/gpu-core": 81,
                "koordinator.sh/gpu-memory-ratio": 81,
            },
            None,
            id="fractional",
        ),
        pytest.param(
            TracePod("whole", 11300, 4096, 1, 1000),
            {"cpu": 11300, "memory": 4096 * 2**20, "nvidia.com/gpu": 1},
            None,
            id="whole",
        ),
        pytest.param(
            TracePod("multi", 64000, 65536, 8, 1000),
            {"cpu": 64000, "memory": 65536 * 2**20, "nvidia.com/gpu": 8},
            None,
            id="multi-gpu",
        ),
        pytest.param(
            TracePod("spec", 4000, 0, 1, 500, ("V100M16", "V100M32")),
            {
                "cpu": 4000,
                "koordinator.sh/gpu-core": 50,
                "koordinator.sh/gpu-memory-ratio": 50,
            },
            ("V100M16", "V100M32"),
            id="gpu-model-constraint",
        ),
        pytest.param(
            TracePod("cpu", 12500, 8192, 0, 0),
            {"cpu": 12500, "memory": 8192 * 2**20},
            None,
            id="cpu-only",
        ),
    ],
)
def test_pod_rows(
    row: TracePod, requests: dict[str, int], affinity: tuple[str, ...] | None
) -> None:
    pod = decode_pod(pod_object(row, "koord-scheduler"))
    assert pod.name == row.name and pod.uid == f"uid-{row.name}"
    assert pod.scheduler_name == "koord-scheduler" and not pod.node_name
    assert {k: v for k, v in pod.requests.items() if v} == requests
    device_requests(pod.requests)  # a valid device request (SPEC §3)
    if affinity is None:
        assert pod.node_affinity is None
    else:
        assert pod.node_affinity is not None and pod.node_affinity.required is not None
        (term,) = pod.node_affinity.required
        (expr,) = term.match_expressions
        assert (expr.key, expr.operator, expr.values) == (
            "node.koordinator.sh/gpu-model",
            "In",
            affinity,
        )


def test_sampled_copy_gets_its_own_name() -> None:
    obj = pod_object(TracePod("p", 1000, 1, 0, 0), "s", name="p-tuned-3")
    assert obj["metadata"]["name"] == "p-tuned-3"
    assert obj["metadata"]["uid"] == "uid-p-tuned-3"


@pytest.mark.parametrize(
    ("row", "alloc", "cards"),
    [
        pytest.param(
            TraceNode("g", 96000, 786432, 8, "G2"),
            {
                "cpu": 96000,
                "memory": 786432 * 2**20,
                "pods": 1000,
                "nvidia.com/gpu": 8,
                "koordinator.sh/gpu-core": 800,
                "koordinator.sh/gpu-memory-ratio": 800,
                "koordinator.sh/gpu-memory": 8 * 32 * 2**30,
            },
            8,
            id="gpu-node",
        ),
        pytest.param(
            TraceNode("t", 16000, 65536, 1, "T4"),
            {
                "cpu": 16000,
                "memory": 65536 * 2**20,
                "pods": 1000,
                "nvidia.com/gpu": 1,
                "koordinator.sh/gpu-core": 100,
                "koordinator.sh/gpu-memory-ratio": 100,
                "koordinator.sh/gpu-memory": 16 * 2**30,
            },
            1,
            id="t4-node",
        ),
        pytest.param(
            TraceNode("c", 64000, 262144, 0, ""),
            {"cpu": 64000, "memory": 262144 * 2**20, "pods": 1000},
            0,
            id="cpu-only-node",
        ),
    ],
)
def test_node_rows(row: TraceNode, alloc: dict[str, int], cards: int) -> None:
    node = decode_node(node_object(row))
    assert dict(node.allocatable) == alloc
    assert node.labels.get("node.koordinator.sh/gpu-model", "") == row.model
    obj = device_object(row)
    if not cards:
        assert obj is None
        return
    assert obj is not None
    device = Device.from_dict(obj)
    gpus = device.devices_of_type("gpu")
    assert [d.minor for d in gpus] == list(range(cards))
    assert all(d.health and d.resource_value("koordinator.sh/gpu-core") == 100 for d in gpus)


def test_read_the_openb_columns(tmp_path: Path) -> None:
    nodes = read_nodes(
        _write(tmp_path, "n.csv", NODE_HEADER + "n0,64000,262144,2,P100\nn1,32000,1024,0,\n")
    )
    assert nodes == [TraceNode("n0", 64000, 262144, 2, "P100"), TraceNode("n1", 32000, 1024, 0, "")]
    pods = read_pods(
        _write(
            tmp_path,
            "p.csv",
            POD_HEADER
            + "p0,12000,16384,1,1000,,LS,Running,0,10,0\n"
            + "p1,6000,12288,1,460,A10|T4,LS,Running,1,12,1\n",
        )
    )
    assert pods == [
        TracePod("p0", 12000, 16384, 1, 1000),
        TracePod("p1", 6000, 12288, 1, 460, ("A10", "T4")),
    ]


def test_read_the_five_column_files_of_the_public_dataset(tmp_path: Path) -> None:
    # openb_pod_list_multigpu*.csv carry only the first five columns.
    pods = read_pods(
        _write(
            tmp_path,
            "p.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
            + "p0,12000,16384,2,1000\np1,6000,0,1,460\np2,4000,1024,0,0\n",
        )
    )
    assert pods == [
        TracePod("p0", 12000, 16384, 2, 1000),
        TracePod("p1", 6000, 0, 1, 460),
        TracePod("p2", 4000, 1024, 0, 0),
    ]


def test_optional_and_unknown_columns(tmp_path: Path) -> None:
    nodes = read_nodes(_write(tmp_path, "n.csv", "sn,gpu,memory_mib,cpu_milli\nn0,0,1024,32000\n"))
    assert nodes == [TraceNode("n0", 32000, 1024, 0, "")]
    pods = read_pods(
        _write(
            tmp_path,
            "p.csv",
            "extra,gpu_milli,num_gpu,memory_mib,cpu_milli,name,gpu_spec\n"
            + "x,500,1,10,20,p0,T4\n",
        )
    )
    assert pods == [TracePod("p0", 20, 10, 1, 500, ("T4",))]


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        pytest.param("nodes", "sn,cpu_milli\n", "missing column(s) memory_mib, gpu", id="header"),
        pytest.param(
            "pods",
            "name,cpu_milli,memory_mib\n",
            ":1: missing column(s) num_gpu, gpu_milli",
            id="pod-header",
        ),
        pytest.param(
            "pods",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1\n",
            ":2: gpu_milli: expected a non-negative integer, got ''",
            id="short-row",
        ),
        pytest.param("nodes", NODE_HEADER + "n0,x,1,0,\n", ":2: cpu_milli: expected", id="number"),
        pytest.param("nodes", NODE_HEADER + "n0,1,1,2,\n", ":2: model: a node with 2", id="model"),
        pytest.param(
            "nodes", NODE_HEADER + "n0,1,1,0,\nn0,1,1,0,\n", ":3: sn: duplicate", id="dup-node"
        ),
        pytest.param(
            "pods", POD_HEADER + "p,1,1,2,500,,,,,,\n", ":2: gpu_milli: a fractional", id="frac-2"
        ),
        pytest.param("pods", POD_HEADER + "p,1,1,3,1000,,,,,,\n", ":2: num_gpu:", id="count"),
        pytest.param("pods", POD_HEADER + "p,1,1,1,1500,,,,,,\n", ":2: gpu_milli:", id="milli"),
        pytest.param("pods", POD_HEADER + "p,1,1,0,10,,,,,,\n", "must be 0 when", id="cpu-gpu"),
        pytest.param("pods", POD_HEADER + "p,1,1,1,15,,,,,,\n", "multiple of 10", id="tens"),
        pytest.param("pods", POD_HEADER + ",1,1,0,0,,,,,,\n", ":2: name: must be", id="name"),
    ],
)
def test_read_errors_name_file_line_and_column(
    tmp_path: Path, kind: str, text: str, message: str
) -> None:
    path = _write(tmp_path, f"{kind}.csv", text)
    reader: Any = read_nodes if kind == "nodes" else read_pods
    with pytest.raises(TraceError) as err:
        reader(path)
    assert path in str(err.value) and message in str(err.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        read_nodes(str(tmp_path / "absent.csv"))
