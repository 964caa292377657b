"""koordlet run against a real kube-apiserver with the shipped Device CRD (config/crd/): the
GPU interconnect reaches the Device CR as the ``scheduling.koordinator.sh/gpu-topology``
annotation and decodes back to exactly what the agent discovered (with the partition table
derived from it, ``scheduling.koordinator.sh/gpu-partitions``), while a link field put in
``spec.devices[].topology`` would be pruned by the (Koordinator-shaped) structural schema."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

if TYPE_CHECKING:
    from apiserver import ApiServer

from apis.device import ANNOTATION_GPU_TOPOLOGY, Device
from apis.topology import connectivity_score
from koordlet.devices.fake import FakeLibrary
from koordlet.reporting.partitions import derive_partitions
from tests.e2e.test_koordlet_sync import GROUP, PLURAL, REPO, VERSION, Koordlet, _name, _node, _wait

pytestmark = pytest.mark.e2e

SHIPPED_CRD = REPO / "config" / "crd" / "devices.scheduling.koordinator.sh.yaml"
EXAMPLE = REPO / "config" / "examples" / "fake-gpus-a100-nvlink-pairs.yaml"


def _install_shipped_crd(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    crd = yaml.safe_load(SHIPPED_CRD.read_text())
    ext.create_custom_resource_definition(crd)

    def established() -> bool:
        got = ext.read_custom_resource_definition(crd["metadata"]["name"])
        return any(
            c.type == "Established" and c.status == "True" for c in (got.status.conditions or [])
        )

    _wait(established, what="CRD established")
    custom = client.CustomObjectsApi(api)
    _wait(
        lambda: custom.list_cluster_custom_object(GROUP, VERSION, PLURAL) is not None,
        what="devices endpoint",
    )


def test_topology_round_trips_through_the_shipped_crd(
    make_apiserver: Callable[..., ApiServer], tmp_path: Path
) -> None:
    srv = make_apiserver()
    api = client.ApiClient(srv.client_configuration())
    try:
        _install_shipped_crd(api)
        core = client.CoreV1Api(api)
        custom = client.CustomObjectsApi(api)
        node = _name("nvlink-node")
        core.create_node(_node(node))
        discovered = FakeLibrary.from_file(EXAMPLE).discover().topology
        assert len(discovered.links) == 28

        agent = Koordlet(
            [
                "--node-name",
                node,
                "--kubeconfig",
                srv.kubeconfig_path(),
                "--fake-gpus",
                str(EXAMPLE),
                "--kubelet-root",
                str(tmp_path),
                "--sync-interval",
                "1s",
                "--socket",
                "",
                "--metrics-bind-address",
                "127.0.0.1:0",
            ],
            tmp_path / "koordlet.log",
        )
        try:

            def published() -> Device | None:
                try:
                    doc = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, node)
                except ApiException as exc:
                    if exc.status == 404:
                        return None
                    raise
                device = Device.from_dict(doc)
                return device if ANNOTATION_GPU_TOPOLOGY in device.annotations else None

            device = _wait(published, what="Device CR with the gpu-topology annotation")
            agent.alive()
            topology = device.gpu_topology()
            assert topology == discovered
            pair = topology.link(1, 0)
            assert pair is not None
            assert (pair.link_type, pair.nvlinks, pair.bandwidth) == (
                "NVLink",
                12,
                discovered.links[0].bandwidth,
            )
            assert str(pair.bandwidth) == "300G" and pair.common_ancestor == "Single"
            cross = topology.link(0, 4)
            assert cross is not None and (cross.link_type, cross.common_ancestor) == (
                "PCIe",
                "System",
            )
            assert connectivity_score(topology, [0, 1]) > connectivity_score(topology, [0, 2])
            assert [d.minor for d in device.devices] == list(range(8))
            # The partition table koordlet derives from that topology rides along (issue 13):
            # NVLink pairs on this box, each an allocatable 2-GPU partition.
            table = device.gpu_partitions()
            assert table is not None and table == derive_partitions(discovered, range(8))
            pairs = {p.minors for p in table.of_size(2)}
            assert (0, 1) in pairs and (0, 2) not in pairs
        finally:
            rc = agent.stop()
        assert rc == 0, agent.log.read_text()

        # Why an annotation: the structural schema drops link fields inside spec topology.
        probe: dict[str, Any] = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Device",
            "metadata": {"name": _name("probe")},
            "spec": {
                "devices": [
                    {
                        "type": "gpu",
                        "id": "GPU-probe",
                        "minor": 0,
                        "health": True,
                        "topology": {
                            "socketID": -1,
                            "nodeID": 0,
                            "pcieID": "pci0000:16",
                            "p2pLinks": [{"peerMinor": "1", "type": "NVLink"}],
                        },
                    }
                ]
            },
        }
        stored = custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, probe)
        assert "p2pLinks" not in stored["spec"]["devices"][0]["topology"]
        assert stored["spec"]["devices"][0]["topology"]["pcieID"] == "pci0000:16"
    finally:
        api.close()
