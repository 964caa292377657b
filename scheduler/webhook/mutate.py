"""The mutating webhook: GPU pods go to koord-scheduler without editing their YAML.

Role: ``mutate(review, policy)`` is the JSONPatch for a pod CREATE: ``spec.schedulerName``
set to the policy's scheduler when the pod asks for a GPU resource and names no scheduler of
its own; with ``translate_nvidia_gpu``, each container's ``nvidia.com/gpu: N`` becomes
Koordinator's ``koordinator.sh/gpu-core: N*100`` and ``koordinator.sh/gpu-memory-ratio:
N*100`` (the scheduler's own reading of ``nvidia.com/gpu``, made explicit).

Invariants:

- Minimal and idempotent: a second pass over its own output patches nothing (the
  configuration's ``reinvocationPolicy: IfNeeded`` may call it again after other webhooks).
- "Names no scheduler" means absent, empty or ``default-scheduler``: the API server defaults
  the field before admission, so an explicit ``default-scheduler`` cannot be told apart (a pod
  that must stay on the default scheduler carries the opt-out label).
- Untouched: pods with the opt-out label, pods that already have ``spec.nodeName`` (no
  scheduler runs for them), subresources, UPDATEs, anything that is not a pod.
- Translation skips a container that also names gpu-core or gpu-memory-ratio (validation
  refuses that combination with the scheduler's message) or whose count is not a whole
  positive number.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apis.quantity import Quantity, QuantityError
from apis.resources import GPU_CORE, GPU_MEMORY_RATIO, NVIDIA_GPU
from scheduler.webhook.policy import OPT_OUT_LABEL, OPT_OUT_VALUE, WebhookPolicy, containers
from scheduler.webhook.review import Review

__all__ = ["DEFAULT_SCHEDULER", "Patch", "mutate", "pointer"]

DEFAULT_SCHEDULER = "default-scheduler"
Patch = list[dict[str, Any]]


def pointer(*parts: str | int) -> str:
    """A JSON Pointer (RFC 6901): ``~`` and ``/`` escaped in each part."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def mutate(review: Review, policy: WebhookPolicy) -> Patch:
    pod = review.object
    if not review.is_pod or review.sub_resource or review.operation != "CREATE" or pod is None:
        return []
    meta = pod.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if isinstance(labels, Mapping) and labels.get(OPT_OUT_LABEL) == OPT_OUT_VALUE:
        return []
    spec = pod.get("spec")
    if not isinstance(spec, Mapping) or spec.get("nodeName") or not policy.asks_for_gpu(spec):
        return []
    patch: Patch = []
    if policy.translate_nvidia_gpu:
        patch += _translate(spec)
    current = spec.get("schedulerName")
    if current in (None, "", DEFAULT_SCHEDULER) and current != policy.scheduler_name:
        op = "add" if current is None else "replace"
        patch.append({"op": op, "path": "/spec/schedulerName", "value": policy.scheduler_name})
    return patch


def _whole(raw: Any) -> int | None:
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        return None
    try:
        value = Quantity.parse(raw).value
    except QuantityError:
        return None
    return int(value) if value.denominator == 1 and value > 0 else None


def _translate(spec: Mapping[str, Any]) -> Patch:
    patch: Patch = []
    for kind, i, container in containers(spec):
        resources = container.get("resources")
        if not isinstance(resources, Mapping):
            continue
        for part in ("limits", "requests"):
            names = resources.get(part)
            if not isinstance(names, Mapping) or NVIDIA_GPU not in names:
                continue
            count = _whole(names[NVIDIA_GPU])
            if count is None or GPU_CORE in names or GPU_MEMORY_RATIO in names:
                continue
            base = ("spec", kind, i, "resources", part)
            patch.append({"op": "remove", "path": pointer(*base, NVIDIA_GPU)})
            for name in (GPU_CORE, GPU_MEMORY_RATIO):
                patch.append({"op": "add", "path": pointer(*base, name), "value": str(count * 100)})
    return patch
