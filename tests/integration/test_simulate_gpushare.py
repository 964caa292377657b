"""``simulate`` on a gpushare cluster: a scenario's nodes may have no Device at all, only the
capacity gpushare's device plugin advertises; their cards come from it (gpushare's division),
pods gpushare placed count on theirs, and gpushare pods are binpacked on the rest."""

from __future__ import annotations

from scheduler.config import default_config
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.run import simulate
from scheduler.simulator.scenario import parse_scenario

NODE = """
apiVersion: v1
kind: Node
metadata: {name: gs}
status:
  capacity:
    {cpu: "16", memory: 64Gi, pods: "110", aliyun.com/gpu-mem: "33", aliyun.com/gpu-count: "2"}
"""


def _pod(name: str, units: int, placed: str = "") -> str:
    extra = ""
    if placed:
        extra = (f"  annotations: {{ALIYUN_COM_GPU_MEM_IDX: '{placed}', "
                 f"ALIYUN_COM_GPU_MEM_POD: '{units}'}}\n")
    node = "  nodeName: gs\n" if placed else ""
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
{extra}spec:
  schedulerName: koord-scheduler
{node}  containers:
    - {{name: c, image: i, resources: {{limits: {{aliyun.com/gpu-mem: "{units}"}}}}}}
"""


def test_a_scenario_node_without_device_gets_the_cards_of_its_gpushare_capacity() -> None:
    docs = [NODE, _pod("old", 10, placed="1"), _pod("a", 6), _pod("b", 16), _pod("c", 1)]
    scenario = parse_scenario("---".join(docs), "gpushare.yaml")
    assert not scenario.devices
    result = simulate(scenario, default_config(), in_tree_registry(), default_plugins())
    cards = {k: result.cluster.pods[k].annotations.get("ALIYUN_COM_GPU_MEM_IDX")
             for k in result.pending}
    # two cards of 33 // 2 = 16: "a" binpacks next to "old" on card 1 (6 left), "b" takes
    # card 0 whole, "c" finds no room left anywhere
    assert cards == {"default/a": "1", "default/b": "0", "default/c": None}
    assert result.failures["default/c"].startswith("0/1 nodes are available: 1 Insufficient")
