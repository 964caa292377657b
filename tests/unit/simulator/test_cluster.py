"""The in-memory cluster's bind: what a Binding does on the API server, cheaply."""

from __future__ import annotations

from apis.core import decode_pod
from scheduler.simulator.cluster import InMemoryCluster
from tests.builders import make_pod


def test_a_bind_gives_the_record_a_full_decode_would_give() -> None:
    cluster = InMemoryCluster()
    cluster.apply_pod(
        make_pod("p").annotation("keep", "me").label("app", "x").req(cpu="1").obj()
    )
    before = cluster.pods["default/p"]
    cluster.bind(before, "n1", {"scheduling.koordinator.sh/device-allocated": "{}"})
    after = cluster.pods["default/p"]
    assert after == decode_pod(after.raw)
    assert after.node_name == "n1" and after.raw["spec"]["nodeName"] == "n1"
    assert after.annotations == {"keep": "me", "scheduling.koordinator.sh/device-allocated": "{}"}
    assert int(after.resource_version) > int(before.resource_version)
    # The stored raw of the old record is untouched (records handed out stay valid).
    assert "nodeName" not in before.raw["spec"] or not before.raw["spec"]["nodeName"]
    assert before.raw["metadata"]["annotations"] == {"keep": "me"}


def test_a_bind_without_annotations_adds_none() -> None:
    cluster = InMemoryCluster()
    cluster.apply_pod(make_pod("p").obj())
    cluster.bind(cluster.pods["default/p"], "n1", {})
    after = cluster.pods["default/p"]
    assert after == decode_pod(after.raw)
    assert "annotations" not in after.raw["metadata"]
