"""PrioritySort: higher priority first, then the earlier queue timestamp (kube's Less)."""

from __future__ import annotations

import pytest

from scheduler.framework.interfaces import QueuedPodInfo, QueueSortPlugin
from scheduler.plugins.prioritysort import PrioritySort
from tests.builders import make_pod


def _info(priority: int, timestamp: float) -> QueuedPodInfo:
    return QueuedPodInfo(
        pod=make_pod(f"p{priority}-{timestamp}").priority(priority).build(), timestamp=timestamp
    )


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        pytest.param((100, 2.0), (50, 1.0), True, id="higher-priority-first"),
        pytest.param((50, 1.0), (100, 2.0), False, id="lower-priority-later"),
        pytest.param((10, 1.0), (10, 2.0), True, id="same-priority-earlier-first"),
        pytest.param((10, 2.0), (10, 1.0), False, id="same-priority-later-second"),
        pytest.param((10, 1.0), (10, 1.0), False, id="equal-is-not-less"),
        pytest.param((-5, 0.0), (0, 9.0), False, id="negative-priority"),
    ],
)
def test_less(a: tuple[int, float], b: tuple[int, float], want: bool) -> None:
    assert PrioritySort().less(_info(*a), _info(*b)) is want


def test_sorts_a_queue_like_kube() -> None:
    infos = [_info(0, 3.0), _info(10, 5.0), _info(10, 4.0), _info(-1, 0.0), _info(0, 1.0)]
    plugin = PrioritySort()
    ordered = sorted(infos, key=lambda x: (-x.pod.priority, x.timestamp))
    for i, first in enumerate(ordered):
        for second in ordered[i + 1 :]:
            assert plugin.less(first, second)
            assert not plugin.less(second, first)


def test_is_a_queue_sort_plugin() -> None:
    plugin = PrioritySort()
    assert isinstance(plugin, QueueSortPlugin)
    assert plugin.name == "PrioritySort"
