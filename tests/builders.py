"""Fluent test builders: v1 Node/Pod dicts, decoded records, snapshots and handles.

Role: the small vocabulary every test uses to state a cluster, modelled on kube-scheduler's
``pkg/scheduler/testing`` wrappers (``st.MakePod().Req(...).Obj()``)::

    node = make_node("n1").cpu("64").memory("512Gi").gpu_resources(8, "80Gi").label("zone", "a")
    pod = make_pod("p").req(cpu="1", memory="1Gi").req({"koordinator.sh/gpu-core": "50"})
    snap = make_snapshot([node], [make_pod("old").req(cpu="2").node("n1")])

Invariants: ``.obj()`` returns a fresh, plain JSON-shaped dict (a v1 object as the API server
or a YAML file would give it) and never shares state with the builder; ``.build()`` decodes it
with ``apis.core`` exactly as the adapters do. A node is built with ``pods: 110`` allocatable
(like a kubelet default) unless ``.pods(...)`` says otherwise, so "Too many pods" never shows up
by accident. Builders import only ``apis`` and the framework contract.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from apis.core import Node, Pod, decode_node, decode_pod
from apis.quantity import Quantity, int_value
from scheduler.framework.interfaces import BindError, Handle
from scheduler.framework.types import Snapshot

__all__ = [
    "GPU_CORE",
    "GPU_MEMORY",
    "GPU_MEMORY_RATIO",
    "NVIDIA_GPU",
    "ManualClock",
    "NodeBuilder",
    "PodBuilder",
    "RecordingClient",
    "make_handle",
    "make_node",
    "make_pod",
    "make_snapshot",
]

GPU_CORE = "koordinator.sh/gpu-core"
GPU_MEMORY = "koordinator.sh/gpu-memory"
GPU_MEMORY_RATIO = "koordinator.sh/gpu-memory-ratio"
NVIDIA_GPU = "nvidia.com/gpu"

Quantityish = str | int


def _resource_dict(
    requests: Mapping[str, Quantityish] | None, kwargs: Mapping[str, Quantityish | None]
) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in (requests or {}).items():
        out[name] = str(value)
    for name, maybe in kwargs.items():
        if maybe is not None:
            out[name.replace("_", "-")] = str(maybe)
    return out


# ---------------------------------------------------------------------------------------------
# Nodes


class NodeBuilder:
    """``make_node(name)``; every method returns the builder."""

    def __init__(self, name: str) -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {}},
            "spec": {},
            "status": {"allocatable": {"pods": "110"}},
        }

    @property
    def _alloc(self) -> dict[str, str]:
        alloc: dict[str, str] = self._obj["status"]["allocatable"]
        return alloc

    def resource(self, name: str, value: Quantityish | None) -> NodeBuilder:
        """Set (or, with None, remove) one allocatable resource."""
        if value is None:
            self._alloc.pop(name, None)
        else:
            self._alloc[name] = str(value)
        return self

    def resources(self, resources: Mapping[str, Quantityish]) -> NodeBuilder:
        for name, value in resources.items():
            self.resource(name, value)
        return self

    def cpu(self, value: Quantityish) -> NodeBuilder:
        return self.resource("cpu", value)

    def memory(self, value: Quantityish) -> NodeBuilder:
        return self.resource("memory", value)

    def ephemeral_storage(self, value: Quantityish) -> NodeBuilder:
        return self.resource("ephemeral-storage", value)

    def pods(self, value: int | None) -> NodeBuilder:
        return self.resource("pods", value)

    def gpu_resources(
        self, count: int, memory_per_gpu: Quantityish = "80Gi", *, nvidia: bool = False
    ) -> NodeBuilder:
        """The node totals the node agent advertises for ``count`` healthy GPUs (SPEC §4)."""
        per_gpu = int_value(Quantity.parse(memory_per_gpu))
        self.resource(GPU_CORE, 100 * count)
        self.resource(GPU_MEMORY_RATIO, 100 * count)
        self.resource(GPU_MEMORY, per_gpu * count)
        if nvidia:
            self.resource(NVIDIA_GPU, count)
        return self

    def gpushare(self, units: int | None, count: int | None) -> NodeBuilder:
        """What gpushare's device plugin advertises: ``aliyun.com/gpu-mem`` (all cards' units)
        and ``aliyun.com/gpu-count`` (None removes one), in capacity and allocatable."""
        capacity = self._obj["status"].setdefault("capacity", dict(self._alloc))
        for name, value in (("aliyun.com/gpu-mem", units), ("aliyun.com/gpu-count", count)):
            for where in (self._alloc, capacity):
                if value is None:
                    where.pop(name, None)
                else:
                    where[name] = str(value)
        return self

    def label(self, key: str, value: str = "") -> NodeBuilder:
        self._obj["metadata"]["labels"][key] = value
        return self

    def labels(self, labels: Mapping[str, str]) -> NodeBuilder:
        self._obj["metadata"]["labels"].update(labels)
        return self

    def annotation(self, key: str, value: str) -> NodeBuilder:
        self._obj["metadata"].setdefault("annotations", {})[key] = value
        return self

    def taint(self, key: str, value: str = "", effect: str = "NoSchedule") -> NodeBuilder:
        taint: dict[str, str] = {"key": key, "effect": effect}
        if value:
            taint["value"] = value
        self._obj["spec"].setdefault("taints", []).append(taint)
        return self

    def unschedulable(self, flag: bool = True) -> NodeBuilder:
        self._obj["spec"]["unschedulable"] = flag
        return self

    def uid(self, uid: str) -> NodeBuilder:
        self._obj["metadata"]["uid"] = uid
        return self

    def obj(self) -> dict[str, Any]:
        """The v1 Node as a plain dict (a deep copy)."""
        return copy.deepcopy(self._obj)

    def build(self) -> Node:
        """The decoded ``apis.core.Node``."""
        return decode_node(self.obj())


def make_node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


# ---------------------------------------------------------------------------------------------
# Pods

Expression = tuple[str, str, Sequence[str]] | Mapping[str, Any]


def _expr(e: Expression) -> dict[str, Any]:
    if isinstance(e, Mapping):
        return dict(e)
    key, operator, values = e
    out: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


def _term(
    expressions: Iterable[Expression] = (), fields: Iterable[Expression] = ()
) -> dict[str, Any]:
    term: dict[str, Any] = {}
    exprs = [_expr(e) for e in expressions]
    flds = [_expr(f) for f in fields]
    if exprs:
        term["matchExpressions"] = exprs
    if flds:
        term["matchFields"] = flds
    return term


class PodBuilder:
    """``make_pod(name, namespace)``; every method returns the builder."""

    def __init__(self, name: str, namespace: str = "default") -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"{namespace}/{name}"},
            "spec": {"containers": [{"name": "main", "image": "pause"}]},
        }

    @property
    def _spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self._obj["spec"]
        return spec

    @property
    def _meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = self._obj["metadata"]
        return meta

    # -- resources -----------------------------------------------------------------------------

    def req(
        self,
        requests: Mapping[str, Quantityish] | None = None,
        /,
        *,
        cpu: Quantityish | None = None,
        memory: Quantityish | None = None,
        **extended: Quantityish | None,
    ) -> PodBuilder:
        """Add requests to the main container; names with dots or slashes go in the dict.

        Keyword names have ``_`` turned into ``-`` (``ephemeral_storage=...``).
        """
        res = _resource_dict(requests, {"cpu": cpu, "memory": memory, **extended})
        container = self._spec["containers"][0]
        container.setdefault("resources", {}).setdefault("requests", {}).update(res)
        return self

    def limit(self, limits: Mapping[str, Quantityish], /) -> PodBuilder:
        """Add limits to the main container (a limit alone is also the request, as the API
        server defaults it)."""
        res = _resource_dict(limits, {})
        container = self._spec["containers"][0]
        container.setdefault("resources", {}).setdefault("limits", {}).update(res)
        return self

    def container(
        self, requests: Mapping[str, Quantityish] | None = None, /, **kwargs: Quantityish | None
    ) -> PodBuilder:
        """Add another app container with these requests (kube's ``st.MakePod().Req``)."""
        containers = self._spec["containers"]
        c: dict[str, Any] = {"name": f"c{len(containers)}", "image": "pause"}
        res = _resource_dict(requests, kwargs)
        if res:
            c["resources"] = {"requests": res}
        containers.append(c)
        return self

    def init_container(
        self,
        requests: Mapping[str, Quantityish] | None = None,
        /,
        *,
        sidecar: bool = False,
        **kwargs: Quantityish | None,
    ) -> PodBuilder:
        inits = self._spec.setdefault("initContainers", [])
        c: dict[str, Any] = {"name": f"init{len(inits)}", "image": "pause"}
        res = _resource_dict(requests, kwargs)
        if res:
            c["resources"] = {"requests": res}
        if sidecar:
            c["restartPolicy"] = "Always"
        inits.append(c)
        return self

    def overhead(self, overhead: Mapping[str, Quantityish]) -> PodBuilder:
        self._spec["overhead"] = {k: str(v) for k, v in overhead.items()}
        return self

    # -- scheduling constraints ------------------------------------------------------------------

    def priority(self, value: int) -> PodBuilder:
        self._spec["priority"] = value
        return self

    def node_selector(
        self, selector: Mapping[str, str] | None = None, /, **labels: str
    ) -> PodBuilder:
        sel = self._spec.setdefault("nodeSelector", {})
        sel.update(selector or {})
        sel.update(labels)
        return self

    def _node_affinity(self) -> dict[str, Any]:
        affinity = self._spec.setdefault("affinity", {})
        na: dict[str, Any] = affinity.setdefault("nodeAffinity", {})
        return na

    def _required_terms(self) -> list[dict[str, Any]]:
        required = self._node_affinity().setdefault(
            "requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": []}
        )
        terms: list[dict[str, Any]] = required["nodeSelectorTerms"]
        return terms

    def node_affinity_expr(self, key: str, operator: str, values: Sequence[str] = ()) -> PodBuilder:
        """AND a requirement into the first required term (created when there is none)."""
        terms = self._required_terms()
        if not terms:
            terms.append({})
        terms[0].setdefault("matchExpressions", []).append(_expr((key, operator, values)))
        return self

    def node_affinity_in(self, key: str, values: Sequence[str]) -> PodBuilder:
        return self.node_affinity_expr(key, "In", values)

    def node_affinity_not_in(self, key: str, values: Sequence[str]) -> PodBuilder:
        return self.node_affinity_expr(key, "NotIn", values)

    def required_term(
        self, expressions: Iterable[Expression] = (), fields: Iterable[Expression] = ()
    ) -> PodBuilder:
        """Add one more required node-selector term (terms are ORed).

        An expression is ``(key, operator, values)`` or a v1 dict; ``fields`` match
        ``metadata.name``, e.g. ``[("metadata.name", "In", ["n1"])]``.
        """
        self._required_terms().append(_term(expressions, fields))
        return self

    def required_terms_empty(self) -> PodBuilder:
        """``requiredDuringScheduling...: {nodeSelectorTerms: []}`` (matches no node)."""
        self._required_terms()
        return self

    def preferred(
        self, weight: int, key: str, values: Sequence[str], operator: str = "In"
    ) -> PodBuilder:
        return self.preferred_term(weight, [(key, operator, values)])

    def preferred_term(
        self,
        weight: int,
        expressions: Iterable[Expression] = (),
        fields: Iterable[Expression] = (),
    ) -> PodBuilder:
        prefs = self._node_affinity().setdefault(
            "preferredDuringSchedulingIgnoredDuringExecution", []
        )
        prefs.append({"weight": weight, "preference": _term(expressions, fields)})
        return self

    def toleration(
        self,
        key: str = "",
        value: str = "",
        effect: str = "",
        operator: str = "Equal",
        seconds: int | None = None,
    ) -> PodBuilder:
        tol: dict[str, Any] = {"operator": operator}
        if key:
            tol["key"] = key
        if value:
            tol["value"] = value
        if effect:
            tol["effect"] = effect
        if seconds is not None:
            tol["tolerationSeconds"] = seconds
        self._spec.setdefault("tolerations", []).append(tol)
        return self

    # -- identity and status -------------------------------------------------------------------

    def node(self, name: str) -> PodBuilder:
        self._spec["nodeName"] = name
        return self

    def scheduler(self, name: str) -> PodBuilder:
        self._spec["schedulerName"] = name
        return self

    def annotation(self, key: str, value: str) -> PodBuilder:
        self._meta.setdefault("annotations", {})[key] = value
        return self

    def label(self, key: str, value: str) -> PodBuilder:
        self._meta.setdefault("labels", {})[key] = value
        return self

    def uid(self, uid: str) -> PodBuilder:
        self._meta["uid"] = uid
        return self

    def phase(self, phase: str) -> PodBuilder:
        self._obj.setdefault("status", {})["phase"] = phase
        return self

    def preemption_policy(self, policy: str) -> PodBuilder:
        self._spec["preemptionPolicy"] = policy
        return self

    def start_time(self, rfc3339: str) -> PodBuilder:
        self._obj.setdefault("status", {})["startTime"] = rfc3339
        return self

    def nominated(self, node: str) -> PodBuilder:
        self._obj.setdefault("status", {})["nominatedNodeName"] = node
        return self

    def terminating(self) -> PodBuilder:
        self._meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return self

    def obj(self) -> dict[str, Any]:
        """The v1 Pod as a plain dict (a deep copy)."""
        return copy.deepcopy(self._obj)

    def build(self) -> Pod:
        """The decoded ``apis.core.Pod``."""
        return decode_pod(self.obj())


def make_pod(name: str, namespace: str = "default") -> PodBuilder:
    return PodBuilder(name, namespace)


# ---------------------------------------------------------------------------------------------
# Snapshots and handles


def _node(n: Node | NodeBuilder) -> Node:
    return n.build() if isinstance(n, NodeBuilder) else n


def _pod(p: Pod | PodBuilder) -> Pod:
    return p.build() if isinstance(p, PodBuilder) else p


def make_snapshot(
    nodes: Iterable[Node | NodeBuilder], pods: Iterable[Pod | PodBuilder] = ()
) -> Snapshot:
    """A snapshot holding ``nodes`` (slots in this order) and the assigned ``pods``.

    Every pod must name its node (``.node(name)``); a pod on an unknown node is kept the way
    the cache keeps it, on a slot that is not live.
    """
    snapshot = Snapshot()
    for n in nodes:
        snapshot.set_node(_node(n))
    for p in pods:
        pod = _pod(p)
        if not pod.node_name:
            raise ValueError(f"pod {pod.key} is not assigned: give it .node(name)")
        snapshot.add_pod(pod.node_name, pod)
    return snapshot


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class RecordingClient:
    """A ClusterClient that records calls; ``fail_bind`` makes the next binds raise it."""

    def __init__(self) -> None:
        self.binds: list[tuple[str, str, dict[str, str]]] = []
        self.events: list[tuple[str, str, str, str]] = []
        self.conditions: list[tuple[str, str, str, str]] = []
        self.nominations: list[tuple[str, str]] = []
        self.deleted: list[str] = []
        self.preemptors: list[tuple[str, str]] = []  # (victim, preemptor) of each delete
        self.annotated: list[tuple[str, dict[str, str]]] = []
        self.fail_bind: BindError | None = None
        self.fail_delete: Exception | None = None

    def bind(self, pod: Pod, node_name: str, annotations: Mapping[str, str]) -> None:
        if self.fail_bind is not None:
            raise self.fail_bind
        self.binds.append((pod.key, node_name, dict(annotations)))

    def record_event(self, pod: Pod, event_type: str, reason: str, message: str) -> None:
        self.events.append((pod.key, event_type, reason, message))

    def set_pod_scheduled_condition(self, pod: Pod, status: str, reason: str, message: str) -> None:
        self.conditions.append((pod.key, status, reason, message))

    def set_nominated_node(self, pod: Pod, node_name: str) -> None:
        self.nominations.append((pod.key, node_name))

    def delete_pod(self, pod: Pod, *, preemptor: Pod | None = None) -> None:
        if self.fail_delete is not None:
            raise self.fail_delete
        self.deleted.append(pod.key)
        if preemptor is not None:
            self.preemptors.append((pod.key, preemptor.key))

    def annotate_pod(self, pod: Pod, annotations: Mapping[str, str]) -> None:
        self.annotated.append((pod.key, dict(annotations)))


def make_handle(snapshot: Snapshot | None = None, client: RecordingClient | None = None) -> Handle:
    """A Handle over ``snapshot`` (empty by default) with a recording client and manual clock."""
    return Handle(
        snapshot if snapshot is not None else Snapshot(),
        client if client is not None else RecordingClient(),
        ManualClock(),
    )
