"""Node-side GPU admission: a pod's cards must fit beside the pods the node already admitted.

Role: the kubelet refuses a pod that does not fit in CPU or memory (``OutOfcpu``); nothing
refused a pod whose GPU shares do not fit, and other binders than koord-scheduler share the
node (a default scheduler, a gpushare extender, a replica that lost its lease mid-write).
``GPUAdmission`` is the agent's ledger of admitted pods; the runtime hook asks it
(``decide``) before a container of a pod is handed any card, and every pod list of the sync
loop updates it (``observe``). ``PodFailer`` writes a refused pod's status (phase ``Failed``,
reason ``GPUOvercommit``) off the RPC's thread, as kubelet admission does.

Invariants:

- What an annotation holds is the one rule of the scheduler (``apis.allocation``
  ``read_allocations`` + ``held_amounts``): valid entries their amounts, an invalid entry its
  card whole, an annotation that does not decode every card of the node whole.
- A pod fits when, on every card it holds, for each of ``gpu-core``, ``gpu-memory-ratio`` and
  ``gpu-memory`` it asks a positive amount of, the admitted pods' sum plus its own stays within
  the card's capacity (100, 100, the card's memory). A card the node does not have has no
  capacity. Only GPUs are checked.
- Decisions are sticky: an admitted pod stays admitted, a refused pod stays refused (and is
  reported once, through ``on_refused``), until a pod list started after the decision no
  longer has the pod (deleted, or ``Succeeded``/``Failed``: the lists leave those out).
- First admitted wins: decisions are taken one at a time under the ledger's lock, in the order
  the runtime asks; a decided pod is never re-judged.
- Admitted pods are also *learned* from the pod lists: a pod whose containers were created
  (phase ``Running``, or a container status running or terminated) and that is not decided
  yet — pods running when the agent started, pods started while the hook was not called. They
  are learned in creation order (then uid) and admitted even when they over-commit (their
  containers already see the cards; that is logged and kept in ``overcommitted``).
- Until the first pod list the node's running pods are unknown: ``decide`` waits at most
  ``ready_wait_s`` for it, then answers ``NOT_READY`` (not a refusal: the pod is not failed).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final, Protocol

import structlog

from apis.allocation import AllocationReading, held_amounts, read_allocations
from apis.resources import DEVICE_GPU, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO
from koordlet.devices.library import GPU
from koordlet.events import stop_worker
from koordlet.pods.record import PodRecord

__all__ = [
    "ADMITTED",
    "NOT_READY",
    "OVERCOMMIT",
    "POD_REASON",
    "Card",
    "GPUAdmission",
    "PodFailer",
    "PodStatusAPI",
    "Refusal",
    "Verdict",
    "gpu_cards",
]

log = structlog.get_logger("koordlet.admission")

ADMITTED: Final = "admitted"
OVERCOMMIT: Final = "gpu-overcommit"
NOT_READY: Final = "admission-not-ready"
POD_REASON: Final = "GPUOvercommit"
"""The refused pod's ``status.reason`` and its event's reason (kubelet's ``OutOfcpu``)."""

_DIMENSIONS: Final = (GPU_CORE, GPU_MEMORY_RATIO, GPU_MEMORY)
_FULL: Final = 100

Card = tuple[str, int, Mapping[str, int]]
"""(device type, minor, capacity) as ``held_amounts`` reads the node's devices."""


def gpu_cards(gpus: Iterable[GPU]) -> list[Card]:
    """The node's cards with the capacity the agent publishes on the Device CR."""
    full = {GPU_CORE: _FULL, GPU_MEMORY_RATIO: _FULL}
    return [(DEVICE_GPU, g.minor, {**full, GPU_MEMORY: g.memory_total}) for g in gpus]


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: str
    """``ADMITTED``, ``OVERCOMMIT`` or ``NOT_READY``."""
    message: str = ""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A pod refused at the node (reported once)."""

    uid: str
    namespace: str
    name: str
    message: str


@dataclass(frozen=True, slots=True)
class _Entry:
    namespace: str
    name: str
    reading: AllocationReading
    since: float  # monotonic: when it was decided or learned
    refusal: str = ""  # why it was refused ("" for an admitted pod)


class GPUAdmission:
    """The ledger of the pods admitted to the node's GPUs; see the module docstring."""

    def __init__(
        self,
        cards: Callable[[], Sequence[Card]],
        *,
        on_refused: Callable[[Refusal], None] | None = None,
        ready_wait_s: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cards = cards
        self._on_refused = on_refused
        self._ready_wait_s = ready_wait_s
        self._monotonic = monotonic
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._admitted: dict[str, _Entry] = {}
        self._refused: dict[str, _Entry] = {}
        self._overcommitted: list[str] = []

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def admitted(self) -> set[str]:
        with self._lock:
            return set(self._admitted)

    def overcommitted(self) -> list[str]:
        """Learned running pods that did not fit beside those learned before them."""
        with self._lock:
            return [uid for uid in self._overcommitted if uid in self._admitted]

    def decide(self, uid: str, namespace: str, name: str, allocation: str) -> Verdict:
        """May the pod's containers see the cards of ``allocation`` (its annotation text)?"""
        if not self._ready.wait(self._ready_wait_s):
            return Verdict(NOT_READY, "the agent has not listed the node's pods yet")
        with self._lock:
            if uid in self._admitted:
                return Verdict(ADMITTED)
            if uid in self._refused:
                return Verdict(OVERCOMMIT, self._refused[uid].refusal)
            entry = _Entry(namespace, name, read_allocations(allocation), self._monotonic())
            problem = self._misfit(entry.reading, list(self._cards()))
            if problem is None:
                self._admitted[uid] = entry
                return Verdict(ADMITTED)
            self._refused[uid] = replace(entry, refusal=problem)
        log.warning(
            "pod refused at the node: its GPUs would be over-committed",
            pod=f"{namespace}/{name}",
            uid=uid,
            reason=problem,
        )
        if self._on_refused is not None:
            try:
                self._on_refused(Refusal(uid, namespace, name, problem))
            except Exception as exc:
                log.error("reporting a refused pod failed", error=repr(exc))
        return Verdict(OVERCOMMIT, problem)

    def observe(self, pods: Iterable[PodRecord], listed_at: float) -> None:
        """A pod list of the node (started at ``listed_at``, monotonic; terminal pods left
        out): forget decided pods it no longer has, learn pods whose containers started."""
        pods = list(pods)
        present = {p.uid for p in pods}
        with self._lock:
            for table in (self._admitted, self._refused):
                for uid in [u for u in table if u not in present]:
                    if table[uid].since < listed_at:
                        del table[uid]
            learn = sorted(
                (
                    p
                    for p in pods
                    if p.started
                    and p.allocation is not None
                    and p.uid not in self._admitted
                    and p.uid not in self._refused
                ),
                key=lambda p: (p.created, p.uid),
            )
            cards = list(self._cards()) if learn else []
            for p in learn:
                assert p.allocation is not None
                entry = _Entry(p.namespace, p.name, read_allocations(p.allocation), listed_at)
                problem = self._misfit(entry.reading, cards)
                self._admitted[p.uid] = entry
                if problem is not None:
                    self._overcommitted.append(p.uid)
                    log.warning(
                        "running pod over-commits a GPU: admitted, its containers see the card",
                        pod=f"{p.namespace}/{p.name}",
                        uid=p.uid,
                        reason=problem,
                    )
            self._overcommitted = [u for u in self._overcommitted if u in self._admitted]
        self._ready.set()

    def _misfit(self, reading: AllocationReading, cards: Sequence[Card]) -> str | None:
        """Why ``reading`` does not fit beside the admitted pods (None: it fits)."""
        capacity = {minor: cap for kind, minor, cap in cards if kind == DEVICE_GPU}
        used: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(_DIMENSIONS, 0))
        holders: dict[int, list[str]] = defaultdict(list)
        for entry in self._admitted.values():
            for kind, minor, amounts in held_amounts(entry.reading, cards):
                if kind != DEVICE_GPU:
                    continue
                for dim in _DIMENSIONS:
                    used[minor][dim] += amounts.get(dim, 0)
                holders[minor].append(f"{entry.namespace}/{entry.name}")
        for kind, minor, amounts in held_amounts(reading, cards):
            if kind != DEVICE_GPU:
                continue
            if minor not in capacity:
                return f"GPU {minor} is not a card of this node"
            for dim in _DIMENSIONS:
                need = amounts.get(dim, 0)
                have = used[minor][dim]
                if need > 0 and have + need > capacity[minor].get(dim, 0):
                    names = ", ".join(sorted(holders[minor])) or "none"
                    return (
                        f"GPU {minor} would be over-committed: {dim} {need} requested, "
                        f"{have} held by admitted pods ({names}), "
                        f"{capacity[minor].get(dim, 0)} on the card"
                    )
        return None


class PodStatusAPI(Protocol):
    def fail_pod(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        """Set the pod's phase ``Failed`` with ``reason`` and ``message``; raises on failure."""
        ...


class PodFailer:
    """Writes refused pods' status on its own thread: ``fail`` never blocks nor raises (a full
    queue drops the write, logged); a failed write is retried ``attempts`` times in all."""

    def __init__(
        self,
        api: PodStatusAPI,
        *,
        capacity: int = 256,
        attempts: int = 3,
        backoff_s: float = 1.0,
    ) -> None:
        self._api = api
        self._queue: queue.Queue[tuple[str, str, str, str, str] | None] = queue.Queue(capacity)
        self._attempts = attempts
        self._backoff_s = backoff_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.written = 0
        self.dropped = 0

    def fail(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        try:
            self._queue.put_nowait((namespace, name, uid, reason, message))
        except queue.Full:
            self.dropped += 1
            log.error("failing a refused pod dropped: queue full", pod=f"{namespace}/{name}")

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("PodFailer already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="koordlet-pod-failer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        stop_worker(self._queue, thread)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            namespace, name, uid, reason, message = item
            for attempt in range(1, self._attempts + 1):
                try:
                    self._api.fail_pod(namespace, name, uid, reason, message)
                    self.written += 1
                    log.info("refused pod failed", pod=f"{namespace}/{name}", reason=reason)
                    break
                except Exception as exc:
                    log.warning(
                        "failing a refused pod failed",
                        pod=f"{namespace}/{name}",
                        attempt=attempt,
                        error=str(exc),
                    )
                    if self._stop.wait(self._backoff_s * attempt):
                        return
