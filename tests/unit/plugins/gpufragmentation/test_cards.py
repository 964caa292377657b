"""CardTable: cards from Device CRs, holdings from annotations, kept incrementally."""

from __future__ import annotations

from typing import Any

import pytest

from apis.core import decode_node, decode_pod
from apis.device import Device
from scheduler.framework.events import Change
from scheduler.plugins.gpufragmentation.cards import CardTable
from scheduler.simulator.trace import TraceNode, device_object, node_object


def _alloc(*cards: tuple[int, int]) -> str:
    items = ",".join(
        f'{{"minor":{m},"resources":{{"koordinator.sh/gpu-core":"{c}",'
        f'"koordinator.sh/gpu-memory-ratio":"{c}"}}}}'
        for m, c in cards
    )
    return f'{{"gpu":[{items}]}}'


def _pod(uid: str, node: str, annotation: str | None, phase: str = "Running") -> Any:
    meta: dict[str, Any] = {"name": uid, "uid": uid}
    if annotation is not None:
        meta["annotations"] = {"scheduling.koordinator.sh/device-allocated": annotation}
    return decode_pod(
        {"metadata": meta, "spec": {"nodeName": node, "containers": []}, "status": {"phase": phase}}
    )


def _table(gpus: int = 4, model: str = "T4") -> CardTable:
    table = CardTable(rows=1, cards=2)  # small, so that growing is exercised
    node = TraceNode("n0", 8000, 1024, gpus, model)
    table.apply_change(Change("Node", None, decode_node(node_object(node))))
    device = device_object(node)
    assert device is not None
    table.apply_change(Change("Device", None, Device.from_dict(device)))
    return table


def _free(table: CardTable) -> list[int]:
    row = table.row_of("n0")
    assert row is not None
    return [int(v) for v in table.free[row, :4]]


def test_cards_and_model_from_node_and_device() -> None:
    table = _table()
    row = table.row_of("n0")
    assert row is not None
    assert _free(table) == [1000] * 4
    assert table.model(row) == "T4" and table.n_cards[row] == 4


@pytest.mark.parametrize(
    ("events", "free"),
    [
        pytest.param([(None, ("a", _alloc((0, 50))))], [500, 1000, 1000, 1000], id="bind"),
        pytest.param(
            [(None, ("a", _alloc((0, 50)))), (("a", _alloc((0, 50))), ("a", _alloc((0, 50))))],
            [500, 1000, 1000, 1000],
            id="same-annotation-again",
        ),
        pytest.param(
            [(None, ("a", _alloc((0, 50)))), (("a", _alloc((0, 50))), None)],
            [1000] * 4,
            id="delete",
        ),
        pytest.param(
            [(None, ("a", _alloc((2, 100), (3, 100))))], [1000, 1000, 0, 0], id="two-cards"
        ),
        pytest.param([(None, ("a", "{not json"))], [1000] * 4, id="malformed"),
        pytest.param([(None, ("a", None))], [1000] * 4, id="no-devices"),
    ],
)
def test_pod_events(events: list[tuple[Any, Any]], free: list[int]) -> None:
    table = _table()
    for old, new in events:
        table.apply_change(
            Change(
                "Pod",
                _pod(old[0], "n0", old[1]) if old else None,
                _pod(new[0], "n0", new[1]) if new else None,
            )
        )
    assert _free(table) == free


def test_terminal_pod_releases() -> None:
    table = _table()
    bound = _pod("a", "n0", _alloc((1, 30)))
    table.apply_change(Change("Pod", None, bound))
    table.apply_change(Change("Pod", bound, _pod("a", "n0", _alloc((1, 30)), "Succeeded")))
    assert _free(table) == [1000] * 4


def test_reservation_survives_its_own_bind_and_unreserve_after() -> None:
    table = _table()
    table.hold("a", "n0", _alloc((1, 30)), reserved=True)
    table.apply_change(Change("Pod", None, _pod("a", "n0", _alloc((1, 30)))))
    table.release_reservation("a")  # the pod is bound now: nothing to undo
    assert _free(table) == [1000, 700, 1000, 1000]


def test_versions_change_with_the_row() -> None:
    table = _table()
    row = table.row_of("n0")
    assert row is not None
    before = int(table.version[row])
    table.hold("a", "n0", _alloc((0, 10)))
    assert int(table.version[row]) > before


def test_device_delete_keeps_holders() -> None:
    table = _table()
    table.hold("a", "n0", _alloc((0, 10)))
    device = device_object(TraceNode("n0", 1, 1, 4, "T4"))
    assert device is not None
    table.apply_change(Change("Device", Device.from_dict(device), None))
    assert _free(table) == [0, 0, 0, 0]
    assert table.holding("a") == ("n0", ((0, 10, 10),))
