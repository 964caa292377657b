"""What the API server would refuse in a scenario: strict field names and its resource rules.

``simulate`` (and ``explain --file``) feed files straight to the scheduler, without the API
server in between; an object a real cluster would have rejected must not be scheduled as if it
were valid. ``check_object`` applies, per known kind:

- Strict decoding, as ``kubectl apply`` (server-side field validation ``Strict``) does: an
  unknown field is an error. Depth: every mapping the scheduler reads is checked field by field
  (the object, ``metadata``, the Pod's ``spec``, its containers and their ``resources``,
  ``affinity`` down to the node selector requirements, ``tolerations``; the Node's ``spec``,
  ``taints`` and ``status``; PriorityClass, PodDisruptionBudget ``spec``/``status``/selector,
  Device ``spec.devices[*]`` and ``topology``, PodGroup ``spec``). Mappings the scheduler never
  reads (volumes, probes, env, securityContext, pod/node conditions, managedFields…) are only
  checked to be known fields of their parent; their content is not validated.
- The resource rules of ``ValidatePod``/``ValidateNode``: a pod has at least one container and
  every container a name (unique in the pod); an extended resource (any name outside the
  ``kubernetes.io`` domain other than ``cpu``, ``memory``, ``ephemeral-storage``, ``hugepages-*``)
  is a whole number, in containers and in node capacity/allocatable alike; and, after the
  defaulting that copies a limit to a missing request, a container's extended-resource request
  equals its limit ("must be equal to … limit") and has one ("Limit must be set for non
  overcommitable resources"). cpu/memory requests may not exceed their limits.
- Device CRs (koordlet writes them, no webhook checks them, but no node agent can report them):
  two devices of one type may not share a minor, and no device resource is negative.

Errors are ``DecodeError(path, problem)``; the scenario loader prefixes file and document.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from apis.core import DecodeError
from apis.quantity import Quantity, QuantityError

__all__ = ["check_object", "is_extended_resource"]

# A schema: None = any value (not checked further); a dict = a mapping with exactly these known
# fields; a one-element list [schema] = a list whose items follow ``schema``.
Schema = dict[str, Any] | list[Any] | None

_ANY = None


def _fields(names: str) -> dict[str, Any]:
    """Known fields whose content is not checked (space-separated names)."""
    return dict.fromkeys(names.split())


_OBJECT_META: dict[str, Any] = _fields(
    "name generateName namespace selfLink uid resourceVersion generation creationTimestamp "
    "deletionTimestamp deletionGracePeriodSeconds labels annotations ownerReferences "
    "finalizers managedFields"
)
_REQUIREMENT = dict.fromkeys(("key", "operator", "values"))
_LABEL_SELECTOR = {"matchLabels": _ANY, "matchExpressions": [_REQUIREMENT]}
_NODE_SELECTOR_TERM = {"matchExpressions": [_REQUIREMENT], "matchFields": [_REQUIREMENT]}
_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [_NODE_SELECTOR_TERM]
        },
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": _ANY, "preference": _NODE_SELECTOR_TERM}
        ],
    },
    "podAffinity": _ANY,
    "podAntiAffinity": _ANY,
}
_RESOURCES = dict.fromkeys(("limits", "requests", "claims"))
_CONTAINER: dict[str, Any] = _fields(
    "name image command args workingDir ports envFrom env resizePolicy restartPolicy "
    "volumeMounts volumeDevices livenessProbe readinessProbe startupProbe lifecycle "
    "terminationMessagePath terminationMessagePolicy imagePullPolicy securityContext stdin "
    "stdinOnce tty"
) | {"resources": _RESOURCES}
_POD_SPEC: dict[str, Any] = _fields(
    "volumes ephemeralContainers restartPolicy terminationGracePeriodSeconds "
    "activeDeadlineSeconds dnsPolicy nodeSelector serviceAccountName serviceAccount "
    "automountServiceAccountToken nodeName hostNetwork hostPID hostIPC shareProcessNamespace "
    "securityContext imagePullSecrets hostname subdomain schedulerName hostAliases "
    "priorityClassName priority dnsConfig readinessGates runtimeClassName enableServiceLinks "
    "preemptionPolicy overhead topologySpreadConstraints setHostnameAsFQDN os hostUsers "
    "schedulingGates resourceClaims"
) | {
    "containers": [_CONTAINER],
    "initContainers": [_CONTAINER],
    "affinity": _AFFINITY,
    "tolerations": [dict.fromkeys(("key", "operator", "value", "effect", "tolerationSeconds"))],
}
_POD_STATUS = _fields(
    "phase conditions message reason nominatedNodeName hostIP hostIPs podIP podIPs startTime "
    "initContainerStatuses containerStatuses qosClass ephemeralContainerStatuses resize "
    "resourceClaimStatuses"
)
_NODE_SPEC = _fields("podCIDR podCIDRs providerID unschedulable configSource externalID") | {
    "taints": [dict.fromkeys(("key", "value", "effect", "timeAdded"))]
}
_NODE_STATUS = _fields(
    "capacity allocatable phase conditions addresses daemonEndpoints nodeInfo images "
    "volumesInUse volumesAttached config runtimeHandlers features"
)
_TYPE_META = dict.fromkeys(("apiVersion", "kind"))
_DEVICE_INFO = _fields("type labels id minor moduleID health resources vfGroups conditions") | {
    "topology": dict.fromkeys(("socketID", "nodeID", "pcieID", "busID"))
}

SCHEMAS: dict[str, dict[str, Any]] = {
    "Pod": _TYPE_META | {"metadata": _OBJECT_META, "spec": _POD_SPEC, "status": _POD_STATUS},
    "Node": _TYPE_META | {"metadata": _OBJECT_META, "spec": _NODE_SPEC, "status": _NODE_STATUS},
    "PriorityClass": _TYPE_META
    | {"metadata": _OBJECT_META}
    | dict.fromkeys(("value", "globalDefault", "description", "preemptionPolicy")),
    "PodDisruptionBudget": _TYPE_META
    | {
        "metadata": _OBJECT_META,
        "spec": {
            "minAvailable": _ANY,
            "maxUnavailable": _ANY,
            "selector": _LABEL_SELECTOR,
            "unhealthyPodEvictionPolicy": _ANY,
        },
        "status": _fields(
            "observedGeneration disruptedPods disruptionsAllowed currentHealthy desiredHealthy "
            "expectedPods conditions"
        ),
    },
    "Device": _TYPE_META
    | {"metadata": _OBJECT_META, "spec": {"devices": [_DEVICE_INFO]}, "status": _ANY},
    "PodGroup": _TYPE_META
    | {
        "metadata": _OBJECT_META,
        "spec": _fields("minMember minResources scheduleTimeoutSeconds priorityClassName"),
        "status": _ANY,
    },
}

_NATIVE = frozenset({"cpu", "memory", "ephemeral-storage"})


def is_extended_resource(name: str) -> bool:
    """kube's ``IsExtendedResourceName``: outside the ``kubernetes.io`` domain (and not a
    native name such as cpu, memory, ephemeral-storage, hugepages-*), not ``requests.*``."""
    if name in _NATIVE or name.startswith("hugepages-") or name.startswith("requests."):
        return False
    domain, slash, _ = name.partition("/")
    if not slash:
        return False  # an unprefixed name is in the kubernetes.io domain
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _strict(value: Any, schema: Schema, path: str) -> None:
    if schema is None or value is None:
        return
    if isinstance(schema, list):
        if isinstance(value, list):
            for i, item in enumerate(value):
                _strict(item, schema[0], f"{path}[{i}]")
        return  # a wrong type is the decoder's to name
    if not isinstance(value, Mapping):
        return
    for key, sub in value.items():
        if key not in schema:
            known = ", ".join(sorted(schema))
            raise DecodeError(_join(path, str(key)), f"unknown field (known: {known})")
        _strict(sub, schema[key], _join(path, str(key)))


def _quantities(value: Any, path: str) -> dict[str, Fraction]:
    out: dict[str, Fraction] = {}
    if not isinstance(value, Mapping):
        return out
    for name, raw in value.items():
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            continue  # the decoder names it
        try:
            out[str(name)] = Quantity.parse(raw.strip() if isinstance(raw, str) else raw).value
        except QuantityError:
            continue
    return out


def _whole(values: Mapping[str, Fraction], raw: Mapping[str, Any], path: str) -> None:
    for name, value in values.items():
        if is_extended_resource(name) and value.denominator != 1:
            raise DecodeError(
                f"{path}.{name}", f"must be an integer, got {raw[name]!r} (an extended resource)"
            )


def _container(c: Any, path: str) -> None:
    if not isinstance(c, Mapping):
        return
    name = c.get("name")
    if not isinstance(name, str) or not name:
        raise DecodeError(f"{path}.name", "required (every container has a name)")
    res = c.get("resources")
    if not isinstance(res, Mapping):
        return
    req_raw, lim_raw = res.get("requests") or {}, res.get("limits") or {}
    requests = _quantities(req_raw, f"{path}.resources.requests")
    limits = _quantities(lim_raw, f"{path}.resources.limits")
    _whole(requests, req_raw, f"{path}.resources.requests")
    _whole(limits, lim_raw, f"{path}.resources.limits")
    for name, value in sorted(requests.items()):
        where = f"{path}.resources.requests.{name}"
        limit = limits.get(name)
        if is_extended_resource(name):
            if limit is None:
                raise DecodeError(
                    where,
                    f"{req_raw[name]!r} has no limit: an extended resource needs "
                    f"resources.limits.{name} equal to its request (or a limit alone)",
                )
            if value != limit:
                raise DecodeError(
                    where,
                    f"must be equal to {name} limit of {lim_raw[name]!r}, got {req_raw[name]!r} "
                    "(extended resources are not overcommitted)",
                )
        elif limit is not None and value > limit:
            raise DecodeError(
                where, f"must be less than or equal to {name} limit of {lim_raw[name]!r}"
            )


def _names(containers: Sequence[Any], path: str, seen: dict[str, str]) -> None:
    for i, c in enumerate(containers):
        cpath = f"{path}[{i}]"
        _container(c, cpath)
        name = c.get("name") if isinstance(c, Mapping) else None
        if isinstance(name, str):
            if name in seen:
                raise DecodeError(f"{cpath}.name", f"duplicate name {name!r} (also {seen[name]})")
            seen[name] = cpath


def _pod(obj: Mapping[str, Any]) -> None:
    spec = obj.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise DecodeError("spec.containers", "required: a pod has at least one container")
    seen: dict[str, str] = {}
    _names(containers, "spec.containers", seen)
    init = spec.get("initContainers")
    if isinstance(init, list):
        _names(init, "spec.initContainers", seen)


def _node(obj: Mapping[str, Any]) -> None:
    status = obj.get("status")
    if not isinstance(status, Mapping):
        return
    for key in ("capacity", "allocatable"):
        raw = status.get(key)
        if isinstance(raw, Mapping):
            _whole(_quantities(raw, f"status.{key}"), raw, f"status.{key}")


def _device(obj: Mapping[str, Any]) -> None:
    spec = obj.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    if not isinstance(devices, list):
        return
    minors: dict[tuple[str, int], int] = {}
    for i, d in enumerate(devices):
        if not isinstance(d, Mapping):
            continue
        path = f"spec.devices[{i}]"
        minor = d.get("minor")
        if isinstance(minor, int) and not isinstance(minor, bool):
            key = (str(d.get("type")), minor)
            if key in minors:
                raise DecodeError(
                    f"{path}.minor",
                    f"duplicate {key[0]} minor {minor} (also spec.devices[{minors[key]}])",
                )
            minors[key] = i
        raw = d.get("resources")
        if isinstance(raw, Mapping):
            for name, value in _quantities(raw, f"{path}.resources").items():
                if value < 0:
                    raise DecodeError(
                        f"{path}.resources.{name}", f"must be non-negative, got {raw[name]!r}"
                    )


_RULES = {"Pod": _pod, "Node": _node, "Device": _device}


def check_object(kind: str, obj: Mapping[str, Any]) -> None:
    """Raise ``DecodeError`` for what the API server would refuse in ``obj`` (of ``kind``,
    one of ``SCHEMAS``); see the module docstring."""
    _strict(obj, SCHEMAS[kind], "")
    rule = _RULES.get(kind)
    if rule is not None:
        rule(obj)
