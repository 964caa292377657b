"""gpushare's device-plugin protocol, pure: fake devices per memory unit and the Allocate answer.

Role: what koordlet's ``aliyun.com/gpu-mem`` device plugin decides, without any I/O (SPEC §10):

- ``fake_devices``: one device per memory unit per card (ID ``<GPU-UUID>-_-<j>``), healthy
  exactly when its card is, with the card's NUMA node as topology. Cards are taken one by one
  with their own size (gpushare assumed identical cards and advertised ``total / count``).
- ``choose_pod``: gpushare's protocol to find whose container the kubelet is allocating for —
  the kubelet only says how many units each container gets, and it calls Allocate **once per
  container** (init containers first, then the app containers). Among the node's pods that are
  still pending and carry ``ALIYUN_COM_GPU_MEM_ASSIGNED=false``, a candidate is a pod with a
  container not served yet that asks for exactly that many units (several container requests
  in one call: the pod must have a container left for each). A pod already partly served comes
  first (the kubelet admits one pod at a time, so the next calls are for its other
  containers), then the oldest ``ALIYUN_COM_GPU_MEM_ASSUME_TIME`` (then namespace/name, so the
  choice is deterministic). The caller keeps which containers were served
  (``served``: units per pod UID) and marks the pod assigned once every one was.
- ``pending_pods``: the candidates read off a PodList's items, the same rule whichever source
  listed them (the API server, or the kubelet's ``/pods`` with ``--query-kubelet``): pods bound
  to this node, Pending, with ``ALIYUN_COM_GPU_MEM_ASSIGNED=false``, each UID once.
- ``allocate_envs``: the env of each container of that pod (``NVIDIA_VISIBLE_DEVICES``, the
  card index; ``ALIYUN_COM_GPU_MEM_IDX``/``_POD``/``_CONTAINER``/``_DEV``) and
  ``assigned_annotations``, the patch that marks the pod as served.

Invariants (fail closed): an Allocate that cannot be matched to exactly one pod, or whose pod's
card is unknown, unhealthy or too small, raises ``AllocateError`` with one clear line — it never
answers with some card; the kubelet then fails the container instead of starting it on a GPU it
was not given. Two pods asking for the same size on different cards can still be swapped by
this protocol (the kubelet does not say which pod it allocates for); where the runtime-hook
path is active, the GPU hook sets ``NVIDIA_VISIBLE_DEVICES`` from the pod's own annotation and
corrects that.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from apis.gpushare import (
    ANNOTATION_ASSIGN_TIME,
    ANNOTATION_ASSIGNED,
    ANNOTATION_ASSUME_TIME,
    ANNOTATION_DEV,
    ANNOTATION_IDX,
    ANNOTATION_POD,
    RESOURCE_GPU_COUNT,
    RESOURCE_GPU_MEM,
    MemoryUnit,
)

__all__ = [
    "ANNOTATION_ASSIGNED",
    "ANNOTATION_ASSIGN_TIME",
    "ANNOTATION_ASSUME_TIME",
    "ANNOTATION_DEV",
    "ANNOTATION_IDX",
    "ANNOTATION_POD",
    "DEVICE_ID_SEPARATOR",
    "ENV_CONTAINER",
    "ENV_DEV",
    "ENV_IDX",
    "ENV_POD",
    "ENV_VISIBLE_DEVICES",
    "RESOURCE_GPU_COUNT",
    "RESOURCE_GPU_MEM",
    "AllocateError",
    "Card",
    "FakeDevice",
    "MemoryUnit",
    "PendingPod",
    "PodConflict",
    "allocate_envs",
    "assigned_annotations",
    "card_of_device",
    "choose_pod",
    "fake_devices",
    "pending_pods",
    "remaining",
]

DEVICE_ID_SEPARATOR: Final = "-_-"

ENV_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
ENV_IDX: Final = "ALIYUN_COM_GPU_MEM_IDX"
ENV_POD: Final = "ALIYUN_COM_GPU_MEM_POD"
ENV_CONTAINER: Final = "ALIYUN_COM_GPU_MEM_CONTAINER"
ENV_DEV: Final = "ALIYUN_COM_GPU_MEM_DEV"


class PodConflict(Exception):
    """The pod changed (or is gone) since it was read: re-read and try again."""


class AllocateError(Exception):
    """An Allocate that cannot be answered; ``str()`` is one line for the kubelet's event."""


@dataclass(frozen=True, slots=True)
class Card:
    """One GPU as the plugin advertises it."""

    index: int
    """The card's index as gpushare counts it (the NVIDIA minor number)."""
    uuid: str
    memory_bytes: int
    healthy: bool = True
    numa_node: int | None = None

    def units(self, unit: MemoryUnit) -> int:
        return self.memory_bytes // unit.bytes


@dataclass(frozen=True, slots=True)
class FakeDevice:
    id: str
    healthy: bool
    numa_node: int | None


def fake_devices(cards: Iterable[Card], unit: MemoryUnit) -> list[FakeDevice]:
    """One device per memory unit of each card, in card index order."""
    return [
        FakeDevice(f"{card.uuid}{DEVICE_ID_SEPARATOR}{j}", card.healthy, card.numa_node)
        for card in sorted(cards, key=lambda c: c.index)
        for j in range(card.units(unit))
    ]


def card_of_device(device_id: str) -> str:
    """The card UUID of a fake device ID (the whole ID when it has no separator)."""
    return device_id.rpartition(DEVICE_ID_SEPARATOR)[0] or device_id


@dataclass(frozen=True, slots=True)
class PendingPod:
    """A pod bound to this node and not running yet, as the plugin needs it."""

    namespace: str
    name: str
    uid: str
    units: int
    """Total ``aliyun.com/gpu-mem`` limits of the pod's containers."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    resource_version: str = ""
    containers: tuple[int, ...] = ()
    """The ``aliyun.com/gpu-mem`` limit of each container that has one, in the kubelet's
    allocation order (init containers, then app containers); empty means one container of
    ``units``."""

    @property
    def slots(self) -> Counter[int]:
        """The units of each container the kubelet will call Allocate for."""
        return Counter(self.containers or ((self.units,) if self.units > 0 else ()))

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def assume_time(self) -> int:
        try:
            return int(self.annotations.get(ANNOTATION_ASSUME_TIME, ""))
        except ValueError:
            return 0


def remaining(pod: PendingPod, served: Mapping[str, Counter[int]]) -> Counter[int]:
    """The units of the pod's containers not served yet."""
    left = pod.slots
    left.subtract(served.get(pod.uid, Counter()))
    return +left


def choose_pod(
    pods: Iterable[PendingPod],
    container_units: Sequence[int],
    unit: MemoryUnit,
    served: Mapping[str, Counter[int]] | None = None,
) -> PendingPod:
    """The pod an Allocate of ``container_units`` (one entry per container) is for; see the
    module."""
    served = served or {}
    need = Counter(container_units)
    waiting = [
        p
        for p in pods
        if p.annotations.get(ANNOTATION_ASSIGNED) == "false" and ANNOTATION_IDX in p.annotations
    ]
    matching = [p for p in waiting if need <= remaining(p, served)]
    if not matching:
        sizes = sorted({n for p in waiting for n in remaining(p, served)})
        seen = f"; waiting containers ask for {', '.join(map(str, sizes))}" if sizes else ""
        asked = " + ".join(map(str, container_units))
        raise AllocateError(
            f"no pending pod on this node has a container left that asks for {asked} "
            f"{unit.name} of {RESOURCE_GPU_MEM} with {ANNOTATION_ASSIGNED}=false{seen}"
        )
    return min(matching, key=lambda p: (p.uid not in served, p.assume_time, p.namespace, p.name))


def _card_for(pod: PendingPod, cards: Sequence[Card], unit: MemoryUnit) -> Card:
    raw = pod.annotations.get(ANNOTATION_IDX, "")
    try:
        index = int(raw)
    except ValueError:
        raise AllocateError(
            f"pod {pod.key}: {ANNOTATION_IDX}={raw!r} is not a card index"
        ) from None
    card = next((c for c in cards if c.index == index), None)
    if card is None:
        raise AllocateError(f"pod {pod.key}: card {index} ({ANNOTATION_IDX}) is not on this node")
    if not card.healthy:
        raise AllocateError(f"pod {pod.key}: card {index} is unhealthy")
    if pod.units > card.units(unit):
        raise AllocateError(
            f"pod {pod.key}: asks for {pod.units} {unit.name} but card {index} has "
            f"{card.units(unit)}"
        )
    return card


def allocate_envs(
    pod: PendingPod,
    container_units: Sequence[int],
    cards: Sequence[Card],
    unit: MemoryUnit,
) -> list[dict[str, str]]:
    """The env of each container of an Allocate (in request order) for ``pod``."""
    card = _card_for(pod, cards, unit)
    return [
        {
            ENV_VISIBLE_DEVICES: str(card.index),
            ENV_IDX: str(card.index),
            ENV_POD: str(pod.units),
            ENV_CONTAINER: str(n),
            ENV_DEV: str(card.units(unit)),
        }
        for n in container_units
    ]


def assigned_annotations(now_ns: int) -> dict[str, str]:
    """The patch that marks a pod as served by Allocate."""
    return {ANNOTATION_ASSIGNED: "true", ANNOTATION_ASSIGN_TIME: str(now_ns)}


# -- the candidates, from a PodList ----------------------------------------------------------


def _mapping(v: object) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _str_map(v: object) -> dict[str, str]:
    return {str(k): str(val) for k, val in _mapping(v).items() if val is not None}


def _container_units(c: object) -> int:
    raw = _mapping(_mapping(_mapping(c).get("resources")).get("limits")).get(RESOURCE_GPU_MEM)
    try:
        return int(str(raw)) if raw is not None else 0
    except ValueError:
        return 0


def _containers(spec: Mapping[str, Any], *keys: str) -> list[object]:
    out: list[object] = []
    for key in keys:
        value = spec.get(key)
        out += value if isinstance(value, list) else []
    return out


def pending_pods(items: Iterable[object], node_name: str) -> list[PendingPod]:
    """The candidates among a PodList's ``items``: on ``node_name``, Pending, with
    ``ALIYUN_COM_GPU_MEM_ASSIGNED=false``, each UID once (malformed items are skipped).
    ``units`` sums the app containers' limits (gpushare reads limits only, of those only);
    ``containers`` lists every container's, in the kubelet's Allocate order."""
    out: list[PendingPod] = []
    seen: set[str] = set()
    for pod in items:
        meta, spec = _mapping(_mapping(pod).get("metadata")), _mapping(_mapping(pod).get("spec"))
        uid = str(meta.get("uid") or "")
        annotations = _str_map(meta.get("annotations"))
        if (
            spec.get("nodeName") != node_name
            or _mapping(_mapping(pod).get("status")).get("phase") != "Pending"
            or annotations.get(ANNOTATION_ASSIGNED) != "false"
            or uid in seen
        ):
            continue
        seen.add(uid)
        units = (_container_units(c) for c in _containers(spec, "initContainers", "containers"))
        out.append(
            PendingPod(
                namespace=str(meta.get("namespace") or ""),
                name=str(meta.get("name") or ""),
                uid=uid,
                units=sum(_container_units(c) for c in _containers(spec, "containers")),
                annotations=annotations,
                resource_version=str(meta.get("resourceVersion") or ""),
                containers=tuple(n for n in units if n > 0),
            )
        )
    return out
