"""DefaultBinder: one bind call with the collected annotations; BindError -> Error status."""

from __future__ import annotations

import pytest

from scheduler.framework.cycle_state import CycleState
from scheduler.framework.interfaces import BindError, BindPlugin
from scheduler.framework.status import Code
from scheduler.plugins.defaultbinder import DefaultBinder
from tests.builders import RecordingClient, make_handle, make_pod

ALLOCATED = "scheduling.koordinator.sh/device-allocated"


def test_binds_with_annotations() -> None:
    client = RecordingClient()
    binder = DefaultBinder(make_handle(client=client))
    state = CycleState()
    state.bind_annotations[ALLOCATED] = '{"gpu":[]}'
    assert binder.bind(state, make_pod("p").build(), "n1") is None
    assert client.binds == [("default/p", "n1", {ALLOCATED: '{"gpu":[]}'})]


@pytest.mark.parametrize("gone", [pytest.param(True, id="gone"), pytest.param(False, id="retry")])
def test_bind_error_becomes_error_status(gone: bool) -> None:
    client = RecordingClient()
    client.fail_bind = BindError("conflict", gone=gone)
    status = DefaultBinder(make_handle(client=client)).bind(
        CycleState(), make_pod("p").build(), "n1"
    )
    assert status is not None
    assert status.code == Code.ERROR
    assert isinstance(status.error, BindError)
    assert status.error.gone is gone
    assert status.message == "conflict"


def test_other_exceptions_propagate_to_the_runtime() -> None:
    class Boom(RecordingClient):
        def bind(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("bug")

    with pytest.raises(RuntimeError, match="bug"):
        DefaultBinder(make_handle(client=Boom())).bind(CycleState(), make_pod("p").build(), "n")


def test_is_a_bind_plugin() -> None:
    binder = DefaultBinder(make_handle())
    assert isinstance(binder, BindPlugin)
    assert binder.name == "DefaultBinder"
