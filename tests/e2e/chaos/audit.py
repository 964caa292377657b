"""Reading the API server's audit log for the chaos tier: the Lease's holder timeline and every
pods/binding write, and the check that no replica wrote a binding after it lost the lease.

Bindings are matched to the pod incarnation they landed on by time: a successful binding of a
name counts for the incarnation whose create completed before the binding did. (The v1.20 API
server does not enforce the Binding's ``metadata.uid`` precondition: a binding sent for a pod
that was deleted and re-created under the same name while it was in flight lands on the new
pod; the tier counts those as ``stale-UID bindings`` and checks the cards they fill.)

Only the API server's clock is used (``requestReceivedTimestamp`` and ``stageTimestamp`` of the
ResponseComplete stage); the replicas' clocks never enter. A binding is *late* when it was
written (HTTP 201) by a replica's user and either

- another holder's Lease write had completed before the binding was received, and this replica
  wrote no Lease naming itself while the binding was being served (``lost``), or
- the last Lease write naming this replica completed more than ``leaseDurationSeconds`` before
  the binding was received (``expired``: nobody may have taken over yet, but the replica had no
  right to act).

The check is conservative where requests overlap: a binding served while the same replica's
Lease write is in flight is not counted, so every reported late bind is a real one.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

WORKLOAD_USER = "chaos-user"
"""The ordinary user who creates the workload's pods (and tries to forge allocations)."""
AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "RequestResponse",
            "verbs": ["create", "update", "patch"],
            "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}],
        },
        {
            "level": "Request",
            "verbs": ["create"],
            "resources": [{"group": "", "resources": ["pods/binding"]}],
        },
        {
            "level": "Metadata",
            "verbs": ["create", "delete"],
            "resources": [{"group": "", "resources": ["pods"]}],
        },
        {
            "level": "Metadata",
            "users": [WORKLOAD_USER],
            "verbs": ["update", "patch"],
            "resources": [{"group": "", "resources": ["pods", "pods/status"]}],
        },
        {"level": "None"},
    ],
}


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class LeaseWrite:
    received: float
    completed: float
    holder: str
    duration: float
    user: str


@dataclass(frozen=True)
class BindingWrite:
    received: float
    completed: float
    user: str
    user_agent: str
    namespace: str
    name: str
    uid: str
    node: str
    code: int


@dataclass(frozen=True)
class LateBind:
    binding: BindingWrite
    reason: str  # "lost" or "expired"
    lease_holder: str
    late_by: float = 0.0  # seconds since the lease was lost / expired, when the server got it

    def __str__(self) -> str:
        b = self.binding
        return (
            f"{b.namespace}/{b.name} -> {b.node} by {b.user} (HTTP {b.code}): lease {self.reason} "
            f"{self.late_by:.3f}s before the server got it (holder then: "
            f"{self.lease_holder or '<none>'})"
        )


def sent_before_freeze(
    late: Iterable[LateBind],
    resumes: Mapping[str, Iterable[float]],
    window: float,
) -> tuple[list[LateBind], list[LateBind]]:
    """Split late binds into (late, in flight at a freeze): a binding that reached the server
    within ``window`` seconds after its replica (API user) was resumed from SIGSTOP was sent by
    a request frozen between the fence check — passed while the lease was held — and the write
    on the wire. No client can close that window (Kubernetes has no fencing tokens); every
    other late binding is a defect."""
    strict: list[LateBind] = []
    frozen: list[LateBind] = []
    for lb in late:
        times = resumes.get(lb.binding.user, ())
        if any(0.0 <= lb.binding.received - t <= window for t in times):
            frozen.append(lb)
        else:
            strict.append(lb)
    return strict, frozen


def _complete(events: Iterable[Mapping[str, Any]]) -> Iterable[Mapping[str, Any]]:
    for ev in events:
        if ev.get("stage") == "ResponseComplete":
            yield ev


def lease_writes(
    events: Iterable[Mapping[str, Any]], namespace: str, name: str
) -> list[LeaseWrite]:
    """Successful creates/updates of the Lease, ordered by completion."""
    out = []
    for ev in _complete(events):
        ref = ev.get("objectRef") or {}
        if ref.get("resource") != "leases" or ref.get("namespace") != namespace:
            continue
        if ref.get("name") != name or ev.get("verb") not in ("create", "update", "patch"):
            continue
        if int((ev.get("responseStatus") or {}).get("code", 0)) >= 300:
            continue
        spec = (ev.get("responseObject") or {}).get("spec") or {}
        out.append(
            LeaseWrite(
                received=_ts(ev["requestReceivedTimestamp"]),
                completed=_ts(ev["stageTimestamp"]),
                holder=str(spec.get("holderIdentity") or ""),
                duration=float(spec.get("leaseDurationSeconds") or 0),
                user=str((ev.get("user") or {}).get("username", "")),
            )
        )
    out.sort(key=lambda w: w.completed)
    return out


def binding_writes(events: Iterable[Mapping[str, Any]], namespace: str) -> list[BindingWrite]:
    """Every pods/binding create in ``namespace`` (any outcome), ordered by receipt."""
    out = []
    for ev in _complete(events):
        ref = ev.get("objectRef") or {}
        if ref.get("resource") != "pods" or ref.get("subresource") != "binding":
            continue
        if ref.get("namespace") != namespace:
            continue
        req = ev.get("requestObject") or {}
        out.append(
            BindingWrite(
                received=_ts(ev["requestReceivedTimestamp"]),
                completed=_ts(ev["stageTimestamp"]),
                user=str((ev.get("user") or {}).get("username", "")),
                user_agent=str(ev.get("userAgent", "")),
                namespace=namespace,
                name=str(ref.get("name", "")),
                uid=str((req.get("metadata") or {}).get("uid") or ""),
                node=str((req.get("target") or {}).get("name", "")),
                code=int((ev.get("responseStatus") or {}).get("code", 0)),
            )
        )
    out.sort(key=lambda b: b.received)
    return out


def late_binds(
    bindings: Iterable[BindingWrite],
    leases: list[LeaseWrite],
    identity_prefix: Mapping[str, str],
    *,
    attempts: bool = False,
) -> list[LateBind]:
    """Successful bindings written without the lease; ``identity_prefix`` maps a replica's API
    user to the prefix of its leader-election identities (one per process incarnation).
    ``attempts=True``: every binding request sent without the lease, whatever its answer (a
    deposed leader's binds that the API server rejected because the new leader had bound the
    pod first)."""
    completed = [w.completed for w in leases]
    late: list[LateBind] = []
    for b in bindings:
        if b.code != 201 and not attempts:
            continue
        prefix = identity_prefix.get(b.user)
        if prefix is None:
            continue  # not a replica (the test's own client)

        def mine(w: LeaseWrite, prefix: str = prefix) -> bool:
            return w.holder.startswith(prefix)

        i = bisect.bisect_left(completed, b.received)  # leases[:i] completed before receipt
        before = leases[:i]
        overlapping = [w for w in leases[i:] if w.received <= b.completed]
        if any(mine(w) for w in overlapping):
            continue  # this replica's Lease write raced the binding: not provably late
        if not before:
            late.append(LateBind(b, "lost", ""))
            continue
        last = before[-1]
        if not mine(last):
            mine_before = [j for j, w in enumerate(before) if mine(w)]
            lost_at = before[mine_before[-1] + 1] if mine_before else before[0]
            late.append(LateBind(b, "lost", last.holder, b.received - lost_at.completed))
            continue
        expires = last.completed + last.duration
        if b.received > expires:
            late.append(LateBind(b, "expired", last.holder, b.received - expires))
    return late


def last_creates(events: Iterable[Mapping[str, Any]], namespace: str) -> dict[str, float]:
    """Pod name -> receipt time of its last successful create (its live incarnation). Receipt,
    not completion: a scheduler can see the pod on its watch and bind it before the API server
    logs the create as complete."""
    out: dict[str, float] = {}
    for ev in _complete(events):
        ref = ev.get("objectRef") or {}
        if ref.get("resource") != "pods" or ref.get("subresource") or ev.get("verb") != "create":
            continue
        if ref.get("namespace") != namespace or not ref.get("name"):
            continue
        if int((ev.get("responseStatus") or {}).get("code", 0)) != 201:
            continue
        t = _ts(ev["requestReceivedTimestamp"])
        out[ref["name"]] = max(t, out.get(ref["name"], t))
    return out


def bindings_of_live(
    bindings: Iterable[BindingWrite], creates: Mapping[str, float]
) -> dict[str, list[BindingWrite]]:
    """Pod name -> the successful bindings that landed on its live incarnation: those that
    completed after its create was received (a binding completes after its pod exists; the
    test re-creates a name only after the delete of the previous incarnation completed)."""
    out: dict[str, list[BindingWrite]] = {}
    for b in bindings:
        created = creates.get(b.name)
        if b.code == 201 and created is not None and b.completed > created:
            out.setdefault(b.name, []).append(b)
    return out


def transitions(leases: Iterable[LeaseWrite]) -> list[LeaseWrite]:
    """The Lease writes that changed the holder."""
    out: list[LeaseWrite] = []
    for w in leases:
        if not out or out[-1].holder != w.holder:
            out.append(w)
    return out


@dataclass(frozen=True)
class PodWrite:
    verb: str
    name: str
    subresource: str
    code: int


def pod_writes(events: Iterable[Mapping[str, Any]], namespace: str, user: str) -> list[PodWrite]:
    """Every completed create, update or patch of a pod or a subresource (``status``,
    ``binding``) by ``user``, with its answer."""
    out: list[PodWrite] = []
    for ev in _complete(events):
        ref = ev.get("objectRef") or {}
        if ref.get("resource") != "pods" or ref.get("namespace") != namespace:
            continue
        if (ev.get("user") or {}).get("username") != user:
            continue
        if ev.get("verb") not in ("create", "update", "patch"):
            continue
        code = int((ev.get("responseStatus") or {}).get("code", 0))
        out.append(PodWrite(ev["verb"], str(ref.get("name", "")), ref.get("subresource", ""), code))
    return out
