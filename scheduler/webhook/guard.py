"""The validating webhook's second check: only the scheduler and the node agent write
allocations, and no pod in a guarded namespace skips the node's runtime hooks.

Role: ``guard_problem(review, policy)`` is None, or the refusal of a pod CREATE or UPDATE
(``pods`` and ``pods/status``: a status update can change annotations too) that sets, changes
or removes an allocation annotation while its requester is not one of the policy's
allocation writers. Those annotations are what the scheduler's device ledger and the node
agent count as held cards: Koordinator's ``scheduling.koordinator.sh/device-allocated`` and
gpushare's ``ALIYUN_COM_GPU_MEM_*``. A pod created with them and ``spec.nodeName`` (or one
patched afterwards) would otherwise be counted, negative amounts included.

The same check refuses a pod that sets or changes koord-runtime-proxy's skip label
(``runtimeproxy.koordinator.sh/skip-hookserver``), whoever asks: the proxy never sends such a
pod to koordlet, so its containers would see what their image asks for (``all`` GPUs). The
node's own DaemonSets carry it, in namespaces the webhook does not guard (``kube-system``,
``koordinator-system``, or one labelled ``koordinator.sh/webhook=disabled``, which a tenant
cannot label).

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
from apis.device import LABEL_SKIP_HOOKSERVER
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


def _meta_map(obj: Mapping[str, Any] | None, field: str) -> Mapping[str, Any]:
    meta = obj.get("metadata") if obj is not None else None
    found = meta.get(field) if isinstance(meta, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def guard_problem(review: Review, policy: WebhookPolicy) -> str | None:
    if not review.is_pod or review.sub_resource not in GUARDED_SUBRESOURCES:
        return None
    if review.operation not in ("CREATE", "UPDATE") or review.object is None:
        return None
    new_labels = _meta_map(review.object, "labels")
    if new_labels.get(LABEL_SKIP_HOOKSERVER) not in (
        None,
        _meta_map(review.old_object, "labels").get(LABEL_SKIP_HOOKSERVER),
    ):
        return (
            f"metadata.labels[{LABEL_SKIP_HOOKSERVER}]: a pod in this namespace may not skip "
            "the node's runtime hooks (its containers would see every GPU); node DaemonSets "
            "that need it run in a namespace the webhook does not guard"
        )
    new = _meta_map(review.object, "annotations")
    old = _meta_map(review.old_object, "annotations")
    changed = [k for k in PROTECTED_ANNOTATIONS if new.get(k) != old.get(k)]
    if not changed or policy.may_write_allocations(review.user):
        return None
    what = "sets" if review.operation == "CREATE" else "changes"
    return (
        f"metadata.annotations[{changed[0]}]: user {json.dumps(review.user.username)} {what} "
        "a device allocation; only koord-scheduler (through pods/binding) and the node agent "
        "write allocations"
    )
