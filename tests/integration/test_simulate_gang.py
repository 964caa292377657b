"""``simulate`` with PodGroup objects: a scenario's PodGroup defines the gang of its labelled
pods (minMember), a gang short of members binds nothing, and a bad PodGroup is one clear
error naming the document and the field."""

from __future__ import annotations

import pytest

from scheduler.config import parse_config
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.run import simulate
from scheduler.simulator.scenario import ScenarioError, parse_scenario

OURS = "koord-scheduler"
CONFIG = {
    "apiVersion": "kubescheduler.config.k8s.io/v1",
    "kind": "KubeSchedulerConfiguration",
    "profiles": [
        {
            "schedulerName": OURS,
            "plugins": {
                "queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]},
                "preFilter": {"enabled": [{"name": "Coscheduling"}]},
                "reserve": {"enabled": [{"name": "Coscheduling"}]},
                "permit": {"enabled": [{"name": "Coscheduling"}]},
            },
        }
    ],
}

NODE = """
apiVersion: v1
kind: Node
metadata: {name: n0}
status: {allocatable: {cpu: "16", memory: 64Gi, pods: "110"}}
"""


def _group(name: str, min_member: object) -> str:
    return f"""
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: PodGroup
metadata: {{name: {name}, namespace: ml}}
spec: {{minMember: {min_member}, scheduleTimeoutSeconds: 30}}
"""


def _pod(name: str, group: str) -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: ml
  labels: {{pod-group.scheduling.sigs.k8s.io: {group}}}
spec:
  schedulerName: {OURS}
  containers: [{{name: c, image: i, resources: {{requests: {{cpu: "2"}}}}}}]
"""


def test_a_scenario_pod_group_gangs_its_labelled_pods() -> None:
    docs = [NODE, _group("train", 3), _group("big", 5)]
    docs += [_pod(f"train-{i}", "train") for i in range(3)]
    docs += [_pod(f"big-{i}", "big") for i in range(2)]
    scenario = parse_scenario("---".join(docs), "gang.yaml")
    assert [g["metadata"]["name"] for g in scenario.pod_groups] == ["train", "big"]
    result = simulate(scenario, parse_config(CONFIG), in_tree_registry(), default_plugins())
    assert {k: result.node_of(k) for k in result.pending} == {
        "ml/train-0": "n0", "ml/train-1": "n0", "ml/train-2": "n0",
        "ml/big-0": "", "ml/big-1": "",
    }  # fmt: skip
    assert "gang ml/big has 2/5 pods created (min-available 5)" in result.failures["ml/big-0"]


@pytest.mark.parametrize(
    ("min_member", "field"),
    [pytest.param(0, "spec.minMember", id="zero"), pytest.param('"x"', "spec.minMember", id="str")],
)
def test_a_bad_pod_group_is_one_clear_error(min_member: object, field: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        parse_scenario("---".join([NODE, _group("train", min_member)]), "gang.yaml")
    assert str(exc.value).startswith("gang.yaml: document 2 (PodGroup train): PodGroup ml/train")
    assert field in str(exc.value)
