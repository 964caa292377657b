"""scheduler.observability.inspect: the per-card account from Device CRs and annotations, the table,
files, and ``koord-scheduler inspect --file``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from apis.checkpoint import PodDeviceEntry, encode_devices_checkpoints
from apis.core import decode_node, decode_pod
from apis.device import ANNOTATION_DEVICES_CHECKPOINTS, Device
from scheduler.cli import main
from scheduler.observability.inspect import (
    INVALID,
    InspectError,
    card_usage,
    load_objects,
    render_inspect,
)

ALLOCATED = "scheduling.koordinator.sh/device-allocated"
GIB = 1024**3
ROOT = Path(__file__).resolve().parents[2]


def device(name: str, gpus: int = 2, unhealthy: tuple[int, ...] = ()) -> dict[str, object]:
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
                    "health": m not in unhealthy,
                    "resources": {
                        "koordinator.sh/gpu-core": "100",
                        "koordinator.sh/gpu-memory": "16Gi",
                        "koordinator.sh/gpu-memory-ratio": "100",
                    },
                }
                for m in range(gpus)
            ]
        },
    }


def node(name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"node.koordinator.sh/gpu-model": "T4"}},
    }


def pod(name: str, node_name: str, alloc: object, phase: str = "Running") -> dict[str, object]:
    text = alloc if isinstance(alloc, str) else json.dumps(alloc)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "annotations": {ALLOCATED: text}},
        "spec": {"nodeName": node_name},
        "status": {"phase": phase},
    }


def share(minor: int, core: int, **extra: str) -> dict[str, object]:
    res = {"koordinator.sh/gpu-core": str(core), **extra}
    return {"gpu": [{"minor": minor, "resources": res}]}


def test_card_usage_fills_memory_and_ratio_and_skips_terminal_pods() -> None:
    errors: list[object] = []
    cards = card_usage(
        {"n1": decode_node(node("n1"))},
        [Device.from_dict(device("n1", unhealthy=(1,)))],
        [
            decode_pod(pod("a", "n1", share(0, 50, **{"koordinator.sh/gpu-memory-ratio": "50"}))),
            decode_pod(pod("b", "n1", share(0, 25, **{"koordinator.sh/gpu-memory": "4Gi"}))),
            decode_pod(pod("done", "n1", share(0, 25), phase="Succeeded")),
        ],
        errors=errors,  # type: ignore[arg-type]
    )
    c0, c1 = cards
    assert (c0.node, c0.minor, c0.uuid, c0.model, c0.healthy) == ("n1", 0, "GPU-n1-0", "T4", True)
    assert c0.allocated == {
        "koordinator.sh/gpu-core": 75,
        "koordinator.sh/gpu-memory": 12 * GIB,
        "koordinator.sh/gpu-memory-ratio": 75,
    }
    assert c0.pods == ["ns/a", "ns/b"]
    assert not c1.healthy and c1.pods == []
    assert errors == []


WHOLE = {"koordinator.sh/gpu-core": 100, "koordinator.sh/gpu-memory": 16 * GIB,
         "koordinator.sh/gpu-memory-ratio": 100}
HALF = {"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory": 8 * GIB,
        "koordinator.sh/gpu-memory-ratio": 50}
NEG = {"koordinator.sh/gpu-core": "-100", "koordinator.sh/gpu-memory-ratio": "-100"}
HELD = "ns/h (invalid annotation: held whole)"
OVER = {k: WHOLE[k] + v for k, v in HALF.items()}  # ok's half, then the whole card on top


@pytest.mark.parametrize(
    ("alloc", "card0", "card1"),
    [
        pytest.param(share(0, -100, **{"koordinator.sh/gpu-memory-ratio": "-100"}),
                     (OVER, ["ns/ok", HELD]), (HALF, ["ns/ok"]), id="negative-holds-the-card"),
        pytest.param({"gpu": [{"minor": 0, "resources": NEG},
                              {"minor": 1, "resources": {"koordinator.sh/gpu-core": "50"}}]},
                     (OVER, ["ns/ok", HELD]), ({"koordinator.sh/gpu-core": 100,
                                                 "koordinator.sh/gpu-memory": 8 * GIB,
                                                 "koordinator.sh/gpu-memory-ratio": 50},
                                                ["ns/ok", "ns/h"]), id="valid-entry-beside"),
        pytest.param(share(0, 101), (OVER, ["ns/ok", HELD]), (HALF, ["ns/ok"]),
                     id="beyond-a-card"),
        pytest.param("{", (OVER, ["ns/ok", HELD]), (OVER, ["ns/ok", HELD]),
                     id="unreadable-holds-every-card"),
        pytest.param(share(7, -100), (HALF, ["ns/ok", f"ns/h{INVALID}"]), (HALF, ["ns/ok"]),
                     id="a-card-the-node-lacks-holds-nothing"),
    ],
)
def test_an_invalid_annotation_is_charged_as_the_ledger_counts_it(
    alloc: object, card0: tuple[object, object], card1: tuple[object, object]
) -> None:
    """Issue 23: inspect summed the -100 (card 0 shown at -50/100); it now uses the ledger's
    rule, so a card an invalid annotation names shows whole (on top of the valid pods)."""
    half = {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}
    errors: list[object] = []
    cards = card_usage(
        {"n1": decode_node(node("n1"))},
        [Device.from_dict(device("n1"))],
        [decode_pod(pod("ok", "n1", {"gpu": [{"minor": 0, "resources": half},
                                             {"minor": 1, "resources": half}]})),
         decode_pod(pod("h", "n1", alloc))],
        errors=errors,  # type: ignore[arg-type]
    )
    assert [(c.allocated, c.pods) for c in cards] == [card0, card1]
    assert [p.name for p in errors] == ["h"]  # type: ignore[attr-defined]


def test_render_shows_a_card_an_invalid_annotation_holds_as_full() -> None:
    pods = [decode_pod(pod("h", "n1", share(0, -100)))]
    out = render_inspect({"n1": decode_node(node("n1"))}, [Device.from_dict(device("n1"))], pods)
    assert out.splitlines()[2].split()[:6] == ["n1", "0", "T4", "ok", "100/100", "16Gi/16Gi"]
    assert HELD.replace("ns/h", "") in out.splitlines()[2]


def test_render_marks_unhealthy_cards_and_filters_a_node() -> None:
    nodes = {"n1": decode_node(node("n1")), "n2": decode_node(node("n2"))}
    devices = [Device.from_dict(device("n1", unhealthy=(1,))), Device.from_dict(device("n2"))]
    pods = [decode_pod(pod("a", "n1", share(0, 50, **{"koordinator.sh/gpu-memory-ratio": "50"})))]
    out = render_inspect(nodes, devices, pods)
    lines = out.splitlines()
    assert lines[0] == "GPU CARDS (allocated/total)"
    assert lines[1].split() == ["NODE", "GPU", "MODEL", "HEALTH", "GPU-CORE", "GPU-MEMORY", "PODS"]
    assert lines[2].split() == ["n1", "0", "T4", "ok", "50/100", "8Gi/16Gi", "ns/a"]
    assert lines[3].split() == ["1", "T4", "UNHEALTHY", "0/100", "0/16Gi", "-"]
    assert "2 nodes, 4 GPUs (1 unhealthy), 1 pods holding GPUs" in out
    one = render_inspect(nodes, devices, pods, "n2")
    assert "n1" not in one and "n2" in one
    with pytest.raises(InspectError, match="not found"):
        render_inspect(nodes, devices, pods, "n9")
    assert "no Device CR" in render_inspect({"n3": decode_node(node("n3"))}, devices, pods, "n3")


def _with_checkpoint(dev: dict[str, object], *entries: tuple[str, tuple[str, ...]]
                     ) -> dict[str, object]:
    """``dev`` with a ``devices-checkpoints`` annotation: (pod uid, device ids) entries."""
    text = encode_devices_checkpoints(
        [PodDeviceEntry(uid, "cuda", "nvidia.com/gpu", ids) for uid, ids in entries]
    )
    meta = dict(dev["metadata"])  # type: ignore[call-overload]
    meta["annotations"] = {ANNOTATION_DEVICES_CHECKPOINTS: text}
    return {**dev, "metadata": meta}


def kubelet_pod(name: str, uid: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "legacy", "uid": uid},
            "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}


@pytest.mark.parametrize(
    ("entries", "pods", "held"),
    [
        pytest.param([("u-train", ("GPU-n1-1",))], [kubelet_pod("train", "u-train")],
                     {1: ["legacy/train (kubelet)"]}, id="card-held-by-a-known-pod"),
        pytest.param([("u-gone", ("GPU-n1-0", "GPU-n1-1"))], [],
                     {0: ["pod uid u-gone (kubelet)"], 1: ["pod uid u-gone (kubelet)"]},
                     id="pod-not-listed-shows-its-uid"),
        pytest.param([("u-x", ("GPU-other",))], [], {}, id="unknown-card-id-is-ignored"),
    ],
)
def test_checkpoint_cards_show_as_held_with_the_pod(
    entries: list[tuple[str, tuple[str, ...]]], pods: list[dict[str, object]],
    held: dict[int, list[str]],
) -> None:
    dev = Device.from_dict(_with_checkpoint(device("n1"), *entries))
    cards = card_usage({"n1": decode_node(node("n1"))}, [dev], [decode_pod(p) for p in pods])
    for c in cards:
        if c.minor in held:
            assert c.pods == held[c.minor]
            assert c.allocated == c.capacity  # the kubelet gave the whole card
        else:
            assert c.pods == [] and not any(c.allocated.values())


def test_checkpoint_holds_only_its_own_nodes_cards() -> None:
    twin = device("n2")  # n2's cards carry n1's ids: only n1's annotation names them
    twin["spec"] = device("n1")["spec"]
    devs = [
        Device.from_dict(twin),
        Device.from_dict(_with_checkpoint(device("n1"), ("u-x", ("GPU-n1-1",)))),
    ]
    cards = card_usage({}, devs, [])
    held = [(c.node, c.minor) for c in cards if c.pods]
    assert held == [("n1", 1)]
    assert [c.pods for c in cards if c.node == "n2"] == [[], []]


def test_render_shows_kubelet_held_cards() -> None:
    dev = Device.from_dict(_with_checkpoint(device("n1"), ("u-train", ("GPU-n1-0",))))
    out = render_inspect({"n1": decode_node(node("n1"))}, [dev],
                         [decode_pod(kubelet_pod("train", "u-train"))])
    lines = out.splitlines()
    assert lines[2].split() == ["n1", "0", "T4", "ok", "100/100", "16Gi/16Gi",
                                "legacy/train", "(kubelet)"]
    assert "1 pods holding GPUs" in out


def test_malformed_checkpoint_is_reported_not_raised() -> None:
    dev = Device.from_dict(device("n1"))
    bad = Device.from_dict({**device("n1"), "metadata": {
        "name": "n1", "annotations": {ANNOTATION_DEVICES_CHECKPOINTS: "[{"}}})
    errors: list[str] = []
    cards = card_usage({}, [bad], [], checkpoint_errors=errors)
    assert errors and errors[0].startswith("n1: ")
    assert [c.pods for c in cards] == [c.pods for c in card_usage({}, [dev], [])]


def test_load_objects_merges_files_later_wins(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump_all([node("n1"), device("n1"), pod("a", "", share(0, 1))]))
    result = tmp_path / "result.json"
    result.write_text(
        json.dumps({"apiVersion": "v1", "kind": "List", "items": [pod("a", "n1", share(1, 40))]})
    )
    nodes, devices, pods = load_objects([scenario, result])
    assert list(nodes) == ["n1"] and [d.name for d in devices] == ["n1"]
    (only,) = pods
    assert only.node_name == "n1"
    with pytest.raises(InspectError, match="cannot read"):
        load_objects([tmp_path / "missing.yaml"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Node\nmetadata: {name: 7}\n")
    with pytest.raises(InspectError, match="document 1"):
        load_objects([bad])


def test_cli_inspect_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        yaml.safe_dump_all([node("n1"), device("n1"), pod("a", "n1", share(0, 30))])
    )
    assert main(["inspect", "--file", str(scenario)]) == 0
    out = capsys.readouterr().out
    assert "30/100" in out and "ns/a" in out
    assert main(["inspect", "n9", "--file", str(scenario)]) == 2
    assert "node 'n9' not found" in capsys.readouterr().err


def test_cli_inspect_reads_simulate_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = ROOT / "config/examples/demo-cluster.yaml"
    assert main(["simulate", str(demo), "-o", "yaml"]) == 0
    result = tmp_path / "result.yaml"
    result.write_text(capsys.readouterr().out)
    assert main(["inspect", "--file", str(demo), "--file", str(result)]) == 0
    table = capsys.readouterr().out
    assert main(["simulate", str(demo)]) == 0
    simulated = capsys.readouterr().out
    # The same per-card rows as the simulator's own table.
    rows = [line for line in table.splitlines() if "/100" in line]
    assert rows and all(row in simulated for row in rows)


def _two_cards(tmp_path: Path) -> Path:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        yaml.safe_dump_all([node("n1"), device("n1", unhealthy=(1,)), pod("a", "n1", share(0, 30))])
    )
    return scenario


EXPECTED_DOC = {
    "nodes": [
        {
            "name": "n1",
            "gpus": [
                {
                    "minor": 0,
                    "uuid": "GPU-n1-0",
                    "model": "T4",
                    "healthy": True,
                    "gpuCore": {"allocated": 30, "total": 100},
                    "gpuMemory": {"allocated": 0, "total": 17179869184},
                    "pods": ["ns/a"],
                },
                {
                    "minor": 1,
                    "uuid": "GPU-n1-1",
                    "model": "T4",
                    "healthy": False,
                    "gpuCore": {"allocated": 0, "total": 100},
                    "gpuMemory": {"allocated": 0, "total": 17179869184},
                    "pods": [],
                },
            ],
        }
    ],
    "summary": {
        "nodes": 1,
        "gpus": 2,
        "unhealthyGPUs": 1,
        "podsHoldingGPUs": 1,
        "gpuCore": {"allocated": 30, "total": 100},
        "gpuMemory": {"allocated": 0, "total": 17179869184},
    },
}


@pytest.mark.parametrize(
    ("argv", "code", "parse", "expected"),
    [
        pytest.param(["-o", "json"], 0, json.loads, EXPECTED_DOC, id="json"),
        pytest.param(["--output=yaml"], 0, yaml.safe_load, EXPECTED_DOC, id="yaml"),
        pytest.param(["n1", "-o", "json"], 0, json.loads, EXPECTED_DOC, id="one-node-json"),
        pytest.param(
            ["-o", "xml"],
            2,
            None,
            "koord-scheduler: error: argument -o/--output: invalid choice: 'xml' "
            "(choose from 'table', 'json', 'yaml')\n",
            id="bad-output",
        ),
        pytest.param(
            ["n9", "-o", "yaml"],
            2,
            None,
            "koord-scheduler: error: node 'n9' not found\n",
            id="unknown-node",
        ),
    ],
)
def test_cli_inspect_output_formats(
    argv: list[str],
    code: int,
    parse: object,
    expected: object,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["inspect", "--file", str(_two_cards(tmp_path)), *argv]) == code
    out, err = capsys.readouterr()
    if parse is None:
        assert (out, err) == ("", expected)
    else:
        assert parse(out) == expected  # type: ignore[operator]
        assert err == ""
