"""GPUFragmentation: fragmentation-aware GPU placement (the FGD paper's policy and baselines).

Role: the package's public face — ``new_gpufragmentation(args, handle)``, the factory the
plugin registry uses. Layout, by concern: ``measure`` (the fragmentation of a node for a target
workload, and what a placement would leave), ``workload`` (pod shapes; the target workload,
fixed or learned from a bounded window of recent pods), ``cards`` (every node's GPU cards,
kept incrementally from events and Reserve), ``args`` (pluginConfig), ``plugin`` (PreFilter,
Score, Reserve).

Invariants: importing the package registers and starts nothing; every profile of one
scheduler shares one card table and one event handler (``Handle.shared_state``); the package
imports no other plugin — it meets DeviceShare only through cycle state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.framework.interfaces import Handle
from scheduler.plugins.gpufragmentation.args import GPUFragmentationArgs, parse_args
from scheduler.plugins.gpufragmentation.plugin import NAME, GPUFragmentation

__all__ = ["NAME", "GPUFragmentation", "GPUFragmentationArgs", "new_gpufragmentation"]


def new_gpufragmentation(args: Mapping[str, Any], handle: Handle) -> GPUFragmentation:
    """Validate ``args`` (``PluginArgsError`` names the field) and build the plugin."""
    return GPUFragmentation.with_handle(handle, parse_args(args))
