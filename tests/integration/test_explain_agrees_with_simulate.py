"""``explain --file`` answers as ``simulate`` schedules (issue 26): for every pending pod of every
shipped scenario, explained against the cluster as simulate left it just before that pod's turn
(the pods the queue took earlier — higher priority first, then file order — placed, their
victims gone), explain's verdict agrees: simulate's node
is among the nodes explain says fit; or explain's preemption names simulate's node and victims;
or explain says it fits nowhere and preempts nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler import cli
from scheduler.config import default_config, load_config
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.report import pod_objects
from scheduler.simulator.run import simulate
from scheduler.simulator.scenario import load_scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "config" / "examples"
CASES = [
    ("demo-cluster.yaml", None),
    ("demo-preemption.yaml", None),
    ("demo-topology.yaml", "demo-topology-config.yaml"),
]


def _priority(pod: dict[str, Any]) -> int:
    return int(pod["spec"].get("priority") or 0)


def _key(pod: dict[str, Any]) -> str:
    meta = pod["metadata"]
    return f"{meta.get('namespace') or 'default'}/{meta['name']}"


@pytest.mark.parametrize(("scenario", "config"), CASES, ids=[c[0] for c in CASES])
def test_explain_agrees_with_simulate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scenario: str, config: str | None
) -> None:
    cfg_path = str(EXAMPLES / config) if config else None
    cfg = load_config(cfg_path) if cfg_path else default_config()
    full = load_scenario(EXAMPLES / scenario)
    others = [d for d in yaml.safe_load_all((EXAMPLES / scenario).read_text()) if d]
    others = [d for d in others if d.get("kind") not in ("Pod", "PriorityClass")]
    # the queue's order (PrioritySort): higher priority first, then file order
    order = sorted(enumerate(full.pending_pods), key=lambda e: (-_priority(e[1]), e[0]))
    pending = [p for _, p in order]
    checked = 0
    for i, raw in enumerate(pending):
        # simulate with the pods before this one, then with this one: its verdict
        before = load_scenario(EXAMPLES / scenario)
        before.pods = full.running_pods + pending[:i]
        after = load_scenario(EXAMPLES / scenario)
        after.pods = full.running_pods + pending[: i + 1]
        args: tuple[Any, ...] = (in_tree_registry(), default_plugins())
        state = simulate(before, cfg, *args)
        result = simulate(after, cfg, *args)
        key = _key(raw)
        if key in result.foreign:
            continue
        # the cluster just before this pod's turn, and the pod itself (pending)
        pods = [p for p in pod_objects(state) if p["metadata"]["name"] != raw["metadata"]["name"]]
        path = tmp_path / f"state-{i}.yaml"
        path.write_text(yaml.safe_dump_all([*others, *pods, raw]))
        argv = ["explain", key, "--file", str(path), "-o", "json"]
        if cfg_path:
            argv += ["--config", cfg_path]
        assert cli.main(argv) == 0, capsys.readouterr().err
        doc = json.loads(capsys.readouterr().out)
        fits = {n["node"] for n in doc["nodes"] if n["fits"]}
        mine = [p for p in result.preemptions if p.pod.key == key]
        node = result.node_of(key)
        if mine:
            victims = sorted(v.key for v in mine[0].victims)
            assert (doc["preempt_node"], sorted(doc["preempt_victims"])) == (
                mine[0].node,
                victims,
            ), key
        elif node:
            assert node in fits, (key, node, fits)
            assert doc["preempt_node"] == "", key
        else:
            assert not fits and doc["preempt_node"] == "", (key, doc)
        checked += 1
    assert checked
