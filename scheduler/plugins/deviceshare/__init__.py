"""DeviceShare: fine-grained GPU, RDMA and FPGA allocation (Koordinator's plugin).

Role: the package's public face — ``new_deviceshare(args, handle)``, the factory the plugin
registry uses. Layout, by concern: ``args`` (pluginConfig), ``request`` (a pod's device
request), ``ledger`` (every node's cards and their holders, as numpy matrices), ``scoring``
(card and node scores), ``topology`` (PCIe/NUMA-aware choice), ``allocator`` (which cards),
``plugin`` (the thin extension points).

Invariants: importing the package registers and starts nothing; every profile of one
scheduler shares one ledger and one event handler (``Handle.shared_state``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.framework.interfaces import Handle
from scheduler.plugins.deviceshare.args import DeviceShareArgs, parse_args
from scheduler.plugins.deviceshare.ledger import NodeDeviceLedger
from scheduler.plugins.deviceshare.plugin import NAME, DeviceShare

__all__ = ["NAME", "DeviceShare", "DeviceShareArgs", "NodeDeviceLedger", "new_deviceshare"]


def new_deviceshare(args: Mapping[str, Any], handle: Handle) -> DeviceShare:
    """Validate ``args`` (``PluginArgsError`` names the field) and build the plugin."""
    return DeviceShare.with_handle(handle, parse_args(args))
