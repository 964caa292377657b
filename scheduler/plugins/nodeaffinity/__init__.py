"""NodeAffinity: ``spec.nodeSelector`` and node affinity (kube-scheduler's plugin)."""

from scheduler.plugins.nodeaffinity.plugin import (
    ERR_REASON_CONFLICT,
    ERR_REASON_ENFORCED,
    ERR_REASON_POD,
    PRE_FILTER_STATE_KEY,
    PRE_SCORE_STATE_KEY,
    NodeAffinity,
    NodeAffinityArgs,
    parse_args,
    parse_int64,
)

__all__ = [
    "ERR_REASON_CONFLICT",
    "ERR_REASON_ENFORCED",
    "ERR_REASON_POD",
    "PRE_FILTER_STATE_KEY",
    "PRE_SCORE_STATE_KEY",
    "NodeAffinity",
    "NodeAffinityArgs",
    "parse_args",
    "parse_int64",
]
