"""``scheduler.devices.ledger_of``: one ledger per scheduler, shared by every profile and
plugin, its event handler registered once (``Handle.component``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from scheduler.devices import NodeDeviceLedger, ledger_of
from scheduler.framework.events import Change
from scheduler.framework.interfaces import Handle
from scheduler.plugins.deviceshare import new_deviceshare
from scheduler.plugins.gpufragmentation import new_gpufragmentation
from tests.builders import ManualClock, RecordingClient
from tests.unit.devices.helpers import gpus, snapshot_of


def _handle(profile: str, shared: dict[str, Any], handlers: list[Callable[[Change], None]]
            ) -> Handle:
    return Handle(snapshot_of(["n0"]), RecordingClient(), ManualClock(), profile,
                  shared=shared, event_handlers=handlers)


def test_every_profile_and_plugin_reads_one_ledger_fed_once() -> None:
    shared: dict[str, Any] = {}
    handlers: list[Callable[[Change], None]] = []
    a, b = _handle("a", shared, handlers), _handle("b", shared, handlers)
    deviceshare = new_deviceshare({}, a)
    fragmentation = new_gpufragmentation({}, b)
    assert deviceshare.ledger is fragmentation.ledger is ledger_of(a) is ledger_of(b)
    assert len(handlers) == 1
    for handler in handlers:
        handler(Change("Device", None, gpus("n0", 2)))
    assert ledger_of(a).minors("n0", "gpu") == (0, 1)


def test_a_component_slot_holding_something_else_is_an_error() -> None:
    shared: dict[str, Any] = {}
    handle = _handle("a", shared, [])
    ledger_of(handle)
    (key,) = shared
    shared[key] = object()
    with pytest.raises(TypeError, match="NodeDeviceLedger"):
        handle.component(NodeDeviceLedger, NodeDeviceLedger)
