"""The API server's admission chain in front of koord-webhook, as the shipped configurations
(config/webhook/configurations.yaml) wire it, for the model-based tests.

Role: ``AdmissionChain.admit(operation, obj, old, user, ...)`` does what kube-apiserver does
with a pod write: every mutating webhook whose rules, namespaceSelector and objectSelector
match is POSTed an ``admission.k8s.io/v1`` AdmissionReview (the real route functions of
``scheduler.webhook.server.AdmissionRoutes``: bytes in, bytes out) and its JSONPatch applied;
then every matching validating webhook judges the result; any refusal refuses the write. A
webhook that cannot be called (``down``: the process is gone; ``stall``: this one call times
out) is handled by its configuration's ``failurePolicy``: ``Fail`` refuses the write,
``Ignore`` skips the webhook.

Everything the chain decides with is read from the configuration file: which webhooks exist,
their paths, operations, resources (``pods``, ``pods/status``, ``pods/binding``), selectors
and failure policies; so a model over it follows the shipped configuration.

Invariants: the object the mutating webhooks see is the one the validating webhooks see,
patched; a mutating webhook's second pass over its own output patches nothing
(``reinvocationPolicy: IfNeeded``), checked on every call.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scheduler.webhook.policy import WebhookPolicy
from scheduler.webhook.review import UserInfo
from scheduler.webhook.server import AdmissionRoutes, WebhookMetrics
from tests.unit.webhook.reviews import apply_patch, patch_of, response

CONFIGURATIONS = Path(__file__).resolve().parent.parent / "config/webhook/configurations.yaml"


@dataclass(frozen=True)
class Hook:
    """One webhook of a Mutating- or ValidatingWebhookConfiguration."""

    name: str
    path: str
    mutating: bool
    failure_policy: str
    rules: tuple[tuple[frozenset[str], frozenset[str]], ...]
    """(operations, resources with their subresource: ``pods``, ``pods/status``)."""
    namespace_selector: Mapping[str, Any]
    object_selector: Mapping[str, Any]

    def covers(self, operation: str, resource: str) -> bool:
        return any(
            (operation in ops or "*" in ops) and (resource in res or "*" in res)
            for ops, res in self.rules
        )


def load_hooks(path: Path = CONFIGURATIONS) -> tuple[Hook, ...]:
    """The webhooks of the configuration file, mutating ones first (the API server's order)."""
    hooks = []
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        mutating = doc["kind"] == "MutatingWebhookConfiguration"
        for hook in doc["webhooks"]:
            rules = tuple(
                (frozenset(r["operations"]), frozenset(r["resources"]))
                for r in hook.get("rules", [])
                if "" in r.get("apiGroups", []) and "v1" in r.get("apiVersions", [])
            )
            hooks.append(
                Hook(
                    name=hook["name"],
                    path=hook["clientConfig"]["service"]["path"],
                    mutating=mutating,
                    failure_policy=hook.get("failurePolicy", "Fail"),
                    rules=rules,
                    namespace_selector=hook.get("namespaceSelector") or {},
                    object_selector=hook.get("objectSelector") or {},
                )
            )
    return tuple(sorted(hooks, key=lambda h: not h.mutating))


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector (matchLabels, matchExpressions) over ``labels``; empty: all."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    meta = (obj or {}).get("metadata") or {}
    return meta.get("labels") or {}


@dataclass
class Outcome:
    allowed: bool
    obj: dict[str, Any] | None
    """The object as admitted (patched), or as the validating webhooks saw it when refused."""
    reason: str = ""
    verdicts: dict[str, bool] = field(default_factory=dict)
    """webhook path -> its answer (allowed?), for each webhook that answered."""


class AdmissionChain:
    """kube-apiserver's admission over the webhooks of ``hooks`` (see the module doc)."""

    def __init__(
        self,
        policy: WebhookPolicy,
        hooks: Sequence[Hook] | None = None,
        namespaces: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.policy = policy
        self.hooks = tuple(hooks if hooks is not None else load_hooks())
        self.routes = AdmissionRoutes(policy, WebhookMetrics()).routes()
        self.namespaces = dict(namespaces or {})
        self.down = False
        """The webhook process is gone: no call is answered."""
        self.stalled: set[str] = set()
        """Paths whose next call times out (one call each)."""
        self._uids = itertools.count()

    def hook(self, path: str) -> Hook:
        return next(h for h in self.hooks if h.path == path)

    def _ns_labels(self, namespace: str) -> Mapping[str, str]:
        return self.namespaces.get(namespace, {"kubernetes.io/metadata.name": namespace})

    def _call(
        self,
        hook: Hook,
        operation: str,
        sub_resource: str,
        namespace: str,
        obj: Mapping[str, Any] | None,
        old: Mapping[str, Any] | None,
        user: UserInfo,
    ) -> dict[str, Any] | None:
        """The hook's response, or None when it could not be called."""
        if self.down:
            return None
        if hook.path in self.stalled:
            self.stalled.discard(hook.path)
            return None
        name = ((obj or old or {}).get("metadata") or {}).get("name", "")
        request: dict[str, Any] = {
            "uid": f"review-{next(self._uids)}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": operation,
            "namespace": namespace,
            "name": name,
            "userInfo": {"username": user.username, "groups": list(user.groups)},
            "object": obj,
            "oldObject": old,
        }
        if sub_resource:
            request["subResource"] = sub_resource
        doc = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        code, body, _ = self.routes[hook.path](json.dumps(doc).encode())
        assert code == 200, (hook.path, code, body)
        answer = response(body)
        assert answer["uid"] == request["uid"]
        return answer

    def admit(
        self,
        operation: str,
        obj: Mapping[str, Any] | None,
        user: UserInfo,
        *,
        old: Mapping[str, Any] | None = None,
        sub_resource: str = "",
        namespace: str = "default",
    ) -> Outcome:
        resource = "pods" + (f"/{sub_resource}" if sub_resource else "")
        current = copy.deepcopy(dict(obj)) if obj is not None else None
        verdicts: dict[str, bool] = {}
        ns_labels = self._ns_labels(namespace)
        for hook in self.hooks:
            if not hook.covers(operation, resource) or not selects(
                hook.namespace_selector, ns_labels
            ):
                continue
            # objectSelector: called when the new or the old object matches.
            if not (
                selects(hook.object_selector, _labels(current))
                or (old is not None and selects(hook.object_selector, _labels(old)))
            ):
                continue
            answer = self._call(hook, operation, sub_resource, namespace, current, old, user)
            if answer is None:
                if hook.failure_policy == "Ignore":
                    continue
                return Outcome(False, current, f"failed calling webhook {hook.name!r}", verdicts)
            verdicts[hook.path] = bool(answer["allowed"])
            if not answer["allowed"]:
                message = str(answer.get("status", {}).get("message", ""))
                return Outcome(False, current, f"{hook.name} denied: {message}", verdicts)
            patch = patch_of(answer)
            if patch:
                assert hook.mutating, (hook.name, patch)
                current = apply_patch(current or {}, patch)
                again = self._call(hook, operation, sub_resource, namespace, current, old, user)
                assert again is not None and not patch_of(again), f"{hook.name} not idempotent"
        return Outcome(True, current, "", verdicts)
