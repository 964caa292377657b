"""``kubectl inspect gpushare --koord``: koord-py's account (Device CRs, gpushare and koordinator
pods) in gpushare's layout; the default, the original's own account, is test_gpushare_display."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from apis.core import decode_node, decode_pod
from apis.device import Device
from scheduler.commands.kubectl_gpushare import main
from scheduler.observability.inspect_gpushare import gpushare_view

ALLOCATED = "scheduling.koordinator.sh/device-allocated"


def device(name: str, sizes: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": name},
        "spec": {
            "devices": [
                {
                    "type": "gpu",
                    "id": f"GPU-{name}-{m}",
                    "minor": m,
                    "health": True,
                    "resources": {
                        "koordinator.sh/gpu-core": "100",
                        "koordinator.sh/gpu-memory": size,
                        "koordinator.sh/gpu-memory-ratio": "100",
                    },
                }
                for m, size in enumerate(sizes)
            ]
        },
    }


def node(name: str, ip: str, capacity: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": {
            "addresses": [
                {"type": "Hostname", "address": name},
                {"type": "InternalIP", "address": ip},
            ],
            "capacity": capacity or {},
        },
    }


def pod(
    name: str, node_name: str, annotations: dict[str, str], phase: str = "Running"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "annotations": annotations,
        },
        "spec": {"nodeName": node_name, "containers": [{"name": "c"}]},
        "status": {"phase": phase},
    }


def koord(minor: int, memory: str) -> dict[str, str]:
    return {
        ALLOCATED: json.dumps(
            {"gpu": [{"minor": minor, "resources": {"koordinator.sh/gpu-memory": memory}}]}
        )
    }


def gpushare(idx: int, units: int) -> dict[str, str]:
    return {"ALIYUN_COM_GPU_MEM_IDX": str(idx), "ALIYUN_COM_GPU_MEM_POD": str(units)}


OBJECTS: list[dict[str, Any]] = [
    node("node-a", "10.0.0.1"),
    device("node-a", ["16Gi", "40Gi"]),
    node("node-b", "10.0.0.2", {"aliyun.com/gpu-mem": "30", "aliyun.com/gpu-count": "2"}),
    node("cpu-only", "10.0.0.3"),
    pod("koord-1", "node-a", koord(1, "10Gi")),
    pod("koord-2", "node-a", koord(1, "1536Mi")),  # 1.5 GiB rounds up to 2
    pod("share-1", "node-a", gpushare(0, 3)),
    pod("both", "node-a", {**koord(0, "4Gi"), **gpushare(0, 4)}),  # counted once
    pod("gone", "node-a", gpushare(0, 5), phase="Succeeded"),
    pod("share-2", "node-b", gpushare(1, 6)),
    pod("broken", "node-b", {ALLOCATED: "{not json"}),  # holds every card of node-b whole
    pod("elsewhere", "node-c", gpushare(0, 1)),
]

TABLE = (
    "NAME    IPADDRESS  GPU0(Allocated/Total)  GPU1(Allocated/Total)  GPU Memory(GiB)\n"
    "node-a  10.0.0.1   7/16                   12/40                  19/56\n"
    "node-b  10.0.0.2   15/15                  21/15                  36/30\n"
    "-----------------------------------------------------\n"
    "Allocated/Total GPU Memory In Cluster:\n"
    "55/86 (63%)  \n"
)

DETAILS_NODE_B = (
    "NAME:       node-b\n"
    "IPADDRESS:  10.0.0.2\n"
    "\n"
    "NAME         NAMESPACE  GPU0(Allocated)  GPU1(Allocated)  \n"
    "broken       ns         15               15               \n"
    "share-2      ns         0                6                \n"
    "Allocated :  36 (120%)  \n"
    "Total :      30         \n"
)


def _view() -> tuple[Any, list[str]]:
    nodes = [decode_node(o) for o in OBJECTS if o["kind"] == "Node"]
    devices = [Device.from_dict(o) for o in OBJECTS if o["kind"] == "Device"]
    pods = [decode_pod(o) for o in OBJECTS if o["kind"] == "Pod"]
    return gpushare_view(nodes, devices, pods)


Capsys = pytest.CaptureFixture[str]


def _koord(tmp_path: Path, capsys: Capsys, *args: str) -> tuple[int, str, str]:
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(OBJECTS))
    rc = main(["--koord", *args, "--file", str(path)])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_koord_table_counts_both_kinds_of_pods_per_card(tmp_path: Path, capsys: Capsys) -> None:
    """--koord: Device CR card sizes, koordinator and gpushare pods, in gpushare's layout; an
    unreadable annotation is one warning on stderr (stdout stays the table)."""
    _, problems = _view()
    assert problems == [
        "pod ns/broken: invalid scheduling.koordinator.sh/device-allocated annotation: invalid "
        "JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1) "
        "(its cards count as fully used)"
    ]
    rc, out, err = _koord(tmp_path, capsys)
    assert (rc, out) == (0, TABLE)
    assert err == f"kubectl-inspect-gpushare: warning: {problems[0]}\n"


def test_koord_details_list_pods_per_card(tmp_path: Path, capsys: Capsys) -> None:
    rc, out, _ = _koord(tmp_path, capsys, "-d")
    assert rc == 0
    assert DETAILS_NODE_B in out
    assert "both         ns         4                0                \n" in out
    assert "koord-2      ns         0                2                \n" in out
    assert out.endswith("Allocated/Total GPU Memory In Cluster:  55/86 (63%)  \n")


def test_koord_positional_node(tmp_path: Path, capsys: Capsys) -> None:
    rc, out, _ = _koord(tmp_path, capsys, "node-b")
    assert rc == 0
    assert [ln.split()[0] for ln in out.splitlines()[1:3]] == ["node-b", "-" * 54]


def test_without_koord_koordinator_pods_and_device_crs_are_not_read(
    tmp_path: Path, capsys: Capsys
) -> None:
    """The default is the original's account: only gpushare nodes (allocatable
    aliyun.com/gpu-mem) and pods with aliyun.com/gpu-mem limits."""
    objects = [
        node("node-a", "10.0.0.1"),  # a Device CR only: not a gpushare node
        device("node-a", ["16Gi", "40Gi"]),
        pod("koord-1", "node-a", koord(1, "10Gi")),
    ]
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    assert main(["--file", str(path)]) == 0
    assert capsys.readouterr().out == (
        "NAME  IPADDRESS  GPU Memory()\n\nAllocated/Total GPU Memory In Cluster:\n0/0 (0%)  \n"
    )


def test_a_negative_amount_never_frees_gpu_memory() -> None:
    """Issue 23: "-8Gi" was summed (card 0 shown at -1/16); it holds the card whole now."""
    nodes = [decode_node(node("n", "1.2.3.4"))]
    pods = [decode_pod(pod("ok", "n", koord(0, "7Gi"))),
            decode_pod(pod("hostile", "n", koord(0, "-8Gi")))]
    view, problems = gpushare_view(nodes, [Device.from_dict(device("n", ["16Gi", "40Gi"]))], pods)
    assert [(c.index, c.pods) for c in view[0].cards] == [(0, {"ns/ok": 7, "ns/hostile": 16}),
                                                          (1, {})]
    assert len(problems) == 1 and "negative amount -8Gi" in problems[0]


def test_mib_unit() -> None:
    nodes = [decode_node(node("n", "1.2.3.4"))]
    view, _ = gpushare_view(nodes, [Device.from_dict(device("n", ["1Gi"]))], [], unit="MiB")
    assert view[0].cards[0].total == 1024


def test_plugin_reads_files_and_reports_errors_in_one_line(tmp_path: Path, capsys: Capsys) -> None:
    rc, out, _ = _koord(tmp_path, capsys)
    assert (rc, out) == (0, TABLE)
    assert main(["--file", str(tmp_path / "absent.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kubectl-inspect-gpushare: error:") and len(err.splitlines()) == 1


def test_koord_a_card_index_past_any_machine_is_left_out_with_a_warning(
    tmp_path: Path, capsys: Capsys
) -> None:
    """A Device CR card with minor 10^9 would make the table 10^9 columns wide."""
    crd = device("n", ["16Gi", "16Gi"])
    crd["spec"]["devices"][1]["minor"] = 10**9
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all([node("n", "1.2.3.4"), crd]))
    assert main(["--koord", "--file", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[1].split() == ["n", "1.2.3.4", "0/16", "0/16"]
    assert err == (
        "kubectl-inspect-gpushare: warning: node n: card 1000000000 is over 1024: left out\n"
    )
