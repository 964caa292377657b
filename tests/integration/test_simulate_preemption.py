"""``koord-scheduler simulate`` on the preemption demo: the report names the preemption, the
victim and the card it freed, and ``-o yaml`` shows the preemptor's nominated node."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scheduler.cli import main

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "config" / "examples" / "demo-preemption.yaml"


def test_the_table_lists_the_preemption_with_victim_and_card(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", str(DEMO)]) == 0
    out = capsys.readouterr().out
    assert "prod/inference  gpu-t4-1  gpu 1    Scheduled" in out
    assert "prod/inference  gpu-t4-1  lab/nb-speech  0         gpu 1" in out
    assert "1 preempted" in out
    assert "nb-research" not in out.split("PREEMPTIONS")[1].split("GPU CARDS")[0]


def test_yaml_shows_the_nominated_node_and_no_victim(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(DEMO), "-o", "yaml"]) == 0
    items = {
        f"{i['metadata']['namespace']}/{i['metadata']['name']}": i
        for i in yaml.safe_load(capsys.readouterr().out)["items"]
    }
    assert "lab/nb-speech" not in items
    inference = items["prod/inference"]
    assert inference["status"]["nominatedNodeName"] == "gpu-t4-1"
    assert inference["spec"]["nodeName"] == "gpu-t4-1"
    assert inference["spec"]["priority"] == 1000  # from its PriorityClass, as admission would
    assert {"lab/nb-research-a", "lab/nb-research-b", "lab/nb-vision"} <= set(items)


def test_a_pod_naming_an_unknown_priority_class_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"
        "spec: {priorityClassName: gold, containers: [{name: c, image: i}]}\n"
    )
    assert main(["simulate", str(bad)]) != 0
    err = capsys.readouterr().err
    assert "Pod default/p: no PriorityClass named 'gold'" in err
    assert "Traceback" not in err
