"""The validating webhook's second check: only the scheduler and the node agent write
allocations.

Role: ``guard_problem(review, policy)`` is None, or the refusal of a pod CREATE or UPDATE
(``pods`` and ``pods/status``: a status update can change annotations too) that sets, changes
or removes an allocation annotation while its requester is not one of the policy's
allocation writers. Those annotations are what the scheduler's device ledger and the node
agent count as held cards: Koordinator's ``scheduling.koordinator.sh/device-allocated`` and
gpushare's ``ALIYUN_COM_GPU_MEM_*``. A pod created with them and ``spec.nodeName`` (or one
patched afterwards) would otherwise be counted, negative amounts included.

Invariants: compares the old and the new object's annotations (CREATE: none before), so an
update that leaves them alone (the kubelet's status writes, a label change) always passes;
the ``pods/binding`` subresource, the scheduler's own path, is not guarded here (RBAC decides
who may create bindings); non-pod objects pass.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED
from apis.gpushare import (
    ANNOTATION_ASSIGN_TIME,
    ANNOTATION_ASSIGNED,
    ANNOTATION_ASSUME_TIME,
    ANNOTATION_DEV,
    ANNOTATION_IDX,
    ANNOTATION_POD,
)
from scheduler.webhook.policy import WebhookPolicy
from scheduler.webhook.review import Review

__all__ = ["PROTECTED_ANNOTATIONS", "guard_problem"]

PROTECTED_ANNOTATIONS: Final = (
    ANNOTATION_DEVICE_ALLOCATED,
    ANNOTATION_IDX,
    ANNOTATION_POD,
    ANNOTATION_DEV,
    ANNOTATION_ASSIGNED,
    ANNOTATION_ASSUME_TIME,
    ANNOTATION_ASSIGN_TIME,
)
GUARDED_SUBRESOURCES: Final = ("", "status")


def _annotations(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = obj.get("metadata") if obj is not None else None
    found = meta.get("annotations") if isinstance(meta, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def guard_problem(review: Review, policy: WebhookPolicy) -> str | None:
    if not review.is_pod or review.sub_resource not in GUARDED_SUBRESOURCES:
        return None
    if review.operation not in ("CREATE", "UPDATE") or review.object is None:
        return None
    new, old = _annotations(review.object), _annotations(review.old_object)
    changed = [k for k in PROTECTED_ANNOTATIONS if new.get(k) != old.get(k)]
    if not changed or policy.may_write_allocations(review.user):
        return None
    what = "sets" if review.operation == "CREATE" else "changes"
    return (
        f"metadata.annotations[{changed[0]}]: user {json.dumps(review.user.username)} {what} "
        "a device allocation; only koord-scheduler (through pods/binding) and the node agent "
        "write allocations"
    )
