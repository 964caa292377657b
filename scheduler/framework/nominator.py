"""``Nominator``: pods that a preemption made room for, by the node it made room on.

Role: kube-scheduler's ``PodNominator``. After a successful preemption the preemptor is
*nominated* to the node whose victims are leaving; until it binds (anywhere) or is deleted,
its requests — devices included — count on that node when pods of equal or lower priority are
filtered there (``Framework.run_filter_with_nominated_pods``), so the freed shares are not
taken by someone else. A pod whose ``status.nominatedNodeName`` is already set when the
scheduler learns of it (a restart, another replica's preemption) is nominated from that field.

Invariants: touched only on the scheduling thread; a pod is nominated to at most one node;
the record kept is the newest seen for that UID (its requests may change).
"""

from __future__ import annotations

from apis.core import Pod

__all__ = ["Nominator"]


class Nominator:
    def __init__(self) -> None:
        self._node_of: dict[str, str] = {}
        self._on_node: dict[str, dict[str, Pod]] = {}

    def __bool__(self) -> bool:
        return bool(self._node_of)

    def __len__(self) -> int:
        return len(self._node_of)

    def add(self, pod: Pod, node_name: str) -> None:
        """Nominate ``pod`` to ``node_name`` (replacing any earlier nomination of its UID)."""
        self.remove(pod.uid)
        if not node_name:
            return
        self._node_of[pod.uid] = node_name
        self._on_node.setdefault(node_name, {})[pod.uid] = pod

    def update(self, old: Pod | None, new: Pod) -> None:
        """A newer record of an unassigned pod (kube's ``UpdateNominatedPod``): the node its
        status names; when neither record names one, the nomination made in memory stays (the
        update may predate our status write)."""
        node = new.nominated_node_name
        if not node and (old is None or not old.nominated_node_name):
            node = self._node_of.get(new.uid, "")
        self.add(new, node)

    def remove(self, uid: str) -> None:
        node = self._node_of.pop(uid, None)
        if node is None:
            return
        pods = self._on_node.get(node)
        if pods is not None:
            pods.pop(uid, None)
            if not pods:
                del self._on_node[node]

    def node_of(self, uid: str) -> str:
        return self._node_of.get(uid, "")

    def nominated_pods(self, node_name: str) -> list[Pod]:
        return list(self._on_node.get(node_name, {}).values())

    def nodes_for(self, pod: Pod) -> set[str]:
        """Nodes holding a nomination that ``pod`` must respect: another pod's, of equal or
        higher priority."""
        out: set[str] = set()
        for node, pods in self._on_node.items():
            for uid, other in pods.items():
                if uid != pod.uid and other.priority >= pod.priority:
                    out.add(node)
                    break
        return out
