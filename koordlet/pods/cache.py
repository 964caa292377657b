"""The runtime hook's view of the node's pods: uid -> ``PodRecord``, never a guess.

Role: ``PodCache``, filled by the sync loop's pod list, and on a miss asking the API server
once for the pod (``PodGetter``, a bounded call) rather than guessing.

Invariants:

- Identity is the uid: a lookup for uid U never answers another pod, even one of the same
  namespace/name (a pod re-created under its name); that is ``PodMissing``.
- ``lookup`` makes at most one API call and raises ``PodMissing`` (the API server says the pod
  does not exist, or it has another uid) or ``PodUnavailable`` (no answer in time, an error).
- A fetched pod stays cached until a pod list newer than the fetch no longer has it, so a
  list that was started before the pod was bound cannot drop it.
- Thread-safe: the sync thread updates, RPC threads look up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from koordlet.pods.record import PodRecord

__all__ = ["PodCache", "PodGetter", "PodMissing", "PodUnavailable"]


class PodMissing(LookupError):
    """The pod does not exist (or exists under another uid)."""


class PodUnavailable(Exception):
    """The pod could not be read in time."""


class PodGetter(Protocol):
    """One pod from the API server; implemented by ``koordlet.kube.KubeNodeAPI``."""

    def get_pod(self, namespace: str, name: str, timeout_s: float) -> PodRecord:
        """Raises ``PodMissing`` (404) or ``PodUnavailable`` (any other failure, a timeout)."""
        ...


class PodCache:
    """uid -> ``PodRecord``; see the module docstring."""

    def __init__(
        self,
        getter: PodGetter | None,
        *,
        fetch_timeout_s: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._getter = getter
        self._fetch_timeout_s = fetch_timeout_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._pods: dict[str, PodRecord] = {}
        self._fetched: dict[str, float] = {}  # uid -> when it was fetched
        self.fetches = 0

    def replace(self, records: Iterable[PodRecord], listed_at: float) -> None:
        """The node's pods as listed (the list started at ``listed_at``, monotonic)."""
        fresh = {r.uid: r for r in records if r.uid}
        with self._lock:
            for uid, at in list(self._fetched.items()):
                if uid in fresh or at < listed_at:
                    del self._fetched[uid]
                else:
                    fresh[uid] = self._pods[uid]
            self._pods = fresh

    def now(self) -> float:
        return self._monotonic()

    def _cached(self, uid: str, namespace: str, name: str) -> PodRecord | None:
        with self._lock:
            if uid:
                return self._pods.get(uid)
            for pod in self._pods.values():
                if pod.namespace == namespace and pod.name == name:
                    return pod
        return None

    def lookup(self, uid: str, namespace: str, name: str) -> PodRecord:
        """The pod ``uid`` (by namespace/name when the uid is empty); raises ``PodMissing``,
        ``PodUnavailable``."""
        cached = self._cached(uid, namespace, name)
        if cached is not None:
            return cached
        if self._getter is None:
            raise PodUnavailable(f"pod {namespace}/{name} ({uid}) is not cached")
        self.fetches += 1
        pod = self._getter.get_pod(namespace, name, self._fetch_timeout_s)
        if uid and pod.uid != uid:
            raise PodMissing(f"pod {namespace}/{name} is now uid {pod.uid}, not {uid}")
        with self._lock:
            self._pods[pod.uid] = pod
            self._fetched[pod.uid] = self._monotonic()
        return pod
