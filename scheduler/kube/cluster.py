"""``KubeCluster``: the Cluster port on a real API server.

Role: the scheduler's view of and hands on a Kubernetes cluster. Three informers (Nodes; Pods
that are not Succeeded/Failed, of every scheduler, for accounting and for the queue; Device
CRs), plus PodDisruptionBudgets (preemption), ``scheduling.sigs.k8s.io`` PodGroups
(Coscheduling; optional: a cluster without the CRD is healthy and sends none) and gpushare's
``kube-system/unhealthy-gpu-<node>`` ConfigMaps (the device ledger) feed subscribers;
``bind`` is one ``pods/binding`` POST whose metadata carries the device-allocation
annotations (or, with ``bind_mode="patch"``, an annotation patch then a plain binding);
``record_event`` goes to the aggregating ``EventRecorder``;
``set_pod_scheduled_condition`` patches the pod's status.

Invariants:

- Fencing: when a ``fence`` is given (the leader elector's "I still hold an unexpired
  lease"), every bind write checks it *after* its rate-limiter wait and immediately before the
  request; a closed fence raises ``BindError(fenced=True)`` and nothing is sent.
- A bind answered 404 raises ``BindError(gone=True)``; 409 (already bound, or the uid
  precondition failed), 5xx and transport failures (timeouts, resets: the answer is lost,
  the write may have landed) raise ``BindError(uncertain=True)``, and the scheduler reads the
  pod back (``lookup_pod``) before it releases anything; other answers (403, 400, 429) are
  certain failures, reported and retried with backoff. The Binding names the pod's uid, so a
  recreated pod is never bound by a decision taken for its predecessor.
- The PodScheduled=False write is a patch conditional on the resourceVersion of the unbound
  record it was checked against (a 409 drops it), so it never lands on a pod that was bound
  meanwhile, however stale the informer.
- The PodScheduled condition is written only when it differs (status, reason, message) from
  what the pod already shows, keeping ``lastTransitionTime`` when only the message changed,
  so an unschedulable pod retried every ten seconds costs no write when nothing changed.
- ``delete_pod`` and ``annotate_pod`` (a timed-out gang's mark) are leader-only writes, fenced
  like a bind, with the pod's UID as a precondition (gone or re-created: dropped quietly).
  ``set_nominated_node`` is fenced too (the next leader keeps room for a nominated pod), but a
  closed fence drops it quietly instead of raising.
- ``view()`` is a consistent-enough snapshot of the caches (each informer's own lock) for the
  device metrics and ``inspect``; it never blocks the informers for long.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import structlog

from apis.core import Node, Pod, decode_node, decode_pod
from apis.device import API_VERSION as DEVICE_API_VERSION
from apis.device import PLURAL as DEVICE_PLURAL
from apis.device import Device
from apis.disruption import PodDisruptionBudget, decode_pdb
from apis.gang import POD_GROUP_API_VERSION, PodGroup, decode_pod_group
from apis.gpushare import UNHEALTHY_NAMESPACE, decode_unhealthy, is_unhealthy_configmap
from scheduler.cluster import ChangeHandler
from scheduler.framework.events import PDB_KIND, POD_GROUP_KIND, UNHEALTHY_GPUS_KIND
from scheduler.framework.interfaces import BindError
from scheduler.kube.events import EventRecorder, rfc3339
from scheduler.kube.informer import Informer, ResourceSpec, list_objects, wait_all
from scheduler.kube.rest import (
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    ApiError,
    KubeError,
    RestClient,
    path_segment,
)

__all__ = [
    "BIND_MODES",
    "CONFIGMAPS_PATH",
    "DEVICES_PATH",
    "FENCED_WRITE_TIMEOUT",
    "NODES_PATH",
    "PODS_FIELD_SELECTOR",
    "PODS_PATH",
    "POD_GROUPS_PATH",
    "ClusterView",
    "KubeCluster",
    "bind_permission_problem",
    "device_spec",
    "fetch_view",
    "node_spec",
    "pod_group_spec",
    "pod_spec",
    "unhealthy_gpus_spec",
]

log = structlog.get_logger("koord-scheduler.kube")

NODES_PATH = "/api/v1/nodes"
PODS_PATH = "/api/v1/pods"
DEVICES_PATH = f"/apis/{DEVICE_API_VERSION}/{DEVICE_PLURAL}"
POD_GROUPS_PATH = f"/apis/{POD_GROUP_API_VERSION}/podgroups"
CONFIGMAPS_PATH = f"/api/v1/namespaces/{UNHEALTHY_NAMESPACE}/configmaps"
PODS_FIELD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"
BIND_MODES = ("binding", "patch")
DISRUPTION_TARGET = "DisruptionTarget"
FENCED_WRITE_TIMEOUT = 10.0
"""Seconds a leader-only write (bind, victim delete, gang mark, nomination) may take, from
the request's start to its answer, connection included; then its outcome is uncertain (read
back). The bound a new leader waits out after taking over an expired lease (leader.py)."""


def node_spec() -> ResourceSpec:
    return ResourceSpec(
        "Node", NODES_PATH, decode_node, lambda n: n.name, lambda n: n.resource_version
    )


def decode_cached_pod(obj: Mapping[str, Any]) -> Pod:
    """A pod as the informer keeps it: the decoded record, with a ``raw`` cut down to what the
    scheduler reads back (its PodScheduled condition). The full object would be most of the
    scheduler's memory at tens of thousands of pods (a decoded JSON pod is several KiB)."""
    pod = decode_pod(obj)
    kept: dict[str, Any] = {}
    condition = _pod_scheduled_condition(pod)
    if condition is not None:
        kept["status"] = {"conditions": [condition]}
    return dataclasses.replace(pod, raw=kept)


def pod_spec(*, full: bool = False) -> ResourceSpec:
    """Pods as the informer keeps them (slim ``raw``), or ``full`` records (``inspect``,
    ``explain``: one list, objects replayed elsewhere)."""
    return ResourceSpec(
        "Pod",
        PODS_PATH,
        decode_pod if full else decode_cached_pod,
        lambda p: p.key,
        lambda p: p.resource_version,
        field_selector=PODS_FIELD_SELECTOR,
    )


PDB_PATHS = (
    "/apis/policy/v1/poddisruptionbudgets",
    "/apis/policy/v1beta1/poddisruptionbudgets",
)


def pdb_spec() -> ResourceSpec:
    """PodDisruptionBudgets as ``policy/v1`` where served (Kubernetes >= 1.21; the only
    version from 1.25), else ``policy/v1beta1`` (1.20): the informer lists them in the first
    version that is not 404 and retries anything else. Served in neither: no budgets
    (optional), so preemption works without them instead of the scheduler never being ready."""
    return ResourceSpec(
        PDB_KIND,
        PDB_PATHS[0],
        decode_pdb,
        _pdb_key,
        lambda b: b.resource_version,
        alternatives=PDB_PATHS[1:],
        optional=True,
    )


def _pdb_key(pdb: PodDisruptionBudget) -> str:
    return pdb.key


def _pod_group_key(group: PodGroup) -> str:
    return group.key


def pod_group_spec() -> ResourceSpec:
    """PodGroups of every namespace; optional (the CRD is installed only for PodGroup gangs)."""
    return ResourceSpec(
        POD_GROUP_KIND,
        POD_GROUPS_PATH,
        decode_pod_group,
        _pod_group_key,
        lambda g: g.resource_version,
        missing_hint="PodGroup CRD not installed: gangs by annotation and label only "
        "(kubectl apply -f config/crd/ to use PodGroups)",
        optional=True,
    )


def device_spec() -> ResourceSpec:
    """Device CRs; optional: without the CRD (a gpushare cluster swapping the extender alone)
    the scheduler still becomes ready with no cards known, says so once, and lists Devices
    again every minute until the CRD is installed."""
    return ResourceSpec(
        "Device",
        DEVICES_PATH,
        Device.from_dict,
        lambda d: d.name,
        lambda d: d.resource_version,
        missing_hint="Device CRD not installed: no GPU cards known until it is "
        "(kubectl apply -f config/crd/)",
        optional=True,
    )


def unhealthy_gpus_spec() -> ResourceSpec:
    """gpushare's ``kube-system/unhealthy-gpu-<node>`` ConfigMaps (the other ConfigMaps of
    kube-system are skipped unread); needs list + watch of configmaps in kube-system."""
    return ResourceSpec(
        UNHEALTHY_GPUS_KIND,
        CONFIGMAPS_PATH,
        decode_unhealthy,
        lambda u: u.key,
        lambda u: u.resource_version,
        accept=is_unhealthy_configmap,
    )


class ClusterView:
    """What the caches hold at one moment: nodes by name, Device CRs, pods."""

    def __init__(self, nodes: Mapping[str, Node], devices: list[Device], pods: list[Pod]):
        self.nodes = nodes
        self.devices = devices
        self.pods = pods


def fetch_view(rest: RestClient) -> ClusterView:
    """One list of Nodes, Device CRs and non-terminal Pods (``inspect``); objects that do not
    decode are skipped."""
    decoded: list[list[Any]] = []
    for spec in (node_spec(), device_spec(), pod_spec(full=True)):
        _, objects = list_objects(rest, spec)
        records = []
        for obj in objects:
            try:
                records.append(spec.decode(obj))
            except Exception as exc:  # shown, never fatal: inspect is for broken clusters too
                log.warning("undecodable object skipped", resource=spec.kind, error=str(exc))
        decoded.append(records)
    nodes, devices, pods = decoded
    return ClusterView({n.name: n for n in nodes}, devices, pods)


SSAR_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


def _bind_permissions(bind_mode: str) -> list[tuple[str, str, str]]:
    """(verb, resource, subresource) a bind needs in ``bind_mode``."""
    needed = [("create", "pods", "binding")]
    if bind_mode == "patch":
        needed.insert(0, ("patch", "pods", ""))
    return needed


def bind_permission_problem(rest: RestClient, bind_mode: str) -> str | None:
    """One line naming the first permission a bind in ``bind_mode`` needs and this identity
    lacks (asked with SelfSubjectAccessReviews, which every authenticated user may create);
    None when all are granted. When the review itself cannot be made, the problem is
    logged and None returned: a bind's own 403 is then reported and backed off."""
    for verb, resource, sub in _bind_permissions(bind_mode):
        attrs: dict[str, str] = {"verb": verb, "resource": resource, "group": ""}
        if sub:
            attrs["subresource"] = sub
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs},
        }
        try:
            doc = rest.request("POST", SSAR_PATH, body=review)
        except KubeError as exc:
            log.warning("cannot check bind permissions", error=str(exc))
            return None
        status = doc.get("status") or {}
        if not status.get("allowed"):
            what = f"{resource}/{sub}" if sub else resource
            hint = (
                "grant it (see config/scheduler/rbac.yaml) or use --bind-mode binding"
                if bind_mode == "patch"
                else "apply config/scheduler/rbac.yaml"
            )
            return f"--bind-mode {bind_mode} needs permission to {verb} {what}; {hint}"
    return None


def _pod_path(pod: Pod) -> str:
    return f"/api/v1/namespaces/{path_segment(pod.namespace)}/pods/{path_segment(pod.name)}"


class KubeCluster:
    """The Cluster port on an API server (see the module docstring)."""

    def __init__(
        self,
        rest: RestClient,
        recorder: EventRecorder | None = None,
        *,
        bind_mode: str = "binding",
        informers: tuple[Informer, Informer, Informer] | None = None,
        fence: Callable[[], bool] | None = None,
        pdbs: Informer | None = None,
        pod_groups: Informer | None = None,
        unhealthy_gpus: Informer | None = None,
        write_timeout: float = FENCED_WRITE_TIMEOUT,
    ) -> None:
        if bind_mode not in BIND_MODES:
            raise ValueError(f"bind_mode must be one of {BIND_MODES}, got {bind_mode!r}")
        self.rest = rest
        self._unlimited = rest.with_limiter(None)
        self.fence = fence
        """Checked immediately before each bind write; None: no leader election."""
        self.write_timeout = write_timeout
        """The whole time a fenced write may take (``FENCED_WRITE_TIMEOUT``)."""
        self.recorder = recorder
        self.bind_mode = bind_mode
        if informers is None:
            informers = (
                Informer(rest, node_spec()),
                Informer(rest, device_spec()),
                Informer(rest, pod_spec()),
            )
            if pdbs is None:
                pdbs = Informer(rest, pdb_spec())
            if pod_groups is None:
                pod_groups = Informer(rest, pod_group_spec())
            if unhealthy_gpus is None:
                unhealthy_gpus = Informer(rest, unhealthy_gpus_spec())
        self.nodes, self.devices, self.pods = informers
        self.pdbs = pdbs
        """PodDisruptionBudgets, for preemption (None: not watched)."""
        self.pod_groups = pod_groups
        """PodGroups, for Coscheduling (None: not watched; absent CRD: empty and healthy)."""
        self.informers = [self.nodes, self.devices, self.pods]
        if pdbs is not None:
            self.informers.append(pdbs)
        if pod_groups is not None:
            self.informers.append(pod_groups)
        self.unhealthy_gpus = unhealthy_gpus
        """gpushare's unhealthy-card ConfigMaps (None: not watched)."""
        if unhealthy_gpus is not None:
            self.informers.append(unhealthy_gpus)
        self.binds = 0
        self.bind_failures = 0

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        for informer in self.informers:
            informer.start()
        if self.recorder is not None:
            self.recorder.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every informer and the event recorder, waiting at most ``timeout`` s in all:
        all are told first, then joined against one deadline (joined one after another, six
        informers stuck in a LIST against a slow API server took six times as long)."""
        deadline = time.monotonic() + timeout
        for informer in self.informers:
            informer.stop(timeout=0)
        if self.recorder is not None:
            self.recorder.stop(timeout=0)
        for informer in self.informers:
            informer.stop(timeout=max(0.0, deadline - time.monotonic()))
        if self.recorder is not None:
            self.recorder.stop(timeout=max(0.0, deadline - time.monotonic()))

    # -- the inbound half of the port -----------------------------------------------------------

    def subscribe(self, handler: ChangeHandler) -> None:
        for informer in self.informers:
            informer.subscribe(handler)

    def wait_for_sync(self, timeout: float | None = None) -> bool:
        return wait_all(self.informers, timeout)

    def synced(self) -> bool:
        return all(i.synced for i in self.informers)

    def not_synced(self) -> list[str]:
        """Every informer still waiting for its first list, with the reason it is not there
        yet (``"PodDisruptionBudget (503 ServiceUnavailable: ...)"``): what ``/readyz``
        says while the scheduler cannot become ready."""
        out = []
        for i in self.informers:
            if i.synced:
                continue
            reason = i.last_error if i.last_error and i.last_error != "not started" else ""
            out.append(f"{i.kind} ({reason})" if reason else i.kind)
        return out

    def unhealthy(self) -> list[str]:
        """``"<kind>: <error>"`` for every informer that is not currently list/watching."""
        return [
            f"{i.kind}: {i.last_error or 'not connected'}" for i in self.informers if not i.healthy
        ]

    def view(self) -> ClusterView:
        nodes = {n.name: n for n in self.nodes.items()}
        return ClusterView(nodes, self.devices.items(), self.pods.items())

    # -- the outbound half ----------------------------------------------------------------------

    def bind(self, pod: Pod, node_name: str, annotations: Mapping[str, str]) -> None:
        meta: dict[str, Any] = {"name": pod.name, "namespace": pod.namespace}
        if pod.uid:
            meta["uid"] = pod.uid
        try:
            if self.bind_mode == "patch" and annotations:
                patch: dict[str, Any] = {"metadata": {"annotations": dict(annotations)}}
                if pod.uid:
                    patch["metadata"]["uid"] = pod.uid
                self._fenced_write(
                    pod, "PATCH", _pod_path(pod), body=patch, content_type=MERGE_PATCH
                )
            elif annotations:
                meta["annotations"] = dict(annotations)
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node_name},
            }
            self._fenced_write(pod, "POST", _pod_path(pod) + "/binding", body=binding)
        except BindError:
            self.bind_failures += 1
            raise
        except ApiError as exc:
            self.bind_failures += 1
            gone = exc.status == 404
            uncertain = exc.status == 409 or exc.status >= 500
            log.info(
                "bind failed", pod=pod.key, node=node_name, status=exc.status, error=exc.message
            )
            raise BindError(
                f"binding {pod.key} to {node_name}: {exc}", gone=gone, uncertain=uncertain
            ) from exc
        except KubeError as exc:  # no answer: the write may or may not have landed
            self.bind_failures += 1
            log.info("bind failed", pod=pod.key, node=node_name, error=str(exc))
            raise BindError(f"binding {pod.key} to {node_name}: {exc}", uncertain=True) from exc
        self.binds += 1
        log.info("bound", pod=pod.key, node=node_name)

    def _fenced_write(
        self, pod: Pod, method: str, path: str, *, what: str = "binding", **kwargs: Any
    ) -> None:
        """One leader-only write (a bind, a victim's delete, a gang's timeout mark): wait for
        the rate limiter, *then* check the fence, then send."""
        limiter = self.rest.limiter
        if limiter is not None:
            limiter.acquire()
        if self.fence is not None and not self.fence():
            if what == "binding":
                log.warning("bind not sent: leader lease lost", pod=pod.key)
            elif what == "nominating":  # dropped by the caller, not a failure of anything
                log.info("nomination not sent: leader lease lost", pod=pod.key)
            else:
                log.warning("write not sent: leader lease lost", pod=pod.key, write=what)
            raise BindError(
                f"{what} {pod.key}: not sent, this replica no longer holds the leader lease",
                fenced=True,
            )
        self._unlimited.request(method, path, timeout=self.write_timeout, **kwargs)

    def quorum_pods_rv(self) -> str:
        """The resourceVersion of a consistent read of the pods (no ``resourceVersion``
        parameter: served from etcd, never from the watch cache): etcd's revision at the
        moment of the read. One item is enough, the list's metadata carries the version (the
        first page of a paginated list too). A new leader's catch-up target (leader.py)."""
        doc = self.rest.request("GET", PODS_PATH, query={"limit": "1"})
        return str((doc.get("metadata") or {}).get("resourceVersion") or "")

    def lookup_pod(self, pod: Pod) -> Pod | None:
        """GET the pod from the API server (not the cache); None on 404."""
        try:
            doc = self.rest.request("GET", _pod_path(pod))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return decode_pod(doc)

    def record_event(self, pod: Pod, event_type: str, reason: str, message: str) -> None:
        if self.recorder is not None:
            self.recorder.record(pod, event_type, reason, message)

    def set_nominated_node(self, pod: Pod, node_name: str) -> None:
        """Patch ``status.nominatedNodeName`` (null clears it); a pod gone or re-created
        meanwhile is left alone (the UID precondition). Fenced like a bind, because the next
        leader keeps room for a nominated pod: a closed fence sends nothing and returns quietly
        (raising would only cut the caller's failure report short; the write is not retried)."""
        body: dict[str, Any] = {
            "metadata": {"uid": pod.uid},
            "status": {"nominatedNodeName": node_name or None},
        }
        try:
            self._fenced_write(
                pod,
                "PATCH",
                _pod_path(pod) + "/status",
                what="nominating",
                body=body,
                content_type=MERGE_PATCH,
            )
        except BindError:  # fenced: nothing was sent
            return
        except ApiError as exc:
            if exc.status in (404, 409):
                log.debug("nomination of a gone pod dropped", pod=pod.key, status=exc.status)
                return
            raise

    def delete_pod(self, pod: Pod, *, preemptor: Pod | None = None) -> None:
        """DELETE exactly this incarnation (``preconditions.uid``); fenced like a bind, so a
        replica that lost its lease evicts nothing. Gone (404) or another incarnation (409)
        is not an error: the victim is not there any more.

        A preemption's victim (``preemptor`` given) is first marked as kube-scheduler marks it
        (PodDisruptionConditions, GA since 1.31): ``DisruptionTarget=True``, reason
        ``PreemptionByScheduler``, which a Job's ``podFailurePolicy`` reads to tell a
        preempted pod from a failed one. A mark that fails otherwise than gone stops the
        delete (raises), as kube-scheduler's does."""
        if preemptor is not None and not self._mark_disruption_target(pod, preemptor):
            log.info("victim already gone", pod=pod.key)
            return
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if pod.uid:
            body["preconditions"] = {"uid": pod.uid}
        try:
            self._fenced_write(pod, "DELETE", _pod_path(pod), what="deleting", body=body)
        except ApiError as exc:
            if exc.status in (404, 409):
                log.info("victim already gone", pod=pod.key, status=exc.status)
                return
            raise
        log.info("preempted", pod=pod.key)

    def _mark_disruption_target(self, pod: Pod, preemptor: Pod) -> bool:
        """Patch the victim's DisruptionTarget condition (this incarnation only: its UID in
        the patch is a precondition); False when it is gone or re-created."""
        condition: dict[str, Any] = {
            "type": DISRUPTION_TARGET,
            "status": "True",
            "reason": "PreemptionByScheduler",
            "message": (
                f"{preemptor.scheduler_name}: preempting to accommodate a higher priority pod"
            ),
            "lastTransitionTime": rfc3339(datetime.now(UTC)),
        }
        condition.update(_observed_generation(pod))
        body: dict[str, Any] = {"status": {"conditions": [condition]}}
        if pod.uid:
            body["metadata"] = {"uid": pod.uid}
        try:
            self._fenced_write(
                pod,
                "PATCH",
                _pod_path(pod) + "/status",
                what="marking",
                body=body,
                content_type=STRATEGIC_MERGE_PATCH,
            )
        except ApiError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    def annotate_pod(self, pod: Pod, annotations: Mapping[str, str]) -> None:
        """A merge patch of ``metadata.annotations`` on exactly this incarnation (``metadata.uid``
        in the patch is a precondition: 409 when re-created), fenced like a bind; gone (404) or
        re-created (409) is dropped quietly."""
        body: dict[str, Any] = {"metadata": {"annotations": dict(annotations)}}
        if pod.uid:
            body["metadata"]["uid"] = pod.uid
        try:
            self._fenced_write(
                pod, "PATCH", _pod_path(pod), what="annotating", body=body, content_type=MERGE_PATCH
            )
        except ApiError as exc:
            if exc.status in (404, 409):
                log.info("annotation of a gone pod dropped", pod=pod.key, status=exc.status)
                return
            raise
        log.info("annotated", pod=pod.key, annotations=dict(annotations))

    def set_pod_scheduled_condition(self, pod: Pod, status: str, reason: str, message: str) -> None:
        current = self.pods.get(pod.key)
        if current is None or current.uid != pod.uid or current.node_name:
            return  # gone, recreated or bound meanwhile: nothing to report on
        old = _pod_scheduled_condition(current)
        if (
            old is not None
            and old.get("status") == status
            and old.get("reason") == reason
            and old.get("message") == message
        ):
            return
        transition = (
            str(old.get("lastTransitionTime"))
            if old is not None and old.get("status") == status and old.get("lastTransitionTime")
            else rfc3339(datetime.now(UTC))
        )
        condition = {
            "type": "PodScheduled",
            "status": status,
            "reason": reason,
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": transition,
        }
        condition.update(_observed_generation(current))
        # Conditional on the version checked unbound above: if anything (a binding above all)
        # changed the pod since, the API server answers 409 and the stale report is dropped.
        body: dict[str, Any] = {"status": {"conditions": [condition]}}
        if current.resource_version:
            body["metadata"] = {"resourceVersion": current.resource_version}
        try:
            self.rest.request(
                "PATCH",
                _pod_path(pod) + "/status",
                body=body,
                content_type=STRATEGIC_MERGE_PATCH,
            )
        except ApiError as exc:
            if exc.status in (404, 409):
                log.debug("stale PodScheduled condition dropped", pod=pod.key, status=exc.status)
                return
            raise


def _observed_generation(pod: Pod) -> dict[str, Any]:
    """``observedGeneration`` for a condition written on ``pod``, as kube-scheduler writes it
    (PodObservedGenerationTracking, GA since 1.35): the pod's ``metadata.generation``, which
    servers since 1.33 keep on pods; nothing where the server keeps none (1.20)."""
    meta = pod.raw.get("metadata")
    generation = meta.get("generation") if isinstance(meta, Mapping) else None
    if isinstance(generation, int) and not isinstance(generation, bool) and generation > 0:
        return {"observedGeneration": generation}
    return {}


def _pod_scheduled_condition(pod: Pod) -> Mapping[str, Any] | None:
    status = pod.raw.get("status")
    if not isinstance(status, Mapping):
        return None
    for cond in status.get("conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == "PodScheduled":
            return cond
    return None
