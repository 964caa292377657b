"""NodeAffinity: ``spec.nodeSelector`` and node affinity (kube-scheduler's plugin).

Role: the package's public face. Layout, by concern: ``plugin`` (the extension points and the
per-shape caches of the whole-cluster forms), ``selector`` (component-helpers' matching,
compiled once, per node and over the snapshot's columns), ``args`` (``addedAffinity``).
Importing the package registers and starts nothing; it imports no other plugin.
"""

from scheduler.plugins.nodeaffinity.args import NodeAffinityArgs, parse_args
from scheduler.plugins.nodeaffinity.plugin import (
    ERR_REASON_CONFLICT,
    ERR_REASON_ENFORCED,
    ERR_REASON_POD,
    PRE_FILTER_STATE_KEY,
    PRE_SCORE_STATE_KEY,
    NodeAffinity,
)
from scheduler.plugins.nodeaffinity.selector import parse_int64

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
