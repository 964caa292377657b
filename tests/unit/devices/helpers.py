"""Small builders for the DeviceShare tests: Device CRs, ledgers, plugins and cycles.

Device CRs are written as v1alpha1 dict literals and decoded with ``Device.from_dict`` (the
way the adapters decode them); pods and nodes come from ``tests.builders``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from hypothesis import strategies as st

from apis.allocation import (
    ANNOTATION_DEVICE_ALLOCATED,
    AllocatedVF,
    AllocationExtension,
    DeviceAllocation,
    encode_allocations,
)
from apis.core import Pod
from apis.device import Device
from apis.partition import (
    ANNOTATION_GPU_PARTITIONS,
    LABEL_GPU_PARTITION_POLICY,
    GPUPartition,
    PartitionTable,
)
from apis.quantity import Quantity, int_value
from apis.resources import GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, RDMA
from apis.topology import ANNOTATION_GPU_TOPOLOGY, LINK_NVLINK, GPULink, GPUTopology
from scheduler.devices.ledger import NodeDeviceLedger
from scheduler.devices.request import RESOURCES_BY_TYPE
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import Change
from scheduler.framework.interfaces import Handle
from scheduler.framework.status import Status
from scheduler.framework.types import NodeInfo, Snapshot
from scheduler.plugins.deviceshare import new_deviceshare
from scheduler.plugins.deviceshare.args import DeviceShareArgs
from scheduler.plugins.deviceshare.plugin import DeviceShare
from tests.builders import ManualClock, PodBuilder, RecordingClient, make_node, make_pod

GI = 1024**3


def gpu(
    minor: int,
    memory: str = "80Gi",
    *,
    health: bool = True,
    core: int = 100,
    pcie: str | None = None,
    numa: int = 0,
    labels: Mapping[str, str] | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    """One GPU entry of a Device CR (``id`` defaults to ``GPU-<minor>``)."""
    card: dict[str, Any] = {
        "type": "gpu",
        "id": uid if uid is not None else f"GPU-{minor}",
        "minor": minor,
        "health": health,
        "resources": {
            "koordinator.sh/gpu-core": str(core),
            "koordinator.sh/gpu-memory": memory,
            "koordinator.sh/gpu-memory-ratio": "100",
        },
    }
    if pcie is not None:
        card["topology"] = {"socketID": numa, "nodeID": numa, "pcieID": pcie}
    if labels:
        card["labels"] = dict(labels)
    return card


def vf_bus(minor: int, vf: int) -> str:
    """The bus id of VF ``vf`` of NIC ``minor`` in ``nic``'s VF groups."""
    return f"0000:{minor + 0x10:02x}:00.{vf + 1}"


def nic(
    device_type: str, minor: int, *, pcie: str | None = None, numa: int = 0, health: bool = True,
    vfs: int = 0,
) -> dict[str, Any]:
    """An ``rdma`` or ``fpga`` entry with 100 units (and ``vfs`` SR-IOV VFs in one group
    labelled ``type: general``)."""
    card: dict[str, Any] = {
        "type": device_type,
        "id": f"{device_type}-{minor}",
        "minor": minor,
        "health": health,
        "resources": {f"koordinator.sh/{device_type}": "100"},
    }
    if vfs:
        card["vfGroups"] = [{"labels": {"type": "general"}, "vfs": [
            {"minor": i, "busID": vf_bus(minor, i)} for i in range(vfs)
        ]}]
    if pcie is not None:
        card["topology"] = {"socketID": numa, "nodeID": numa, "pcieID": pcie}
    return card


def device(
    node: str, *cards: dict[str, Any], annotations: Mapping[str, str] | None = None
) -> Device:
    meta: dict[str, Any] = {"name": node}
    if annotations:
        meta["annotations"] = dict(annotations)
    return Device.from_dict(
        {
            "apiVersion": "scheduling.koordinator.sh/v1alpha1",
            "kind": "Device",
            "metadata": meta,
            "spec": {"devices": list(cards)},
        }
    )


def gpus(node: str, count: int, memory: str = "80Gi", **kwargs: Any) -> Device:
    return device(node, *(gpu(m, memory, **kwargs) for m in range(count)))


def topo_gpus(node: str, layout: Iterable[tuple[int, str]], memory: str = "80Gi") -> Device:
    """GPUs ``minor, numa, pcie`` from ``(numa, pcie)`` pairs in minor order."""
    return device(
        node, *(gpu(m, memory, numa=numa, pcie=pcie) for m, (numa, pcie) in enumerate(layout))
    )


def gpu_pod(
    name: str, requests: Mapping[str, Any], annotations: Mapping[str, str] | None = None
) -> PodBuilder:
    pod = make_pod(name).req(cpu="1").req({k: str(v) for k, v in requests.items()})
    for key, value in (annotations or {}).items():
        pod.annotation(key, value)
    return pod


def bound(pod: PodBuilder, node: str, allocation: str | None = None) -> Pod:
    """``pod`` assigned to ``node``, carrying ``allocation`` as its device-allocated text."""
    pod.node(node)
    if allocation is not None:
        pod.annotation(ANNOTATION_DEVICE_ALLOCATED, allocation)
    return pod.build()


def verify(ledger: NodeDeviceLedger) -> None:
    """Assert the ledger's invariants from its ``snapshot_state()``: a card's ``used`` is the
    sum of its holders' amounts, ``total`` is the declared amount of a healthy card in the
    Device CR (else 0), ``free = max(total - used, 0)``, and the row sums match the cards."""
    state = ledger.snapshot_state()
    expected: dict[tuple[str, str, int], list[int]] = {}
    holdings = [(node, uses) for node, _, uses in state["holders"].values()]
    holdings += [(node, uses) for node, _, uses in state["checkpoints"].values()]
    for node, uses in holdings:
        for use in uses:
            names = RESOURCES_BY_TYPE[use.device_type]
            acc = expected.setdefault((node, use.device_type, use.minor), [0] * len(names))
            for name, amount in use.resources:
                if name in names:
                    acc[names.index(name)] += amount
    for node, entry in state["nodes"].items():
        assert entry["device"] == ledger.has_device(node)
        for device_type, n_res in (("gpu", 3), ("rdma", 1), ("fpga", 1)):
            cards = entry["cards"].get(device_type, {})
            for minor, c in cards.items():
                want = expected.pop((node, device_type, minor), [0] * n_res)
                meta = c["meta"]
                total = meta.declared if meta is not None and meta.healthy else (0,) * n_res
                assert list(c["used"]) == want, (node, device_type, minor)
                assert min(want) >= 0, (node, device_type, minor)  # nothing frees a card
                assert c["total"] == total, (node, device_type, minor)
                free = [max(t - u, 0) for t, u in zip(total, want, strict=True)]
                assert list(c["free"]) == free
                parts = [f * 1000 // t for t, f in zip(total, free, strict=True) if t > 0]
                assert c["share"] == (min(parts) if parts else 0), (node, device_type, minor)
                assert c["exists"] == (meta is not None)
                assert c["healthy"] == (meta is not None and meta.healthy)
            sum_total = tuple(sum(c["total"][i] for c in cards.values()) for i in range(n_res))
            sum_alloc = tuple(sum(c["total"][i] - c["free"][i] for c in cards.values())
                              for i in range(n_res))
            assert entry["sums"][device_type] == (sum_total, sum_alloc), (node, device_type)
    assert not {k: v for k, v in expected.items() if any(v)}, expected


def gpu_alloc(minor: int, ratio: int, memory: int, core: int | None = None) -> str:
    """A one-card ``device-allocated`` text as the scheduler writes it."""
    resources = {GPU_MEMORY_RATIO: ratio, GPU_MEMORY: memory}
    if core is not None:
        resources[GPU_CORE] = core
    return encode_allocations({"gpu": [DeviceAllocation.from_ints(minor, resources)]})


def ledger_of(devices: Iterable[Device], pods: Iterable[Pod] = ()) -> NodeDeviceLedger:
    ledger = NodeDeviceLedger(rows=2, cards=2)
    for d in devices:
        ledger.apply_change(Change("Device", None, d))
    for p in pods:
        ledger.apply_change(Change("Pod", None, p))
    return ledger


def snapshot_of(names: Iterable[str]) -> Snapshot:
    snapshot = Snapshot()
    for name in names:
        snapshot.set_node(make_node(name).cpu("64").build())
    return snapshot


def plugin_of(
    devices: Iterable[Device],
    pods: Iterable[Pod] = (),
    args: Mapping[str, Any] | None = None,
    nodes: Iterable[str] | None = None,
) -> tuple[DeviceShare, Snapshot]:
    """A plugin (through ``new_deviceshare``) fed with ``devices`` and ``pods`` events."""
    devices = list(devices)
    names = list(nodes) if nodes is not None else [d.name for d in devices]
    snapshot = snapshot_of(names)
    handlers: list[Callable[[Change], None]] = []
    handle = Handle(snapshot, RecordingClient(), ManualClock(), event_handlers=handlers)
    plugin = new_deviceshare(dict(args or {}), handle)
    for change in [Change("Device", None, d) for d in devices] + [
        Change("Pod", None, p) for p in pods
    ]:
        for handler in handlers:
            handler(change)
    return plugin, snapshot


def plugin_with_ledger(ledger: NodeDeviceLedger, args: DeviceShareArgs | None = None
                       ) -> DeviceShare:
    return DeviceShare(ledger, args)


def info(snapshot: Snapshot, name: str) -> NodeInfo:
    node = snapshot.get(name)
    assert node is not None, name
    return node


def prefilter(plugin: DeviceShare, pod: Pod) -> tuple[CycleState, Status | None]:
    state = CycleState()
    return state, plugin.pre_filter(state, pod)


def reasons(status: Status | None) -> tuple[str, ...]:
    return () if status is None else status.reasons


# ---------------------------------------------------------------------------------------------
# Random ledgers for the property tests

card_st = st.tuples(
    st.integers(0, 7), st.sampled_from(["16Gi", "40Gi", "80Gi"]), st.booleans(),
    st.integers(0, 100), st.integers(0, 60),
)


@st.composite
def ledgers(draw: st.DrawFn, max_nodes: int = 6) -> NodeDeviceLedger:
    """Nodes ``n0..`` with random GPUs (some unhealthy), NICs and FPGAs, partly allocated."""
    ledger = NodeDeviceLedger(rows=1, cards=1)
    for n in range(draw(st.integers(1, max_nodes))):
        specs = draw(st.lists(card_st, max_size=6, unique_by=lambda c: c[0]))
        vfs = draw(st.integers(0, 2))
        nics = [nic(t, m, pcie=f"pci{m}", vfs=vfs if t == "rdma" else 0)
                for t in ("rdma", "fpga") for m in range(draw(st.integers(0, 2)))]
        cards = [gpu(m, mem, health=h, pcie=f"pci{m // 2}", numa=m // 4)
                 for m, mem, h, _, _ in specs]
        ledger.apply_change(Change("Device", None, device(f"n{n}", *cards, *nics)))
        for m, mem, _, ratio, nic_used in specs:
            if not ratio:
                continue
            memory = ratio * int_value(Quantity.parse(mem)) // 100
            allocations = {"gpu": [DeviceAllocation.from_ints(m, {
                GPU_CORE: ratio, GPU_MEMORY_RATIO: ratio, GPU_MEMORY: memory})]}
            if nics and nic_used:
                # NIC 0's first VF where it has VFs (each pod holds its own VF, as allocated).
                extension = AllocationExtension(vfs=(AllocatedVF(0, vf_bus(0, 0)),)) \
                    if vfs and m % 2 == 0 else None
                allocations["rdma"] = [DeviceAllocation.from_ints(0, {RDMA: nic_used},
                                                                  extension=extension)]
            pod = bound(gpu_pod(f"p{n}-{m}", {"nvidia.com/gpu": 1}), f"n{n}",
                        encode_allocations(allocations))
            ledger.apply_change(Change("Pod", None, pod))
    return ledger


# ---------------------------------------------------------------------------------------------
# Nodes with a GPU interconnect and partition tables (docs/topology.md)


def nvlink(a: int, b: int, links: int, gbs: int, *, switch: bool = False) -> GPULink:
    """An NVLink pair of ``links`` links, ``gbs`` GB/s each way."""
    return GPULink((a, b), LINK_NVLINK, links, switch, Quantity.of(gbs * 10**9), "System")


def pcie_link(a: int, b: int, ancestor: str) -> GPULink:
    return GPULink((a, b), "PCIe", common_ancestor=ancestor)


def nvswitch_topology(n: int) -> GPUTopology:
    """``n`` cards, every pair 18 links through NVSwitch at 450 GB/s (an H100 HGX box)."""
    return GPUTopology(
        tuple(nvlink(a, b, 18, 450, switch=True) for a in range(n) for b in range(a + 1, n))
    )


def pairs_topology(n: int) -> GPUTopology:
    """``n`` cards joined in NVLink pairs (0,1), (2,3), … (12 links, 300 GB/s); other pairs
    PCIe: the same NUMA node (``n // 2`` per node) ``Node``, else ``System``."""
    links: list[GPULink] = []
    half = max(n // 2, 1)
    for a in range(n):
        for b in range(a + 1, n):
            if a // 2 == b // 2:
                links.append(nvlink(a, b, 12, 300))
            else:
                links.append(pcie_link(a, b, "Node" if a // half == b // half else "System"))
    return GPUTopology(tuple(links))


def hopper_table(n: int = 8) -> PartitionTable:
    """Aligned blocks of 1, 2, 4 … ``n`` cards, score 1 (Koordinator's Hopper table)."""
    table: dict[int, tuple[GPUPartition, ...]] = {}
    k = 1
    while k <= n:
        table[k] = tuple(
            GPUPartition(tuple(range(i, i + k)), LINK_NVLINK,
                         None if k == 1 else Quantity.parse("450G"), 1)
            for i in range(0, n, k)
        )
        k *= 2
    return PartitionTable(table)


def topology_node(
    node: str,
    n: int,
    topology: GPUTopology | None = None,
    table: PartitionTable | None = None,
    policy: str | None = None,
    layout: Iterable[tuple[int, str]] | None = None,
) -> Device:
    """``n`` 80Gi GPUs with ``topology``, ``table`` and the partition ``policy`` label; PCIe
    places from ``layout`` ((numa, pcie) per minor), default two cards per switch, four per
    NUMA node."""
    places = list(layout) if layout is not None else [
        (m // 4, f"pci{m // 2}") for m in range(n)
    ]
    annotations: dict[str, str] = {}
    if topology is not None:
        annotations[ANNOTATION_GPU_TOPOLOGY] = topology.encode()
    if table is not None:
        annotations[ANNOTATION_GPU_PARTITIONS] = table.encode()
    meta: dict[str, Any] = {"name": node, "annotations": annotations}
    if policy is not None:
        meta["labels"] = {LABEL_GPU_PARTITION_POLICY: policy}
    return Device.from_dict(
        {
            "apiVersion": "scheduling.koordinator.sh/v1alpha1",
            "kind": "Device",
            "metadata": meta,
            "spec": {
                "devices": [
                    gpu(m, numa=numa, pcie=pcie) for m, (numa, pcie) in enumerate(places)
                ]
            },
        }
    )
