"""``CycleState``: the scratchpad one pod's scheduling attempt shares between its plugins.

PreFilter computes what a pod needs once and writes it here under the plugin's own key; Filter,
Score, Reserve and PreBind only read it. ``bind_annotations`` collects the annotations that ride
on the Binding (the device allocation), so that allocation and binding are one API write.

Invariants: one CycleState per attempt; ``clone()`` is shallow except for values that define
``clone()`` themselves (so AddPod/RemovePod on a copy never touch the original); ``skip_*``
sets hold the plugins that returned Skip at PreFilter/PreScore and are not run after.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class StateData(Protocol):
    def clone(self) -> StateData: ...


class CycleState:
    __slots__ = ("_data", "bind_annotations", "record_metrics", "skip_filter", "skip_score")

    def __init__(self) -> None:
        self._data: dict[str, Any] = {}
        self.bind_annotations: dict[str, str] = {}
        self.skip_filter: set[str] = set()
        self.skip_score: set[str] = set()
        self.record_metrics = False

    def read(self, key: str) -> Any:
        """The value stored under ``key``; KeyError names the key when it is absent."""
        try:
            return self._data[key]
        except KeyError:
            raise KeyError(f"{key!r} not found in cycle state") from None

    def get(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def write(self, key: str, value: Any) -> None:
        self._data[key] = value

    def delete(self, key: str) -> None:
        self._data.pop(key, None)

    def clone(self) -> CycleState:
        other = CycleState()
        other._data = {
            k: (v.clone() if isinstance(v, StateData) else v) for k, v in self._data.items()
        }
        other.bind_annotations = dict(self.bind_annotations)
        other.skip_filter = set(self.skip_filter)
        other.skip_score = set(self.skip_score)
        other.record_metrics = self.record_metrics
        return other
