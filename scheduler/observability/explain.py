"""Why a pod does not fit: per node, the filter that rejects it; per GPU card, free against need;
the nodes where it would fit after evicting lower-priority pods; the closest candidates.

Role: ``explain(scheduler, pod)`` answers from a ``Scheduler``'s own state (its profiles'
Framework, its cache's Snapshot and the plugins' device ledger): the same PreFilter and Filter
code the scheduling cycle runs, never a copy of it. The per-card account is
``scheduler.observability.inspect.card_usage`` (what the node agents enforce). The preemption
what-if is the kube-scheduler dry run in its simplest form: on a copy of the node's NodeInfo
without the pods of lower priority (and through the PreFilter extensions' ``remove_pod``, so
DeviceShare frees their cards in its cycle-state overlay), the filters run again. The full
preemption plugin (minimal victim sets, PDBs) is a later issue.

Invariants: explain never mutates the scheduler: a fresh CycleState per question, NodeInfo
copies for the what-if, no Reserve. The caller runs it on the thread that owns the scheduler
(the scheduling thread, or a scheduler built for the question). ``render_table`` and
``to_json`` are pure.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from apis.core import Node, Pod
from apis.device import Device
from apis.resources import GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.runtime import Framework
from scheduler.framework.status import Status
from scheduler.framework.types import NodeInfo, Snapshot
from scheduler.observability.inspect import CardUsage, card_usage, table

__all__ = ["CardFit", "Explanation", "NodeVerdict", "explain", "render_table", "to_json"]

NVIDIA_GPU = "nvidia.com/gpu"
CLOSEST = 3


class SchedulerLike(Protocol):
    """What explain reads of ``scheduler.core.Scheduler``."""

    @property
    def profiles(self) -> Mapping[str, Framework]: ...


@dataclass(frozen=True, slots=True)
class CardFit:
    minor: int
    healthy: bool
    free_core: int
    free_memory: int
    need_core: int
    need_memory: int

    @property
    def fits(self) -> bool:
        return (
            self.healthy
            and self.free_core >= self.need_core
            and (self.free_memory >= self.need_memory)
        )


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    node: str
    fits: bool
    plugin: str
    reasons: tuple[str, ...]
    cards: tuple[CardFit, ...] = ()
    fits_after_preemption: bool = False
    victims: tuple[str, ...] = ()

    @property
    def cards_fitting(self) -> int:
        return sum(1 for c in self.cards if c.fits)


@dataclass(frozen=True, slots=True)
class Explanation:
    pod: str
    profile: str
    priority: int
    cards_needed: int
    need_core: int
    need_memory: int
    pre_filter: str = ""
    nodes: tuple[NodeVerdict, ...] = ()
    closest: tuple[str, ...] = field(default=())


def _gpu_need(pod: Pod, card_memory: int) -> tuple[int, int, int]:
    """(cards, gpu-core per card, bytes per card) the pod asks for; (0, 0, 0) without GPUs."""
    req = pod.requests
    whole = req.get(NVIDIA_GPU, 0)
    if whole:
        return whole, 100, card_memory
    core, ratio, memory = req.get(GPU_CORE, 0), req.get(GPU_MEMORY_RATIO, 0), req.get(GPU_MEMORY, 0)
    if not (core or ratio or memory):
        return 0, 0, 0
    cards = max(1, core // 100, ratio // 100) if max(core, ratio) > 100 else 1
    per_memory = memory // cards if memory else ratio * card_memory // 100 // cards
    return cards, core // cards, per_memory


def _cards(usage: Sequence[CardUsage], pod: Pod) -> tuple[tuple[CardFit, ...], int, int, int]:
    gpus = [c for c in usage if c.device_type == "gpu"]
    card_memory = gpus[0].memory_total if gpus else 0
    cards, core, memory = _gpu_need(pod, card_memory)
    if not cards:
        return (), 0, 0, 0
    fits = tuple(
        CardFit(
            c.minor,
            c.healthy,
            c.core_total - c.core_used,
            c.memory_total - c.memory_used,
            core,
            memory,
        )
        for c in gpus
    )
    return fits, cards, core, memory


def _copy_without(info: NodeInfo, victims: Iterable[Pod]) -> NodeInfo:
    gone = {v.uid or v.key for v in victims}  # NodeInfo.pods is keyed by UID
    copy = NodeInfo(info.name, info.slot)
    copy.node = info.node
    copy.generation = info.generation
    for key, p in info.pods.items():
        if key in gone:
            continue
        copy.pods[key] = p
        for r, v in p.requests.items():
            if v:
                copy.requested[r] = copy.requested.get(r, 0) + v
    return copy


def _what_if(fwk: Framework, pod: Pod, info: NodeInfo) -> tuple[bool, tuple[str, ...]]:
    victims = [p for p in info.pods.values() if p.priority < pod.priority]
    if not victims:
        return False, ()
    state = CycleState()
    if fwk.run_pre_filter(state, pod) is not None:
        return False, ()
    for victim in victims:
        status = fwk.run_pre_filter_remove_pod(state, pod, victim, info)
        if status is not None:
            return False, ()
    ok = fwk.run_filter(state, pod, _copy_without(info, victims)) is None
    return ok, tuple(sorted(v.key for v in victims)) if ok else ()


def explain(
    scheduler: SchedulerLike,
    snapshot: Snapshot,
    pod: Pod,
    nodes: Mapping[str, Node],
    devices: Iterable[Device],
    pods: Iterable[Pod],
) -> Explanation:
    """The explanation for ``pod`` (see the module docstring). ``nodes``/``devices``/``pods``
    are the objects the scheduler's caches hold (for the per-card account)."""
    fwk = scheduler.profiles.get(pod.scheduler_name)
    if fwk is None:
        raise ValueError(
            f"pod {pod.key} asks for scheduler {pod.scheduler_name!r}, which is not a profile "
            f"of this scheduler ({', '.join(sorted(scheduler.profiles))})"
        )
    usage = card_usage(nodes, devices, [p for p in pods if p.key != pod.key])
    by_node: dict[str, list[CardUsage]] = {}
    for c in usage:
        by_node.setdefault(c.node, []).append(c)
    any_cards = next(iter(by_node.values()), [])
    _, cards_needed, need_core, need_memory = _cards(any_cards, pod)
    state = CycleState()
    pre: Status | None = fwk.run_pre_filter(state, pod)
    verdicts: list[NodeVerdict] = []
    for info in sorted(snapshot.node_infos(), key=lambda i: i.name):
        if info.node is None:
            continue
        cards, n, core, memory = _cards(by_node.get(info.name, []), pod)
        cards_needed, need_core, need_memory = (
            (n, core, memory) if n else (cards_needed, need_core, need_memory)
        )
        status = pre if pre is not None else fwk.run_filter(state, pod, info)
        if status is None:
            verdicts.append(NodeVerdict(info.name, True, "", (), cards))
            continue
        after, victims = _what_if(fwk, pod, info) if pre is None else (False, ())
        verdicts.append(
            NodeVerdict(
                info.name, False, status.plugin or "", tuple(status.reasons), cards, after, victims
            )
        )
    closest = sorted(
        (v for v in verdicts if not v.fits),
        key=lambda v: (not v.fits_after_preemption, -v.cards_fitting, len(v.victims), v.node),
    )
    return Explanation(
        pod.key,
        fwk.name,
        pod.priority,
        cards_needed,
        need_core,
        need_memory,
        pre.message if pre is not None else "",
        tuple(verdicts),
        tuple(v.node for v in closest[:CLOSEST]),
    )


def to_json(e: Explanation) -> str:
    doc: dict[str, Any] = asdict(e)
    for node, verdict in zip(doc["nodes"], e.nodes, strict=True):
        for card, fit in zip(node["cards"], verdict.cards, strict=True):
            card["fits"] = fit.fits
    return json.dumps(doc, indent=2) + "\n"


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f}Gi"


def render_table(e: Explanation) -> str:
    lines = [f"pod {e.pod} (profile {e.profile}, priority {e.priority})"]
    if e.cards_needed:
        lines.append(
            f"needs {e.cards_needed} GPU card(s), each {e.need_core} gpu-core and "
            f"{_gib(e.need_memory)} memory"
        )
    if e.pre_filter:
        lines.append(f"rejected before any node was looked at: {e.pre_filter}")
    rows = [["NODE", "FITS", "FILTER", "REASON", "CARDS FREE (core/memory)", "AFTER PREEMPTION"]]
    for v in e.nodes:
        cards = " ".join(
            f"{c.minor}:{c.free_core}/{_gib(c.free_memory)}{'' if c.fits else '✗'}"
            + ("" if c.healthy else "(unhealthy)")
            for c in v.cards
        )
        after = (
            "-"
            if v.fits
            else (f"yes, evicting {', '.join(v.victims)}" if v.fits_after_preemption else "no")
        )
        rows.append(
            [v.node, "yes" if v.fits else "no", v.plugin or "-", "; ".join(v.reasons) or "-",
             cards or "-", after]
        )  # fmt: skip
    lines.append(table(rows).rstrip("\n"))
    if e.closest:
        lines.append(f"closest candidates: {', '.join(e.closest)}")
    return "\n".join(lines) + "\n"
