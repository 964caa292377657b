"""The validating webhook's first check: refuse at create a pod the scheduler would call
invalid, instead of letting it sit Pending with the reason.

Role: ``pod_problem(pod, policy)`` is None for a pod koord-scheduler can schedule, else one
message naming where the problem is and what the scheduler says about it:

- per container, the device resources as the API server's validation of extended resources
  has them (whole numbers, not negative, request equal to limit), for the case it has not run;
- the pod's device request through ``scheduler.devices.parse_request``, the function
  DeviceShare's PreFilter calls (one source of truth: its messages are Koordinator's: invalid
  combinations such as gpu-core alone, ratios over 100 that are not whole cards, hint and
  partition annotations that do not decode); the message names the first container whose own
  request is refused, else the containers together, else the annotations;
- the gang spec through ``apis.gang.gang_of``, the Coscheduling plugin's reading.

Invariants: pure; the pod is decoded with ``apis.core.decode_pod`` (its errors name the
field); a pod without device resources or gang annotations has no problem here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from apis.core import DecodeError, Pod, decode_pod
from apis.gang import GangSpecError, gang_of
from apis.gpushare import RESOURCE_GPU_COUNT, RESOURCE_GPU_MEM
from apis.quantity import Quantity, QuantityError
from apis.resources import ALL_DEVICE_RESOURCES
from scheduler.devices.request import RequestError, parse_request
from scheduler.webhook.policy import WebhookPolicy, containers

__all__ = ["DEVICE_RESOURCES", "pod_problem"]

DEVICE_RESOURCES: Final = ALL_DEVICE_RESOURCES | {RESOURCE_GPU_MEM, RESOURCE_GPU_COUNT}
"""The extended resources whose amounts the device allocators read."""


def _where(kind: str, i: int, container: Mapping[str, Any]) -> str:
    name = container.get("name")
    return f"spec.{kind}[{i}]" + (f" ({name})" if isinstance(name, str) and name else "")


def _amounts(container: Mapping[str, Any], where: str) -> str | None:
    """Whole, non-negative device amounts, each request equal to its limit."""
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return None
    seen: dict[str, dict[str, Any]] = {}
    for part in ("requests", "limits"):
        names = resources.get(part)
        if not isinstance(names, Mapping):
            continue
        for name, raw in names.items():
            if name not in DEVICE_RESOURCES:
                continue
            field = f"{where}.resources.{part}[{name}]"
            try:
                value = Quantity.parse(raw).value
            except QuantityError as exc:
                return f"{field}: {exc}"
            if value < 0:
                return f"{field}: must not be negative, got {raw!r}"
            if value.denominator != 1:
                return f"{field}: must be a whole number, got {raw!r}"
            seen.setdefault(name, {})[part] = value
    for name, parts in sorted(seen.items()):
        if "requests" in parts and "limits" in parts and parts["requests"] != parts["limits"]:
            return (
                f"{where}.resources.requests[{name}]: must equal its limit "
                f"({parts['requests']} != {parts['limits']})"
            )
        if "limits" not in parts:
            return f"{where}.resources.limits[{name}]: required with its request"
    return None


def _request_problem(pod: Mapping[str, Any], decoded: Pod, policy: WebhookPolicy) -> str | None:
    """The scheduler's own verdict, placed on the container that causes it."""
    try:
        parse_request(decoded, policy.gpushare_unit)
    except RequestError as err:
        message = err.message
    else:
        return None
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    for kind, i, container in containers(spec):
        alone = {"metadata": {"name": "-"}, "spec": {"containers": [container]}}
        try:
            parse_request(decode_pod(alone), policy.gpushare_unit)
        except RequestError as err:
            return f"{_where(kind, i, container)}.resources: {err.message}"
    bare = {"metadata": {"name": "-"}, "spec": spec}
    try:
        parse_request(decode_pod(bare), policy.gpushare_unit)
    except RequestError:
        return f"spec (the containers' device requests together): {message}"
    return f"metadata.annotations: {message}"


def _named(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod with a name to decode: a generateName pod reaches a mutating pass unnamed."""
    meta = pod.get("metadata")
    if isinstance(meta, Mapping) and not meta.get("name"):
        return {**pod, "metadata": {**meta, "name": str(meta.get("generateName") or "-")}}
    return pod


def pod_problem(pod: Mapping[str, Any], policy: WebhookPolicy) -> str | None:
    pod = _named(pod)
    spec = pod.get("spec")
    if isinstance(spec, Mapping):
        for kind, i, container in containers(spec):
            problem = _amounts(container, _where(kind, i, container))
            if problem is not None:
                return problem
    try:
        decoded = decode_pod(pod)
        problem = _request_problem(pod, decoded, policy)
        if problem is not None:
            return problem
        gang_of(decoded)
    except DecodeError as err:
        return str(err)
    except GangSpecError as err:
        return f"invalid gang spec: {err}"
    return None
