"""The node's pods as the fair-share server sees them (pure).

Role: ``fairshare_pods`` turns the node's pod records (``koordlet.pods.record``, decoded once
by the kube adapter) into the opted-in clients (``FairSharePod``) through ``apis.fairshare``,
the same decoder the runtime hook uses.

Invariants: a pod whose fair-share input is bad is left out and reported in the returned
problems (one line each: the agent logs them, it never stops on them); pods that did not opt
in, have no allocation or hold whole cards are simply not clients.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from apis.fairshare import DefaultLimit, FairShareInputError, FairShareSpec, fairshare_spec
from koordlet.pods.record import PodRecord

__all__ = ["FairSharePod", "classify_pods", "fairshare_pods"]


@dataclass(frozen=True, slots=True)
class FairSharePod:
    """An opted-in pod on this node and what it asks of its card."""

    uid: str
    namespace: str
    name: str
    spec: FairShareSpec


def fairshare_pods(
    records: Iterable[PodRecord], default_limit: DefaultLimit = DefaultLimit.FULL
) -> tuple[list[FairSharePod], list[str]]:
    """The opted-in clients among ``records``, and one problem line per pod left out."""
    pods, problems = classify_pods(records, default_limit)
    return pods, [f"pod {r.namespace}/{r.name}: {message}" for r, message in problems]


def classify_pods(
    records: Iterable[PodRecord], default_limit: DefaultLimit = DefaultLimit.FULL
) -> tuple[list[FairSharePod], list[tuple[PodRecord, str]]]:
    """The opted-in clients among ``records``, and each pod left out with the reason."""
    pods: list[FairSharePod] = []
    problems: list[tuple[PodRecord, str]] = []
    for r in records:
        try:
            spec = fairshare_spec(r.labels, r.annotations, default_limit)
        except FairShareInputError as err:
            problems.append((r, str(err)))
            continue
        if spec is not None:
            pods.append(FairSharePod(r.uid, r.namespace, r.name, spec))
    return pods, problems
