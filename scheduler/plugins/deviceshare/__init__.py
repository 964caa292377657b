"""DeviceShare: fine-grained GPU, RDMA and FPGA allocation (Koordinator's plugin).

Role: the package's public face — ``new_deviceshare(args, handle)``, the factory the plugin
registry uses. Layout: ``args`` (pluginConfig), ``plugin`` (the thin extension points) and
``state`` (the cycle-state entry, its what-if a ``NodeOverlay`` per node); the card state
and its logic (request parsing, the ledger, scoring, topology, the allocator) live below the
plugins in ``scheduler.devices``, shared with every other user of card state.

Invariants: importing the package registers and starts nothing; every profile of one
scheduler shares one ledger and one event handler (``scheduler.devices.ledger_of``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.devices import NodeDeviceLedger
from scheduler.framework.interfaces import Handle
from scheduler.plugins.deviceshare.args import DeviceShareArgs, parse_args
from scheduler.plugins.deviceshare.plugin import NAME, DeviceShare

__all__ = ["NAME", "DeviceShare", "DeviceShareArgs", "NodeDeviceLedger", "new_deviceshare"]


def new_deviceshare(args: Mapping[str, Any], handle: Handle) -> DeviceShare:
    """Validate ``args`` (``PluginArgsError`` names the field) and build the plugin."""
    return DeviceShare.with_handle(handle, parse_args(args))
