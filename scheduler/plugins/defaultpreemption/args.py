"""``DefaultPreemptionArgs`` (``kubescheduler.config.k8s.io/v1beta1``) and their validation.

``minCandidateNodesPercentage`` (0 to 100, default 10) and ``minCandidateNodesAbsolute`` (≥ 0,
default 100): the dry run stops once max(percentage of the nodes, absolute) candidate nodes
are found; both 0 is invalid, as kube-scheduler's ``ValidateDefaultPreemptionArgs`` says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.framework.interfaces import PluginArgsError

__all__ = ["DefaultPreemptionArgs", "parse_args"]

_FIELDS = frozenset(
    {"kind", "apiVersion", "minCandidateNodesPercentage", "minCandidateNodesAbsolute"}
)


@dataclass(frozen=True, slots=True)
class DefaultPreemptionArgs:
    min_candidate_nodes_percentage: int = 10
    min_candidate_nodes_absolute: int = 100

    def num_candidates(self, num_nodes: int) -> int:
        """kube's ``calculateNumCandidates``."""
        n = num_nodes * self.min_candidate_nodes_percentage // 100
        n = max(n, self.min_candidate_nodes_absolute)
        return min(n, num_nodes)


def _int(args: Mapping[str, Any], key: str, default: int) -> int:
    value = args.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise PluginArgsError(f"DefaultPreemption args: {key} must be an integer, got {value!r}")
    return value


def parse_args(args: Mapping[str, Any]) -> DefaultPreemptionArgs:
    unknown = sorted(str(k) for k in args if k not in _FIELDS)
    if unknown:
        raise PluginArgsError(f"DefaultPreemption args: unknown field(s) {', '.join(unknown)}")
    pct = _int(args, "minCandidateNodesPercentage", 10)
    absolute = _int(args, "minCandidateNodesAbsolute", 100)
    if not 0 <= pct <= 100:
        raise PluginArgsError(
            f"DefaultPreemption args: minCandidateNodesPercentage must be in [0, 100], got {pct}"
        )
    if absolute < 0:
        raise PluginArgsError(
            f"DefaultPreemption args: minCandidateNodesAbsolute must be >= 0, got {absolute}"
        )
    if pct == 0 and absolute == 0:
        raise PluginArgsError(
            "DefaultPreemption args: minCandidateNodesPercentage and minCandidateNodesAbsolute "
            "cannot both be zero"
        )
    return DefaultPreemptionArgs(pct, absolute)
