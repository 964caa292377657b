"""Why a pod does not fit: per node, the filter that rejects it; per GPU card, free against need;
the nodes where it would fit after evicting lower-priority pods; the closest candidates.

Role: ``explain(scheduler, pod)`` answers from a ``Scheduler``'s own state (its profiles'
Framework, its cache's Snapshot and the plugins' device ledger): the same PreFilter and Filter
code the scheduling cycle runs, never a copy of it. The per-card account is
``scheduler.observability.inspect.card_usage`` (what the node agents enforce). The preemption
what-if is the profile's own DefaultPreemption: per node whose Filter status is resolvable, its
``select_victims`` (minimal victims, PDB-protected pods reprieved first, DeviceShare's RemovePod)
and, when the pod fits nowhere, its ``pick_one_node`` over those candidates in the snapshot's
order: the node and victims the scheduler would nominate and evict. A profile without
DefaultPreemption, or a pod with ``preemptionPolicy: Never``, preempts nothing. The closest
candidates leave out nodes that reject the pod unresolvably (cordoned, tainted, wrong labels).

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
from scheduler.framework.status import Code, Status
from scheduler.framework.types import Snapshot
from scheduler.observability.inspect import CardUsage, card_usage, table
from scheduler.plugins.defaultpreemption.plugin import (
    NAME as DEFAULT_PREEMPTION,
)
from scheduler.plugins.defaultpreemption.plugin import (
    NEVER,
    Candidate,
    DefaultPreemption,
    pick_one_node,
)

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
    pdb_violations: int = 0
    """How many of ``victims`` a PodDisruptionBudget protects (the scheduler avoids them)."""
    resolvable: bool = True
    """False when the node rejects the pod UnschedulableAndUnresolvable (cordoned, tainted,
    the wrong labels or GPU model): no eviction could help there."""

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
    need_memory_ratio: int = 0
    """Per card, when the pod asks for a share of each card's memory (gpu-memory-ratio)."""
    preempt_node: str = ""
    """Where the scheduler's DefaultPreemption would nominate the pod ("" when it would not)."""
    preempt_victims: tuple[str, ...] = ()
    no_preemption: str = ""
    """Why nothing is preempted although the pod fits nowhere ("" otherwise)."""


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


def _preemption_plugin(fwk: Framework) -> DefaultPreemption | None:
    if DEFAULT_PREEMPTION not in fwk.plugins_at("post_filter"):
        return None
    plugin = fwk.plugin(DEFAULT_PREEMPTION)
    return plugin if isinstance(plugin, DefaultPreemption) else None


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
    cards_needed = _gpu_need(pod, 0)[0]
    state = CycleState()
    pre: Status | None = fwk.run_pre_filter(state, pod)
    preemption = _preemption_plugin(fwk)
    why_not = ""
    if pre is not None:
        why_not = "rejected at PreFilter"
    elif preemption is None:
        why_not = f"{DEFAULT_PREEMPTION} is not enabled in profile {fwk.name}"
    elif pod.preemption_policy == "Never":
        why_not = NEVER
    verdicts: dict[str, NodeVerdict] = {}
    candidates: list[Candidate] = []
    for info in snapshot.node_infos():  # the scheduler's order: its dry run's tie-break
        if info.node is None:
            continue
        cards = _cards(by_node.get(info.name, []), pod)[0]
        status = pre if pre is not None else fwk.run_filter(state, pod, info)
        if status is None:
            verdicts[info.name] = NodeVerdict(info.name, True, "", (), cards)
            continue
        resolvable = status.code != Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        found: Candidate | Status | None = None
        if not why_not and resolvable and preemption is not None:
            # The scheduler's own dry run for one node: minimal victims, PDBs reprieved first.
            found = preemption.select_victims(state.clone(), pod, info.copy(), preemption.pdbs())
        after = isinstance(found, Candidate)
        if isinstance(found, Candidate):
            candidates.append(found)
        verdicts[info.name] = NodeVerdict(
            info.name,
            False,
            status.plugin or "",
            tuple(status.reasons),
            cards,
            after,
            tuple(v.key for v in found.victims) if isinstance(found, Candidate) else (),
            found.pdb_violations if isinstance(found, Candidate) else 0,
            resolvable,
        )
    ordered = [verdicts[name] for name in sorted(verdicts)]
    best: Candidate | None = None
    if any(v.fits for v in ordered):
        why_not = ""
        candidates = []
    elif not why_not:
        fine = [c for c in candidates if not c.pdb_violations]
        best = pick_one_node(fine + [c for c in candidates if c.pdb_violations])
        if best is None:
            why_not = "no node fits even after evicting every pod of lower priority"
    closest = sorted(
        (v for v in ordered if not v.fits and v.resolvable),
        key=lambda v: (
            not v.fits_after_preemption,
            v.pdb_violations,
            -v.cards_fitting,
            len(v.victims),
            v.node,
        ),
    )
    if best is not None:
        closest.sort(key=lambda v: v.node != best.node)
    core, ratio, memory = _per_card(pod, cards_needed)
    return Explanation(
        pod.key,
        fwk.name,
        pod.priority,
        cards_needed,
        core,
        memory,
        pre.message if pre is not None else "",
        tuple(ordered),
        tuple(v.node for v in closest[:CLOSEST]),
        ratio,
        best.node if best is not None else "",
        tuple(v.key for v in best.victims) if best is not None else (),
        why_not,
    )


def _per_card(pod: Pod, cards: int) -> tuple[int, int, int]:
    """(gpu-core, gpu-memory-ratio, gpu-memory bytes) the pod asks of each card, from its own
    request: the header does not depend on any one node's card size."""
    if not cards:
        return 0, 0, 0
    req = pod.requests
    if req.get(NVIDIA_GPU, 0):
        return 100, 100, 0
    return (
        req.get(GPU_CORE, 0) // cards,
        req.get(GPU_MEMORY_RATIO, 0) // cards,
        req.get(GPU_MEMORY, 0) // cards,
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
        memory = _gib(e.need_memory) if e.need_memory else f"{e.need_memory_ratio}% of its"
        lines.append(
            f"needs {e.cards_needed} GPU card(s), each {e.need_core} gpu-core and {memory} memory"
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
        after = "-"
        if not v.fits:
            after = "no" if v.resolvable else "no (unresolvable)"
        if v.fits_after_preemption:
            after = f"yes, evicting {', '.join(v.victims)}"
            if v.pdb_violations:
                after += f" ({v.pdb_violations} protected by a PodDisruptionBudget)"
        rows.append(
            [v.node, "yes" if v.fits else "no", v.plugin or "-", "; ".join(v.reasons) or "-",
             cards or "-", after]
        )  # fmt: skip
    lines.append(table(rows).rstrip("\n"))
    if e.preempt_node:
        lines.append(
            f"preemption: the scheduler would nominate {e.preempt_node}, evicting "
            f"{', '.join(e.preempt_victims)}"
        )
    elif e.no_preemption:
        lines.append(f"no preemption: {e.no_preemption}")
    if e.closest:
        lines.append(f"closest candidates: {', '.join(e.closest)}")
    return "\n".join(lines) + "\n"
