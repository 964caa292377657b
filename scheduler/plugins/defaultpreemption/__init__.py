"""DefaultPreemption: kube-scheduler's preemption as a PostFilter plugin, device-exact.

Role: when a pod fits nowhere, find the node where evicting the fewest, least important
lower-priority pods makes it fit, evict them, and nominate the pod to that node. The dry run
removes victims through every PreFilter plugin's ``RemovePod`` — DeviceShare's included, so
the freed shares land on the very cards the victims held — and asks the same Filter plugins
(the same allocator) whether the pod fits; nothing is approximated.

See ``plugin.py`` for the rules and ``args.py`` for the configuration.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.framework.interfaces import Handle
from scheduler.plugins.defaultpreemption.args import DefaultPreemptionArgs, parse_args
from scheduler.plugins.defaultpreemption.plugin import NAME, DefaultPreemption

__all__ = ["NAME", "DefaultPreemption", "DefaultPreemptionArgs", "new_default_preemption"]


def new_default_preemption(args: Mapping[str, Any], handle: Handle) -> DefaultPreemption:
    return DefaultPreemption(handle, parse_args(args))
