"""Koordinator's gang API: pod annotations, lightweight pod-group labels, the PodGroup CRD.

Role: a pure decoder. ``gang_of(pod, pod_groups)`` reads a pod's gang spec from Koordinator's
``gang.scheduling.koordinator.sh/*`` annotations, else from the
``pod-group.scheduling.sigs.k8s.io`` labels: a labelled pod whose PodGroup exists (in
``pod_groups``, by ``namespace/name``) takes ``minMember`` and ``scheduleTimeoutSeconds`` from
it; without one, the lightweight ``min-available`` label; without both, the spec says
``needs_pod_group`` (the gang waits for its PodGroup, as Koordinator's uninitialised gang).
``decode_pod_group`` reads a ``scheduling.sigs.k8s.io/v1alpha1`` PodGroup; ``timed_out(pod)``
reads the scheduler's own timeout mark (``gang.scheduling.koordinator.sh/timeout: "true"``,
put on a gang's pods when its wait times out).

Invariants: a gang is identified by ``namespace/name``; a gang always belongs to its own group;
a bad value raises ``GangSpecError`` naming the annotation (never a bare traceback); a
``network-topology-spec`` with ``MustGather`` at ``NodeTopologyLayer`` marks the gang
``same_node`` (other layers are accepted and ignored: no network topology here); defaults
follow Koordinator: mode Strict, waiting time 600 s, match policy once-satisfied, total number
equal to min-available.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from apis.core import Pod
from apis.duration import DurationError, parse_go_duration_seconds
from apis.jsonload import loads
from apis.jsonshow import show

PREFIX = "gang.scheduling.koordinator.sh"
ANNOTATION_NAME = f"{PREFIX}/name"
ANNOTATION_MIN_AVAILABLE = f"{PREFIX}/min-available"
ANNOTATION_TOTAL_NUMBER = f"{PREFIX}/total-number"
ANNOTATION_MODE = f"{PREFIX}/mode"
ANNOTATION_WAITING_TIME = f"{PREFIX}/waiting-time"
ANNOTATION_GROUPS = f"{PREFIX}/groups"
ANNOTATION_MATCH_POLICY = f"{PREFIX}/match-policy"
ANNOTATION_TIMEOUT = f"{PREFIX}/timeout"
ANNOTATION_NETWORK_TOPOLOGY_SPEC = f"{PREFIX}/network-topology-spec"

LAYER_NODE = "NodeTopologyLayer"
"""The network-topology layer of one node: ``MustGather`` there keeps the gang on one node."""
GATHER_MUST = "MustGather"
GATHER_PREFER = "PreferGather"
GATHER_STRATEGIES = frozenset({GATHER_MUST, GATHER_PREFER})

LABEL_POD_GROUP_NAME = "pod-group.scheduling.sigs.k8s.io/name"
LABEL_POD_GROUP_MIN_AVAILABLE = "pod-group.scheduling.sigs.k8s.io/min-available"
LABEL_POD_GROUP = "pod-group.scheduling.sigs.k8s.io"

MODE_STRICT = "Strict"
MODE_NON_STRICT = "NonStrict"
MODES = frozenset({MODE_STRICT, MODE_NON_STRICT})

MATCH_ONLY_WAITING = "only-waiting"
MATCH_WAITING_AND_RUNNING = "waiting-and-running"
MATCH_ONCE_SATISFIED = "once-satisfied"
MATCH_POLICIES = frozenset({MATCH_ONLY_WAITING, MATCH_WAITING_AND_RUNNING, MATCH_ONCE_SATISFIED})

DEFAULT_WAITING_SECONDS = 600.0

POD_GROUP_API_VERSION = "scheduling.sigs.k8s.io/v1alpha1"


class GangSpecError(ValueError):
    """A gang annotation, label or PodGroup field is invalid; the message names it."""


@dataclass(frozen=True, slots=True)
class GangSpec:
    """One pod's view of its gang."""

    id: str  # namespace/name
    min_available: int
    total_number: int
    mode: str = MODE_STRICT
    waiting_seconds: float = DEFAULT_WAITING_SECONDS
    groups: tuple[str, ...] = ()  # gang ids, always including ``id``
    match_policy: str = MATCH_ONCE_SATISFIED
    same_node: bool = False
    """``network-topology-spec`` gathers the gang ``MustGather`` at ``NodeTopologyLayer``:
    every member on one node, their cards together the best-connected set there."""
    source: str = "annotations"
    """Where the spec came from: "annotations", "labels" or "PodGroup"."""
    needs_pod_group: bool = False
    """Labelled with a pod group that has neither a PodGroup object nor a min-available
    label: the gang is not defined yet (its members wait for the PodGroup)."""


@dataclass(frozen=True, slots=True)
class PodGroup:
    """A decoded ``scheduling.sigs.k8s.io/v1alpha1`` PodGroup."""

    namespace: str
    name: str
    min_member: int
    schedule_timeout_seconds: float | None = None
    resource_version: str = ""

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def key(self) -> str:
        """The store key, ``namespace/name`` (the gang id of the pods labelled with it)."""
        return self.id


def parse_duration(text: str, field: str) -> float:
    """A Go duration such as ``30s``, ``1m30s``, ``1h`` in seconds (> 0), read as Koordinator
    reads the annotation (``time.ParseDuration``)."""
    try:
        total = parse_go_duration_seconds(text)
    except DurationError:
        total = 0.0
    if total <= 0:
        raise GangSpecError(f"{field}: invalid duration {text!r} (want e.g. 30s, 5m, 1h)")
    return total


def _positive_int(text: str, field: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise GangSpecError(f"{field}: {text!r} is not an integer") from None
    if value < 1:
        raise GangSpecError(f"{field}: must be at least 1, got {value}")
    return value


def _groups(text: str, namespace: str, gang_id: str) -> tuple[str, ...]:
    try:
        raw = loads(text)
    except ValueError:
        raise GangSpecError(f"{ANNOTATION_GROUPS}: not a JSON list of gang names") from None
    if not isinstance(raw, list) or not all(isinstance(g, str) and g for g in raw):
        raise GangSpecError(f"{ANNOTATION_GROUPS}: not a JSON list of gang names")
    ids = {g if "/" in g else f"{namespace}/{g}" for g in raw}
    ids.add(gang_id)
    return tuple(sorted(ids))


def _same_node(text: str) -> bool:
    """Koordinator's ``{"gatherStrategy":[{"layer":..,"strategy":..}]}``: True when it says
    ``MustGather`` at ``NodeTopologyLayer`` (other layers are accepted and not acted on)."""
    field = ANNOTATION_NETWORK_TOPOLOGY_SPEC
    try:
        raw = loads(text)
    except ValueError:
        raise GangSpecError(f"{field}: not a JSON object") from None
    if not isinstance(raw, dict):
        raise GangSpecError(f"{field}: not a JSON object")
    strategies = raw.get("gatherStrategy")
    if strategies is None:
        strategies = []
    if not isinstance(strategies, list):
        raise GangSpecError(f"{field}: gatherStrategy is not a list")
    same = False
    for i, entry in enumerate(strategies):
        if not isinstance(entry, dict) or not isinstance(entry.get("layer"), str):
            raise GangSpecError(f"{field}: gatherStrategy[{i}] needs a layer")
        strategy = entry.get("strategy", GATHER_PREFER)
        if not isinstance(strategy, str) or strategy not in GATHER_STRATEGIES:
            raise GangSpecError(
                f"{field}: gatherStrategy[{i}].strategy {show(strategy)} is not MustGather or "
                "PreferGather"
            )
        if entry["layer"] == LAYER_NODE and strategy == GATHER_MUST:
            same = True
    return same


TIMEOUT_MARK = "true"
"""The value of ``gang.scheduling.koordinator.sh/timeout`` on a timed-out gang's pods."""


def timed_out(pod: Pod) -> bool:
    """True when the scheduler marked the pod's gang as timed out (Koordinator's check)."""
    return pod.annotations.get(ANNOTATION_TIMEOUT) == TIMEOUT_MARK


def pod_group_name(pod: Pod) -> str:
    """The pod group a pod is labelled with ('' when none)."""
    return pod.labels.get(LABEL_POD_GROUP_NAME, "") or pod.labels.get(LABEL_POD_GROUP, "")


def gang_marker(pod: Pod) -> str:
    """``namespace/name`` of the gang a pod asks to belong to, by annotation or pod-group label
    ('' when none) — whatever plugin would schedule it."""
    name = pod.annotations.get(ANNOTATION_NAME, "") or pod_group_name(pod)
    return f"{pod.namespace}/{name}" if name else ""


def spec_of_pod_group(group: PodGroup) -> GangSpec:
    """The gang a PodGroup defines: ``minMember`` members (Strict, once-satisfied), waiting
    ``scheduleTimeoutSeconds`` (Koordinator's default when unset)."""
    waiting = group.schedule_timeout_seconds or DEFAULT_WAITING_SECONDS
    return GangSpec(
        group.id,
        group.min_member,
        group.min_member,
        waiting_seconds=waiting,
        groups=(group.id,),
        source="PodGroup",
    )


def gang_of(pod: Pod, pod_groups: Mapping[str, PodGroup] | None = None) -> GangSpec | None:
    """The pod's gang, or None when it belongs to none. Raises GangSpecError on bad values.

    ``pod_groups``: the PodGroups known, by ``namespace/name`` (labelled pods only)."""
    ann = pod.annotations
    name = ann.get(ANNOTATION_NAME, "")
    if name:
        gang_id = f"{pod.namespace}/{name}"
        if ANNOTATION_MIN_AVAILABLE not in ann:
            raise GangSpecError(f"{ANNOTATION_MIN_AVAILABLE}: required with {ANNOTATION_NAME}")
        min_available = _positive_int(ann[ANNOTATION_MIN_AVAILABLE], ANNOTATION_MIN_AVAILABLE)
        total = min_available
        if ANNOTATION_TOTAL_NUMBER in ann:
            total = _positive_int(ann[ANNOTATION_TOTAL_NUMBER], ANNOTATION_TOTAL_NUMBER)
            if total < min_available:
                raise GangSpecError(
                    f"{ANNOTATION_TOTAL_NUMBER}: {total} is less than min-available {min_available}"
                )
        mode = ann.get(ANNOTATION_MODE, MODE_STRICT)
        if mode not in MODES:
            raise GangSpecError(f"{ANNOTATION_MODE}: {mode!r} is not Strict or NonStrict")
        policy = ann.get(ANNOTATION_MATCH_POLICY, MATCH_ONCE_SATISFIED)
        if policy not in MATCH_POLICIES:
            allowed = ", ".join(sorted(MATCH_POLICIES))
            raise GangSpecError(f"{ANNOTATION_MATCH_POLICY}: {policy!r} is not one of {allowed}")
        waiting = DEFAULT_WAITING_SECONDS
        if ANNOTATION_WAITING_TIME in ann:
            waiting = parse_duration(ann[ANNOTATION_WAITING_TIME], ANNOTATION_WAITING_TIME)
        groups: tuple[str, ...] = (gang_id,)
        if ANNOTATION_GROUPS in ann:
            groups = _groups(ann[ANNOTATION_GROUPS], pod.namespace, gang_id)
        same_node = False
        if ANNOTATION_NETWORK_TOPOLOGY_SPEC in ann:
            same_node = _same_node(ann[ANNOTATION_NETWORK_TOPOLOGY_SPEC])
        return GangSpec(gang_id, min_available, total, mode, waiting, groups, policy, same_node)
    label = pod_group_name(pod)
    if not label:
        return None
    gang_id = f"{pod.namespace}/{label}"
    group = pod_groups.get(gang_id) if pod_groups is not None else None
    if group is not None:
        return spec_of_pod_group(group)
    text = pod.labels.get(LABEL_POD_GROUP_MIN_AVAILABLE)
    if text is None:
        return GangSpec(gang_id, 1, 1, groups=(gang_id,), source="labels", needs_pod_group=True)
    min_available = _positive_int(text, LABEL_POD_GROUP_MIN_AVAILABLE)
    return GangSpec(gang_id, min_available, min_available, groups=(gang_id,), source="labels")


def decode_pod_group(obj: Mapping[str, Any]) -> PodGroup:
    """A PodGroup from its JSON shape; raises GangSpecError naming the field."""
    if not isinstance(obj, Mapping):
        raise GangSpecError(f"PodGroup: not an object, got {type(obj).__name__}")
    meta = obj.get("metadata") or {}
    if not isinstance(meta, Mapping):
        raise GangSpecError("PodGroup metadata: not an object")
    name, namespace = meta.get("name"), meta.get("namespace") or "default"
    if not isinstance(name, str) or not name:
        raise GangSpecError("PodGroup metadata.name: required")
    if not isinstance(namespace, str):
        raise GangSpecError(f"PodGroup {name} metadata.namespace: not a string")
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise GangSpecError(f"PodGroup {namespace}/{name} spec: not an object")
    min_member = spec.get("minMember", 1)
    if not isinstance(min_member, int) or isinstance(min_member, bool) or min_member < 1:
        raise GangSpecError(f"PodGroup {namespace}/{name} spec.minMember: must be an integer >= 1")
    timeout = spec.get("scheduleTimeoutSeconds")
    if timeout is not None and (
        not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 1
    ):
        raise GangSpecError(
            f"PodGroup {namespace}/{name} spec.scheduleTimeoutSeconds: must be an integer >= 1"
        )
    rv = str(meta.get("resourceVersion") or "")
    seconds = None if timeout is None else float(timeout)
    return PodGroup(namespace, name, min_member, seconds, resource_version=rv)
