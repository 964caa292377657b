"""GPUFragmentation: fragmentation-aware GPU placement (the FGD paper's policy and baselines).

Role: the package's public face — ``new_gpufragmentation(args, handle)``, the factory the
plugin registry uses. Layout, by concern: ``measure`` (the fragmentation of a node for a target
workload, and what a placement would leave), ``workload`` (pod shapes; the target workload,
fixed or learned from a bounded window of recent pods), ``args`` (pluginConfig), ``plugin``
(PreFilter, the whole-cluster Score), ``columns`` (the per-row sums and per-slot columns that
Score reads, cached by version), ``pernode`` (the per-node Score). Card state is not kept
here: it is read from the scheduler's one device ledger (``scheduler.devices``).

Invariants: importing the package registers and starts nothing; every profile of one
scheduler reads the same ledger (``scheduler.devices.ledger_of``); the package imports no
other plugin — it meets DeviceShare only through cycle state and the shared ledger.
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
