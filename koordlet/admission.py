"""Node-side device admission: a pod's devices must fit beside the pods the node already admitted.

Role: the kubelet refuses a pod that does not fit in CPU or memory (``OutOfcpu``); nothing
refused a pod whose GPU shares or RDMA VFs are already taken, and other binders than
koord-scheduler share the node (a default scheduler, a gpushare extender, a replica that lost
its lease mid-write). ``NodeAdmission`` is the agent's ledger of admitted pods over every
device type the node serves; the runtime hooks ask it (``decide``) before a container of a pod
is handed any card or VF, and every pod list of the sync loop updates it (``observe``).
``PodFailer`` writes a refused pod's status (phase ``Failed``, reason ``DeviceOvercommit``) off
the RPC's thread, as kubelet admission does.

Invariants:

- What an annotation holds is the one rule of the scheduler (``apis.allocation``
  ``read_allocations`` + ``held_amounts``): valid entries their amounts and the VFs they name,
  an invalid entry its device whole, an annotation that does not decode every device of the
  node whole.
- Only the device types the node serves (``device_types``: the ones its hooks hand out) are
  checked; entries of other types hold nothing here.
- A pod fits when (a) on every device it holds, for each of its type's resources
  (``ALLOCATED_RESOURCES``, the scheduler's ledger rows: ``gpu-core``, ``gpu-memory-ratio``,
  ``gpu-memory``; ``rdma``; ``fpga``) it asks a positive amount of, the admitted pods' sum plus
  its own stays within the device's capacity (100 per percent, the card's memory); and (b)
  every VF it names is a VF of the named NIC on this node that no admitted pod names (a VF is
  one device: never two holders, as the scheduler's ``vfs_taken``). A NIC entry without VFs
  (the PF itself) takes its ``rdma`` amount only; a whole-NIC holder (100) leaves no room for
  a VF holder (each takes at least 1), and the other way round. A device the node does not
  have has no capacity.
- Decisions are sticky: an admitted pod stays admitted, a refused pod stays refused (and is
  reported once, through ``on_refused``), until a pod list started after the decision no
  longer has the pod (deleted, or ``Succeeded``/``Failed``: the lists leave those out).
- First admitted wins: decisions are taken one at a time under the ledger's lock, in the order
  the runtime asks; a decided pod is never re-judged.
- Admitted pods are also *learned* from the pod lists: a pod whose containers were created
  (phase ``Running``, or a container status running or terminated) and that is not decided
  yet — pods running when the agent started, pods started while the hook was not called. They
  are learned in creation order (then uid) and admitted even when they over-commit (their
  containers already see the devices; that is logged and kept in ``overcommitted``).
- Until the first pod list the node's running pods are unknown: ``decide`` waits at most
  ``ready_wait_s`` for it, then answers ``NOT_READY`` (not a refusal: the pod is not failed).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final, Protocol

import structlog

from apis.allocation import ALLOCATED_RESOURCES, AllocationReading, held_amounts, read_allocations
from apis.resources import (
    DEVICE_FPGA,
    DEVICE_GPU,
    DEVICE_RDMA,
    GPU_CORE,
    GPU_MEMORY,
    GPU_MEMORY_RATIO,
    RDMA,
)
from koordlet.devices.library import GPU
from koordlet.devices.rdma import NIC
from koordlet.events import stop_worker
from koordlet.pods.record import PodRecord

__all__ = [
    "ADMITTED",
    "NOT_READY",
    "OVERCOMMIT",
    "POD_REASON",
    "NodeAdmission",
    "NodeDevice",
    "PodFailer",
    "PodStatusAPI",
    "Refusal",
    "Verdict",
    "gpu_devices",
    "nic_devices",
]

log = structlog.get_logger("koordlet.admission")

ADMITTED: Final = "admitted"
OVERCOMMIT: Final = "device-overcommit"
NOT_READY: Final = "admission-not-ready"
POD_REASON: Final = "DeviceOvercommit"
"""The refused pod's ``status.reason`` and its event's reason (kubelet's ``OutOfcpu``)."""

_FULL: Final = 100
_NAMES: Final = {DEVICE_GPU: "GPU", DEVICE_RDMA: "RDMA NIC", DEVICE_FPGA: "FPGA"}


@dataclass(frozen=True, slots=True)
class NodeDevice:
    """A device the node serves, with the capacity the agent publishes on the Device CR."""

    device_type: str
    minor: int
    capacity: Mapping[str, int]
    vfs: frozenset[str] = frozenset()
    """The bus ids of its SR-IOV virtual functions (an RDMA NIC's)."""


def gpu_devices(gpus: Iterable[GPU]) -> list[NodeDevice]:
    """The node's cards: 100 % of core and memory ratio, their memory."""
    full = {GPU_CORE: _FULL, GPU_MEMORY_RATIO: _FULL}
    return [NodeDevice(DEVICE_GPU, g.minor, {**full, GPU_MEMORY: g.memory_total}) for g in gpus]


def nic_devices(nics: Iterable[NIC]) -> list[NodeDevice]:
    """The node's RDMA NICs: 100 % ``rdma`` each (``rdma_device_info``), and their VFs."""
    return [NodeDevice(DEVICE_RDMA, n.minor, {RDMA: _FULL}, frozenset(n.vfs)) for n in nics]


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


class NodeAdmission:
    """The ledger of the pods admitted to the node's devices; see the module docstring."""

    def __init__(
        self,
        devices: Callable[[], Sequence[NodeDevice]],
        *,
        device_types: Collection[str] = (DEVICE_GPU,),
        on_refused: Callable[[Refusal], None] | None = None,
        ready_wait_s: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        unknown = set(device_types) - set(ALLOCATED_RESOURCES)
        if unknown:
            raise ValueError(f"no admission rule for device types {sorted(unknown)}")
        self._devices = devices
        self._types = frozenset(device_types)
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
            return list(self._overcommitted)

    def decide(self, uid: str, namespace: str, name: str, allocation: str) -> Verdict:
        """May the pod's containers see the devices of ``allocation`` (its annotation text)?"""
        if not self._ready.wait(self._ready_wait_s):
            return Verdict(NOT_READY, "the agent has not listed the node's pods yet")
        with self._lock:
            if uid in self._admitted:
                return Verdict(ADMITTED)
            if uid in self._refused:
                return Verdict(OVERCOMMIT, self._refused[uid].refusal)
            entry = _Entry(namespace, name, read_allocations(allocation), self._monotonic())
            problem = self._misfit(entry.reading, list(self._devices()))
            if problem is None:
                self._admitted[uid] = entry
                return Verdict(ADMITTED)
            self._refused[uid] = replace(entry, refusal=problem)
        log.warning(
            "pod refused at the node: its devices would be over-committed",
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
            devices = list(self._devices()) if learn else []
            for p in learn:
                assert p.allocation is not None
                entry = _Entry(p.namespace, p.name, read_allocations(p.allocation), listed_at)
                problem = self._misfit(entry.reading, devices)
                self._admitted[p.uid] = entry
                if problem is not None:
                    self._overcommitted.append(p.uid)
                    log.warning(
                        "running pod over-commits a device: admitted, its containers see it",
                        pod=f"{p.namespace}/{p.name}",
                        uid=p.uid,
                        reason=problem,
                    )
            self._overcommitted = [u for u in self._overcommitted if u in self._admitted]
        self._ready.set()

    def _held(
        self, reading: AllocationReading, cards: Sequence[tuple[str, int, Mapping[str, int]]]
    ) -> list[tuple[str, int, dict[str, int]]]:
        """What ``reading`` holds of the served device types (the one counting rule)."""
        return [h for h in held_amounts(reading, cards) if h[0] in self._types]

    def _misfit(self, reading: AllocationReading, devices: Sequence[NodeDevice]) -> str | None:
        """Why ``reading`` does not fit beside the admitted pods (None: it fits)."""
        cards = [(d.device_type, d.minor, d.capacity) for d in devices]
        by_key = {(d.device_type, d.minor): d for d in devices}
        used: dict[tuple[str, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
        holders: dict[tuple[str, int], list[str]] = defaultdict(list)
        vf_holders: dict[str, str] = {}
        for entry in self._admitted.values():
            pod = f"{entry.namespace}/{entry.name}"
            for kind, minor, amounts in self._held(entry.reading, cards):
                for dim in ALLOCATED_RESOURCES[kind]:
                    used[(kind, minor)][dim] += amounts.get(dim, 0)
                holders[(kind, minor)].append(pod)
            for _, _, named in entry.reading.vfs:
                for _, bus_id in named:
                    vf_holders.setdefault(bus_id, pod)
        for kind, minor, amounts in self._held(reading, cards):
            device = by_key.get((kind, minor))
            if device is None:
                return f"{_NAMES[kind]} {minor} is not a device of this node"
            for dim in ALLOCATED_RESOURCES[kind]:
                need = amounts.get(dim, 0)
                have = used[(kind, minor)][dim]
                if need > 0 and have + need > device.capacity.get(dim, 0):
                    names = ", ".join(sorted(holders[(kind, minor)])) or "none"
                    return (
                        f"{_NAMES[kind]} {minor} would be over-committed: {dim} {need} "
                        f"requested, {have} held by admitted pods ({names}), "
                        f"{device.capacity.get(dim, 0)} on the device"
                    )
        for kind, minor, named in reading.vfs:
            if kind not in self._types:
                continue
            for _, bus_id in named:
                if bus_id not in by_key[(kind, minor)].vfs:
                    return f"{bus_id!r} is not a VF of {_NAMES[kind]} {minor} on this node"
                if bus_id in vf_holders:
                    return (
                        f"VF {bus_id} of {_NAMES[kind]} {minor} is held by an admitted pod "
                        f"({vf_holders[bus_id]})"
                    )
        return None


class PodStatusAPI(Protocol):
    def fail_pod(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        """Set the pod's phase ``Failed`` with ``reason`` and ``message``; raises on failure."""
        ...


class PodFailer:
    """Writes refused pods' status on its own thread: ``fail`` never blocks nor raises (a full
    queue drops the write, logged); a failed write is tried ``attempts`` times in all, waiting
    ``backoff_s`` times the attempt's number between tries (none after the last); ``stop``
    ends a wait at once."""

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
        self._drop_stop_markers()
        self._thread = threading.Thread(target=self._run, name="koordlet-pod-failer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        stop_worker(self._queue, thread)

    def _drop_stop_markers(self) -> None:
        """A worker stopped in a backoff left its stop marker queued (it never read it): take
        it out so that a restarted worker does not end at once; the pods queued stay."""
        kept = []
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._queue.get_nowait()
                if item is not None:
                    kept.append(item)
        for namespace, name, uid, reason, message in kept:
            self.fail(namespace, name, uid, reason, message)

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
                    if attempt < self._attempts and self._stop.wait(self._backoff_s * attempt):
                        return
