"""Slim, typed records of the core Kubernetes objects the scheduler reads: Pod and Node.

Objects arrive as plain JSON-shaped mappings (from YAML files, from the API server's raw JSON)
and are decoded exactly once, here, into frozen records with derived values precomputed (the
pod-level resource request, the node's allocatable resources as integers). The scheduler core
never sees the Kubernetes client's generated models.

Invariants:
- Resource amounts are integers in canonical units: ``cpu`` in millicores, everything else in
  base units rounded up (bytes for memory, counts for extended resources), as Kubernetes'
  ``MilliValue()`` / ``Value()`` do. The exact values are kept in ``requests_exact``.
- A decode error names the object and the field path, e.g.
  ``spec.containers[0].resources.requests.cpu: invalid quantity "2x"``.
- ``raw`` is the mapping the record was decoded from; it is never mutated here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from fractions import Fraction
from typing import Any, TypeVar, cast

from apis.quantity import Quantity, QuantityError

CPU = "cpu"
MEMORY = "memory"
EPHEMERAL_STORAGE = "ephemeral-storage"
PODS = "pods"

# kube-scheduler's defaults for pods that request nothing, used only for scoring.
DEFAULT_MILLI_CPU_REQUEST = 100
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024

_NON_ZERO_DEFAULTS = {
    CPU: Fraction(DEFAULT_MILLI_CPU_REQUEST, 1000),
    MEMORY: Fraction(DEFAULT_MEMORY_REQUEST),
}

NODE_SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
TOLERATION_OPERATORS = frozenset({"Equal", "Exists"})
TAINT_EFFECTS = frozenset({"NoSchedule", "PreferNoSchedule", "NoExecute"})
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
PREEMPT_LOWER_PRIORITY = "PreemptLowerPriority"
PREEMPT_NEVER = "Never"
PREEMPTION_POLICIES = (PREEMPT_LOWER_PRIORITY, PREEMPT_NEVER)


class DecodeError(ValueError):
    """An object could not be decoded; ``str()`` names the field path and the problem."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem


# ---------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True, slots=True)
class NodeSelectorRequirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    match_expressions: tuple[NodeSelectorRequirement, ...] = ()
    match_fields: tuple[NodeSelectorRequirement, ...] = ()


@dataclass(frozen=True, slots=True)
class PreferredSchedulingTerm:
    weight: int
    preference: NodeSelectorTerm


@dataclass(frozen=True, slots=True)
class NodeAffinity:
    """``required`` is None when the pod sets no required terms (which matches every node)."""

    required: tuple[NodeSelectorTerm, ...] | None = None
    preferred: tuple[PreferredSchedulingTerm, ...] = ()


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None


@dataclass(frozen=True, slots=True)
class Pod:
    namespace: str
    name: str
    uid: str
    resource_version: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    scheduler_name: str = "default-scheduler"
    node_name: str = ""
    priority: int = 0
    phase: str = "Pending"
    terminating: bool = False
    creation_timestamp: str = ""
    preemption_policy: str = PREEMPT_LOWER_PRIORITY
    """``spec.preemptionPolicy``: ``PreemptLowerPriority`` (the default) or ``Never``."""
    nominated_node_name: str = ""
    """``status.nominatedNodeName``: where a preemption made room for this pod."""
    start_time: str = ""
    """``status.startTime`` (RFC 3339), else the creation time: preemption's last tie-break."""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    node_affinity: NodeAffinity | None = None
    tolerations: tuple[Toleration, ...] = ()
    requests: Mapping[str, int] = field(default_factory=dict)
    requests_exact: Mapping[str, Fraction] = field(default_factory=dict)
    app_limits: Mapping[str, int] = field(default_factory=dict)
    """The limits of the app containers (``spec.containers``) summed, init containers left
    out: gpushare's count of a pod's ``aliyun.com/gpu-mem`` (``ALIYUN_COM_GPU_MEM_POD``)."""
    non_zero_cpu: int = DEFAULT_MILLI_CPU_REQUEST
    non_zero_memory: int = DEFAULT_MEMORY_REQUEST
    scheduling_gates: tuple[str, ...] = ()
    """``spec.schedulingGates[].name`` (GA since 1.30): while any is left the pod is not
    scheduled (kube-scheduler's SchedulingGates PreEnqueue)."""
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def assigned(self) -> bool:
        return bool(self.node_name)

    def non_zero_request(self, resource: str) -> int:
        """The request used for scoring: kube-scheduler's defaults stand in for each container's
        missing cpu/memory request (``non_zero_cpu``/``non_zero_memory``)."""
        if resource == CPU:
            return self.non_zero_cpu
        if resource == MEMORY:
            return self.non_zero_memory
        return self.requests.get(resource, 0)

    def on_node(self, node_name: str) -> Pod:
        """This pod with ``node_name`` set (an assumed pod): ``dataclasses.replace`` without its
        per-call cost (the scheduling cycle makes one per pod)."""
        clone = object.__new__(Pod)
        for name in _POD_FIELDS:
            object.__setattr__(clone, name, getattr(self, name))
        object.__setattr__(clone, "node_name", node_name)
        return clone


_POD_FIELDS = tuple(f.name for f in fields(Pod))


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    uid: str = ""
    resource_version: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    allocatable: Mapping[str, int] = field(default_factory=dict)
    capacity: Mapping[str, int] = field(default_factory=dict)
    """``status.capacity`` (allocatable when absent): gpushare reads its cards from it."""
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


# ---------------------------------------------------------------------------------------------
# Decoding helpers


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise DecodeError(path, f"expected a mapping, got {type(value).__name__}")
    return value


def _list(value: Any, path: str) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise DecodeError(path, f"expected a list, got {type(value).__name__}")
    return value


def _str(value: Any, path: str, default: str = "") -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise DecodeError(path, f"expected a string, got {type(value).__name__}")
    return value


def _int(value: Any, path: str, default: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise DecodeError(path, f"expected an integer, got {value!r}")
    return value


def _str_map(value: Any, path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in _mapping(value, path).items():
        if not isinstance(k, str):
            raise DecodeError(path, f"expected string keys, got {k!r}")
        if v is None:
            v = ""
        elif isinstance(v, bool | int | float):
            # YAML turns `gpu: true` into a bool; Kubernetes would reject it, we name it.
            raise DecodeError(f"{path}.{k}", f"expected a string, got {v!r} (quote it)")
        out[k] = _str(v, f"{path}.{k}")
    return out


_QUANTITY_VALUES: dict[str, Fraction] = {}
"""Quantity text -> its non-negative value, for ``_resource_list``: a cluster's pods repeat a
few texts ("1", "4Gi"), and a parse (Fractions, rounding) was most of a pod's decode in B2.
Only valid, non-negative texts are kept; bounded by ``_QUANTITY_CACHE_MAX`` (cleared when
full). Values are immutable ``Fraction`` objects, so sharing them is safe."""
_QUANTITY_CACHE_MAX = 4096


def _resource_list(value: Any, path: str) -> dict[str, Fraction]:
    out: dict[str, Fraction] = {}
    for name, raw in _mapping(value, path).items():
        if type(raw) is str:
            cached = _QUANTITY_VALUES.get(raw)
            if cached is not None:
                out[str(name)] = cached
                continue
        where = f"{path}.{name}"
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            raise DecodeError(where, f"invalid quantity {raw!r}")
        try:
            q = Quantity.parse(raw)
        except QuantityError as exc:
            raise DecodeError(where, str(exc)) from None
        if q.value < 0:
            raise DecodeError(where, f"must be non-negative, got {raw!r}")
        if type(raw) is str:
            if len(_QUANTITY_VALUES) >= _QUANTITY_CACHE_MAX:
                _QUANTITY_VALUES.clear()
            _QUANTITY_VALUES[raw] = q.value
        out[str(name)] = q.value
    return out


def _to_int(resource: str, value: Fraction) -> int:
    """Round up to the canonical integer unit: millicores for cpu, base units otherwise."""
    if resource == CPU:
        value = value * 1000
    return -((-value.numerator) // value.denominator)


def _add(into: dict[str, Fraction], other: Mapping[str, Fraction]) -> None:
    # A new key takes the value itself (``0 + v`` is ``v``; Fractions are immutable): the
    # Fraction additions were a fifth of a pod's decode, which the API adapter does twice per
    # bound pod (the LIST, then the bind's watch update).
    for k, v in other.items():
        cur = into.get(k)
        into[k] = v if cur is None else cur + v


def _max(into: dict[str, Fraction], other: Mapping[str, Fraction]) -> None:
    # Amounts are never negative (``_resource_list``), so a missing key always takes ``v``.
    for k, v in other.items():
        cur = into.get(k)
        if cur is None or v > cur:
            into[k] = v


# Pod-level resources (``spec.resources``, beta and on by default since 1.34): the resources a
# pod-level request replaces (component-helpers' IsSupportedPodLevelResource).
POD_LEVEL_RESOURCES = frozenset({CPU, MEMORY})
HUGEPAGES_PREFIX = "hugepages-"


def _pod_level(name: str) -> bool:
    return name in POD_LEVEL_RESOURCES or name.startswith(HUGEPAGES_PREFIX)


def pod_level_requests(spec: Mapping[str, Any], path: str = "spec") -> dict[str, Fraction]:
    """``spec.resources.requests`` of the resources a pod-level request may set (cpu, memory,
    hugepages-*); empty when the pod sets none (kube's IsPodLevelRequestsSet is then false)."""
    if spec.get("resources") is None:
        return {}
    res = _mapping(spec.get("resources"), f"{path}.resources")
    reqs = _resource_list(res.get("requests"), f"{path}.resources.requests")
    return {k: v for k, v in reqs.items() if _pod_level(k)}


def _resize_infeasible(status: Mapping[str, Any]) -> bool:
    """kube's IsPodResizeInfeasible: the first PodResizePending condition says Infeasible."""
    for cond in _list(status.get("conditions"), "status.conditions"):
        if isinstance(cond, Mapping) and cond.get("type") == "PodResizePending":
            return cond.get("reason") == "Infeasible"
    return False


def status_changes_requests(spec: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Whether ``status`` can make a pod's requests differ from its spec's (``pod_requests``
    with and without it): a resize the kubelet found infeasible, pod-level resources in the
    status, or a container status whose allocated or actuated requests are not, text for
    text, its spec's. False for nearly every running pod (no resize under way), which then
    costs its decode nothing more. Anything unexpected answers True: the full arithmetic (and
    its errors) decides."""
    if not isinstance(status, Mapping) or not status:
        return False
    if status.get("allocatedResources") is not None or status.get("resources") is not None:
        return True
    conditions = status.get("conditions")
    if conditions:
        if not isinstance(conditions, list):
            return True
        for cond in conditions:
            if isinstance(cond, Mapping) and cond.get("type") == "PodResizePending":
                return True
    wanted: dict[str, Any] = {}
    for key in ("containers", "initContainers"):
        containers = spec.get(key)
        if containers is None:
            continue
        if not isinstance(containers, list):
            return True
        for c in containers:
            if not isinstance(c, Mapping) or not isinstance(c.get("name"), str):
                return True
            res = c.get("resources")
            wanted[c["name"]] = res.get("requests") if isinstance(res, Mapping) else None
    for key in ("containerStatuses", "initContainerStatuses"):
        statuses = status.get(key)
        if statuses is None:
            continue
        if not isinstance(statuses, list):
            return True
        for cs in statuses:
            if not isinstance(cs, Mapping):
                return True
            name = cs.get("name")
            if name not in wanted:
                continue  # a status of no container: pod_requests never reads it
            want = wanted[name]
            if cs.get("allocatedResources") not in (None, want):
                return True
            actuated = cs.get("resources")
            if actuated is not None and (
                not isinstance(actuated, Mapping) or actuated.get("requests") not in (None, want)
            ):
                return True
    return False


def _spec_requests(cmap: Mapping[str, Any], where: str) -> dict[str, Fraction]:
    """A container's requests as its spec asks them (a new dict)."""
    res = _mapping(cmap.get("resources"), f"{where}.resources")
    reqs = _resource_list(res.get("requests"), f"{where}.resources.requests")
    # The API server's defaulting (SetDefaults_Pod): a limit without a request is also the
    # request. Objects read from an API server already carry it; files may not (gpushare
    # pods, for one, set only limits of aliyun.com/gpu-mem).
    limits = _resource_list(res.get("limits"), f"{where}.resources.limits")
    for name, value in limits.items():
        reqs.setdefault(name, value)
    return reqs


_ContainerRequests = Callable[[Mapping[str, Any], str], "dict[str, Fraction] | None"]


def _aggregate(
    spec: Mapping[str, Any],
    path: str,
    get: _ContainerRequests,
    missing_defaults: Mapping[str, Fraction] | None,
) -> dict[str, Fraction]:
    """kube's aggregateContainerResourcesByFn: the app containers (+ sidecars) summed, then
    the max with each init container (+ the sidecars before it); ``get`` gives a container's
    requests (a new dict, or None for none)."""

    def one(cmap: Mapping[str, Any], where: str) -> dict[str, Fraction]:
        reqs = get(cmap, where) or {}
        if missing_defaults:
            for name, value in missing_defaults.items():
                reqs.setdefault(name, value)
        return reqs

    reqs: dict[str, Fraction] = {}
    for i, c in enumerate(_list(spec.get("containers"), f"{path}.containers")):
        cpath = f"{path}.containers[{i}]"
        _add(reqs, one(_mapping(c, cpath), cpath))
    inits = spec.get("initContainers")
    if inits is None:
        return reqs
    sidecars: dict[str, Fraction] = {}
    init_max: dict[str, Fraction] = {}
    for i, c in enumerate(_list(inits, f"{path}.initContainers")):
        cpath = f"{path}.initContainers[{i}]"
        cmap = _mapping(c, cpath)
        creqs = one(cmap, cpath)
        if cmap.get("restartPolicy") == "Always":
            # Sidecar init containers run alongside the app containers.
            _add(reqs, creqs)
            _add(sidecars, creqs)
            effective = dict(sidecars)
        else:
            effective = dict(creqs)
            _add(effective, sidecars)
        _max(init_max, effective)
    _max(reqs, init_max)
    return reqs


def pod_requests(
    spec: Mapping[str, Any],
    path: str = "spec",
    missing_defaults: Mapping[str, Fraction] | None = None,
    status: Mapping[str, Any] | None = None,
) -> dict[str, Fraction]:
    """kube's pod-level request (component-helpers' PodRequests as kube-scheduler v1.37 calls
    it for the pods it accounts): max(sum of app containers (+ sidecars), each init
    (+ the sidecars before it)), then pod-level requests of cpu/memory/hugepages replace the
    containers' sum, then overhead. A container's limit stands in for its missing request, as
    the API server's defaulting does.

    With ``status`` (in-place resize, GA since 1.35): the containers' sums are taken three
    times, from the spec, from what the kubelet allocated (``containerStatuses[].
    allocatedResources``) and from what it actuated (``containerStatuses[].resources.
    requests``), and the larger of each resource counts, so that a pod being resized holds
    the most it may use; a resize the kubelet found infeasible counts what it runs with, not
    the spec. Pod-level ``status.allocatedResources``/``status.resources`` stand in for the
    containers' status when both are set. A pending pod has no container status: its spec
    alone counts, as it does on a server without these fields (1.20).

    ``missing_defaults`` stand in for a container's *missing* requests (an explicit 0 stays 0),
    as kube-scheduler's non-zero requests for scoring do.
    """
    reqs = _aggregate(spec, path, _spec_requests, missing_defaults)
    if status is not None:
        reqs = _with_status(spec, path, missing_defaults, _mapping(status, "status"), reqs)
    pod_level = pod_level_requests(spec, path)
    if pod_level:
        if status is not None and status.get("resources") is not None:
            # In-place resize of pod-level resources (beta, on since 1.36): what the kubelet
            # allocated and actuated for the pod counts too.
            pod_resources = _mapping(status.get("resources"), "status.resources")
            effective = {} if _resize_infeasible(status) else dict(pod_level)
            actuated_pod = pod_resources.get("requests")
            if actuated_pod is not None:
                _max(effective, _resource_list(actuated_pod, "status.resources.requests"))
            if status.get("allocatedResources") is not None:
                _max(
                    effective,
                    _resource_list(status.get("allocatedResources"), "status.allocatedResources"),
                )
            pod_level = {k: v for k, v in effective.items() if _pod_level(k)}
        reqs.update(pod_level)
    overhead = spec.get("overhead")
    if overhead is not None:
        _add(reqs, _resource_list(overhead, f"{path}.overhead"))
    return reqs


def _with_status(
    spec: Mapping[str, Any],
    path: str,
    missing_defaults: Mapping[str, Fraction] | None,
    st: Mapping[str, Any],
    spec_sum: dict[str, Fraction],
) -> dict[str, Fraction]:
    """The containers' sum under in-place resize (kube's AggregateContainerRequests with
    UseStatusResources): max(spec, actuated, allocated), each summed on its own."""
    infeasible = bool(st) and _resize_infeasible(st)
    by_name: dict[str, Mapping[str, Any]] = {}
    for key in ("containerStatuses", "initContainerStatuses"):
        for i, cs in enumerate(_list(st.get(key), f"status.{key}")):
            csm = _mapping(cs, f"status.{key}[{i}]")
            name = csm.get("name")
            if isinstance(name, str):
                by_name.setdefault(name, csm)
    pod_resources = _mapping(st.get("resources"), "status.resources")
    pod_allocated = st.get("allocatedResources")
    if not (by_name or infeasible or pod_allocated is not None):
        # With no status of its own, a container's allocated and actuated requests are its
        # spec's: the max is the spec's sum.
        return spec_sum

    def status_of(cmap: Mapping[str, Any], where: str) -> Mapping[str, Any] | None:
        return by_name.get(_str(cmap.get("name"), f"{where}.name"))

    def allocated(cmap: Mapping[str, Any], where: str) -> dict[str, Fraction] | None:
        cs = status_of(cmap, where)
        if cs is not None and cs.get("allocatedResources") is not None:
            return _resource_list(cs.get("allocatedResources"), f"{where}.allocatedResources")
        return None if infeasible else _spec_requests(cmap, where)

    def actuated(cmap: Mapping[str, Any], where: str) -> dict[str, Fraction] | None:
        cs = status_of(cmap, where)
        if cs is not None:
            res = _mapping(cs.get("resources"), f"{where}.resources")
            if res.get("requests") is not None:
                return _resource_list(res.get("requests"), f"{where}.resources.requests")
            if cs.get("allocatedResources") is not None:
                return _resource_list(cs.get("allocatedResources"), f"{where}.allocatedResources")
        return None if infeasible else _spec_requests(cmap, where)

    reqs = {} if infeasible else spec_sum
    if pod_allocated is not None and pod_resources.get("requests") is not None:
        _max(reqs, _resource_list(pod_allocated, "status.allocatedResources"))
        _max(reqs, _resource_list(pod_resources["requests"], "status.resources.requests"))
    else:
        _max(reqs, _aggregate(spec, path, actuated, missing_defaults))
        _max(reqs, _aggregate(spec, path, allocated, missing_defaults))
    return reqs


def app_limits(spec: Mapping[str, Any], path: str = "spec") -> dict[str, Fraction]:
    """The app containers' limits summed (no init container, no defaulting from requests)."""
    out: dict[str, Fraction] = {}
    for i, c in enumerate(_list(spec.get("containers"), f"{path}.containers")):
        cpath = f"{path}.containers[{i}]"
        res = _mapping(_mapping(c, cpath).get("resources"), f"{cpath}.resources")
        _add(out, _resource_list(res.get("limits"), f"{cpath}.resources.limits"))
    return out


def _requirement(value: Any, path: str) -> NodeSelectorRequirement:
    m = _mapping(value, path)
    key = _str(m.get("key"), f"{path}.key")
    op = _str(m.get("operator"), f"{path}.operator")
    if op not in NODE_SELECTOR_OPERATORS:
        allowed = ", ".join(sorted(NODE_SELECTOR_OPERATORS))
        raise DecodeError(f"{path}.operator", f"unknown operator {op!r} (allowed: {allowed})")
    values = tuple(
        _str(v, f"{path}.values[{i}]") for i, v in enumerate(_list(m.get("values"), path))
    )
    if op in ("In", "NotIn") and not values:
        raise DecodeError(f"{path}.values", f"must be non-empty for operator {op}")
    if op in ("Exists", "DoesNotExist") and values:
        raise DecodeError(f"{path}.values", f"must be empty for operator {op}")
    if op in ("Gt", "Lt"):
        if len(values) != 1:
            raise DecodeError(f"{path}.values", f"must have one element for operator {op}")
        try:
            int(values[0])
        except ValueError:
            raise DecodeError(
                f"{path}.values[0]", f"must be an integer, got {values[0]!r}"
            ) from None
    return NodeSelectorRequirement(key=key, operator=op, values=values)


def _term(value: Any, path: str) -> NodeSelectorTerm:
    m = _mapping(value, path)
    exprs = tuple(
        _requirement(r, f"{path}.matchExpressions[{i}]")
        for i, r in enumerate(_list(m.get("matchExpressions"), f"{path}.matchExpressions"))
    )
    fields = tuple(
        _requirement(r, f"{path}.matchFields[{i}]")
        for i, r in enumerate(_list(m.get("matchFields"), f"{path}.matchFields"))
    )
    for i, r in enumerate(fields):
        if r.key != "metadata.name" or r.operator not in ("In", "NotIn"):
            raise DecodeError(
                f"{path}.matchFields[{i}]", "only metadata.name with In or NotIn is supported"
            )
    return NodeSelectorTerm(match_expressions=exprs, match_fields=fields)


def _node_affinity(affinity: Mapping[str, Any], path: str) -> NodeAffinity | None:
    na = _mapping(affinity.get("nodeAffinity"), f"{path}.nodeAffinity")
    if not na:
        return None
    path = f"{path}.nodeAffinity"
    req_key = "requiredDuringSchedulingIgnoredDuringExecution"
    pref_key = "preferredDuringSchedulingIgnoredDuringExecution"
    required: tuple[NodeSelectorTerm, ...] | None = None
    if na.get(req_key) is not None:
        sel = _mapping(na.get(req_key), f"{path}.{req_key}")
        required = tuple(
            _term(t, f"{path}.{req_key}.nodeSelectorTerms[{i}]")
            for i, t in enumerate(
                _list(sel.get("nodeSelectorTerms"), f"{path}.{req_key}.nodeSelectorTerms")
            )
        )
    preferred = []
    for i, p in enumerate(_list(na.get(pref_key), f"{path}.{pref_key}")):
        ppath = f"{path}.{pref_key}[{i}]"
        pm = _mapping(p, ppath)
        weight = _int(pm.get("weight"), f"{ppath}.weight")
        if not 1 <= weight <= 100:
            raise DecodeError(f"{ppath}.weight", f"must be in the range 1-100, got {weight}")
        preferred.append(PreferredSchedulingTerm(weight, _term(pm.get("preference"), ppath)))
    return NodeAffinity(required=required, preferred=tuple(preferred))


def _toleration(value: Any, path: str) -> Toleration:
    m = _mapping(value, path)
    op = _str(m.get("operator"), f"{path}.operator", "Equal")
    if op not in TOLERATION_OPERATORS:
        raise DecodeError(f"{path}.operator", f"unknown operator {op!r} (allowed: Equal, Exists)")
    effect = _str(m.get("effect"), f"{path}.effect")
    if effect and effect not in TAINT_EFFECTS:
        raise DecodeError(f"{path}.effect", f"unknown effect {effect!r}")
    seconds = m.get("tolerationSeconds")
    return Toleration(
        key=_str(m.get("key"), f"{path}.key"),
        operator=op,
        value=_str(m.get("value"), f"{path}.value"),
        effect=effect,
        toleration_seconds=None if seconds is None else _int(seconds, f"{path}.tolerationSeconds"),
    )


def _taint(value: Any, path: str) -> Taint:
    m = _mapping(value, path)
    effect = _str(m.get("effect"), f"{path}.effect")
    if effect not in TAINT_EFFECTS:
        raise DecodeError(f"{path}.effect", f"unknown effect {effect!r}")
    key = _str(m.get("key"), f"{path}.key")
    if not key:
        raise DecodeError(f"{path}.key", "must be non-empty")
    return Taint(key=key, value=_str(m.get("value"), f"{path}.value"), effect=effect)


def _preemption_policy(value: Any) -> str:
    policy = _str(value, "spec.preemptionPolicy") or PREEMPT_LOWER_PRIORITY
    if policy not in PREEMPTION_POLICIES:
        raise DecodeError(
            "spec.preemptionPolicy",
            f"unknown policy {policy!r} (expected {' or '.join(PREEMPTION_POLICIES)})",
        )
    return policy


# ---------------------------------------------------------------------------------------------
# Sharing repeated parts of records

T = TypeVar("T")
V = TypeVar("V")
_SHARED_MAX = 4096
_shared_values: dict[Any, Any] = {}
_shared_maps: dict[tuple[tuple[str, Any], ...], dict[str, Any]] = {}


def _shared(value: T) -> T:
    """One object per equal value for the small parts most pods repeat (the API server's
    default tolerations, a Deployment's labels, a request shape): a scheduler holding 50,000
    pods keeps a few of each instead of 50,000. Records are never mutated (the invariant every
    consumer already keeps), so sharing is safe; the table is bounded and simply restarts."""
    got = _shared_values.get(value)
    if got is not None:
        return cast(T, got)
    if len(_shared_values) >= _SHARED_MAX:
        _shared_values.clear()
    _shared_values[value] = value
    return value


def _shared_map(m: dict[str, V]) -> dict[str, V]:
    if not m:
        return _EMPTY_MAP
    key = tuple(m.items())
    got = _shared_maps.get(key)
    if got is not None:
        return got
    if len(_shared_maps) >= _SHARED_MAX:
        _shared_maps.clear()
    _shared_maps[key] = m
    return m


_EMPTY_MAP: dict[str, Any] = {}


# ---------------------------------------------------------------------------------------------
# Public decoders


def drop_managed_fields(doc: Any) -> Any:
    """``doc`` (an object as decoded from JSON, or a list of them with ``items``) without
    ``metadata.managedFields``, removed in place from the object and from each of its
    ``items``; anything else is returned as it is.

    Server-side apply's bookkeeping is read by nothing here, is often the largest part of
    an object, and is the one field of the objects we read where a tenant can nest JSON at
    will (``fieldsV1``, up to 10,000 levels): kept, it would make ``json.dumps``,
    ``copy.deepcopy`` or ``==`` of the object recurse past the interpreter's limit."""
    if isinstance(doc, dict):
        meta = doc.get("metadata")
        if isinstance(meta, dict):
            meta.pop("managedFields", None)
        items = doc.get("items")
        if isinstance(items, list):
            for item in items:
                if isinstance(item, dict):
                    item_meta = item.get("metadata")
                    if isinstance(item_meta, dict):
                        item_meta.pop("managedFields", None)
    return doc


def _scheduling_gates(value: Any) -> tuple[str, ...]:
    if not value:
        return ()
    return _shared(
        tuple(
            _str(
                _mapping(g, f"spec.schedulingGates[{i}]").get("name"),
                f"spec.schedulingGates[{i}].name",
            )
            for i, g in enumerate(_list(value, "spec.schedulingGates"))
        )
    )


def decode_pod(obj: Mapping[str, Any]) -> Pod:
    """Decode a v1 Pod mapping; raises DecodeError naming the field."""
    obj = _mapping(obj, "")
    meta = _mapping(obj.get("metadata"), "metadata")
    name = _str(meta.get("name"), "metadata.name")
    if not name:
        raise DecodeError("metadata.name", "must be non-empty")
    namespace = _str(meta.get("namespace"), "metadata.namespace", "default") or "default"
    spec = _mapping(obj.get("spec"), "spec")
    status = _mapping(obj.get("status"), "status")
    # The status counts only where a resize is under way (decode_pod's hot path skips it).
    resized = status if status_changes_requests(spec, status) else None
    requests_exact = pod_requests(spec, status=resized)
    # kube-scheduler's non-zero requests (getNonMissingContainerRequests): with pod-level
    # requests set, a container's missing cpu or memory is defaulted only where the pod as a
    # whole has none.
    if pod_level_requests(spec):
        defaults = {k: v for k, v in _NON_ZERO_DEFAULTS.items() if k not in requests_exact}
    else:
        defaults = _NON_ZERO_DEFAULTS
    non_zero = (
        pod_requests(spec, missing_defaults=defaults, status=resized)
        if defaults
        else requests_exact
    )
    affinity = _mapping(spec.get("affinity"), "spec.affinity")
    return Pod(
        namespace=namespace,
        name=name,
        uid=_str(meta.get("uid"), "metadata.uid") or f"{namespace}/{name}",
        resource_version=_str(meta.get("resourceVersion"), "metadata.resourceVersion"),
        labels=_shared_map(_str_map(meta.get("labels"), "metadata.labels")),
        annotations=_shared_map(_str_map(meta.get("annotations"), "metadata.annotations")),
        scheduler_name=_str(spec.get("schedulerName"), "spec.schedulerName", "default-scheduler")
        or "default-scheduler",
        node_name=_str(spec.get("nodeName"), "spec.nodeName"),
        priority=_int(spec.get("priority"), "spec.priority"),
        phase=_str(status.get("phase"), "status.phase", "Pending") or "Pending",
        terminating=meta.get("deletionTimestamp") is not None,
        creation_timestamp=str(meta.get("creationTimestamp") or ""),
        preemption_policy=_preemption_policy(spec.get("preemptionPolicy")),
        nominated_node_name=_str(status.get("nominatedNodeName"), "status.nominatedNodeName"),
        start_time=str(status.get("startTime") or meta.get("creationTimestamp") or ""),
        node_selector=_shared_map(_str_map(spec.get("nodeSelector"), "spec.nodeSelector")),
        node_affinity=_node_affinity(affinity, "spec.affinity"),
        tolerations=_shared(
            tuple(
                _toleration(t, f"spec.tolerations[{i}]")
                for i, t in enumerate(_list(spec.get("tolerations"), "spec.tolerations"))
            )
        ),
        requests=_shared_map({k: _to_int(k, v) for k, v in requests_exact.items()}),
        requests_exact=_shared_map(requests_exact),
        app_limits=_shared_map({k: _to_int(k, v) for k, v in app_limits(spec).items()}),
        non_zero_cpu=_to_int(CPU, non_zero.get(CPU, Fraction(0))),
        non_zero_memory=_to_int(MEMORY, non_zero.get(MEMORY, Fraction(0))),
        scheduling_gates=_scheduling_gates(spec.get("schedulingGates")),
        raw=obj,
    )


def decode_node(obj: Mapping[str, Any]) -> Node:
    """Decode a v1 Node mapping; allocatable falls back to capacity as the kubelet reports it."""
    obj = _mapping(obj, "")
    meta = _mapping(obj.get("metadata"), "metadata")
    name = _str(meta.get("name"), "metadata.name")
    if not name:
        raise DecodeError("metadata.name", "must be non-empty")
    spec = _mapping(obj.get("spec"), "spec")
    status = _mapping(obj.get("status"), "status")
    capacity = _resource_list(status.get("capacity"), "status.capacity")
    if status.get("allocatable") is not None:
        alloc = _resource_list(status.get("allocatable"), "status.allocatable")
    else:
        alloc = capacity
    if status.get("capacity") is None:
        capacity = alloc
    unschedulable = spec.get("unschedulable", False)
    if not isinstance(unschedulable, bool):
        raise DecodeError("spec.unschedulable", f"expected a boolean, got {unschedulable!r}")
    return Node(
        name=name,
        uid=_str(meta.get("uid"), "metadata.uid") or name,
        resource_version=_str(meta.get("resourceVersion"), "metadata.resourceVersion"),
        labels=_str_map(meta.get("labels"), "metadata.labels"),
        annotations=_str_map(meta.get("annotations"), "metadata.annotations"),
        unschedulable=unschedulable,
        taints=tuple(
            _taint(t, f"spec.taints[{i}]")
            for i, t in enumerate(_list(spec.get("taints"), "spec.taints"))
        ),
        allocatable={k: _to_int(k, v) for k, v in alloc.items()},
        capacity={k: _to_int(k, v) for k, v in capacity.items()},
        raw=obj,
    )
