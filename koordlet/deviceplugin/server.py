"""ADAPTER: the ``aliyun.com/gpu-mem`` kubelet device plugin (deviceplugin/v1beta1 over gRPC).

Role: serve gpushare's device plugin (SPEC §10) from koordlet, so that gpushare pods keep
working when a cluster switches from gpushare to koord-py: the ``DevicePlugin`` service on its
own unix socket in the kubelet's device-plugins directory, registration with the kubelet on
``kubelet.sock``, ``ListAndWatch`` fed from the agent's cards and their health, ``Allocate``
answered by gpushare's protocol (``koordlet.deviceplugin.gpushare``) with the pod marked
``ALIYUN_COM_GPU_MEM_ASSIGNED=true``, and the node's ``aliyun.com/gpu-count`` capacity. With
``koordlet.deviceplugin.api`` it is the only koordlet code that imports grpc.

Invariants:

- ``start()`` serves before it registers (the kubelet dials the endpoint as soon as it
  accepts the registration); nothing is opened at construction or import.
- The kubelet removes every socket in its directory when it restarts: a watcher notices a new
  ``kubelet.sock`` (or our socket gone), serves again on a fresh socket and registers again;
  a failed registration is retried with backoff, never given up.
- Allocate calls are serialised (two pods must not be matched to the same allocation). The
  kubelet calls Allocate once per container: the plugin remembers which containers of a pod
  it served (in memory, per pod UID) and marks the pod assigned, with its resourceVersion as
  a precondition, when the last one is served; a conflict re-reads the pods once. Any failure
  is an error answer with one clear line, never some card (fail closed: the kubelet then fails
  the container).
- ``ListAndWatch`` sends the full device list at once and again whenever a card's health or
  the set of cards changes; streams end when the plugin stops.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, NoReturn, Protocol

import grpc
import structlog

from koordlet.deviceplugin.api import api_pb2, api_pb2_grpc
from koordlet.deviceplugin.gpushare import (
    ANNOTATION_IDX,
    RESOURCE_GPU_MEM,
    AllocateError,
    Card,
    FakeDevice,
    MemoryUnit,
    PendingPod,
    PodConflict,
    allocate_envs,
    assigned_annotations,
    choose_pod,
    fake_devices,
)

__all__ = [
    "API_VERSION",
    "DEFAULT_PLUGIN_DIR",
    "HEALTHY",
    "SOCKET_NAME",
    "UNHEALTHY",
    "DevicePluginServer",
    "GPUSharePlugin",
    "PodConflict",
    "PodSource",
]

API_VERSION: Final = "v1beta1"
DEFAULT_PLUGIN_DIR: Final = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET: Final = "kubelet.sock"
SOCKET_NAME: Final = "aliyungpushare.sock"
"""gpushare's own socket name, so a migration replaces its plugin in place."""
HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"
_WATCH_PERIOD_S: Final = 1.0
_STREAM_POLL_S: Final = 0.5
_REGISTER_TIMEOUT_S: Final = 5.0
_MAX_BACKOFF_S: Final = 30.0

log = structlog.get_logger("koordlet.deviceplugin")


class PodSource(Protocol):
    """The node's pods, from the API server (the kube adapter implements it)."""

    def pending_gpushare_pods(self, node_name: str) -> list[PendingPod]: ...

    def mark_assigned(self, pod: PendingPod, annotations: dict[str, str]) -> None:
        """Merge ``annotations`` into the pod if it is still at ``pod.resource_version``;
        raise ``PodConflict`` otherwise."""


def _abort(context: Any, message: str) -> NoReturn:
    context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)
    raise AssertionError("unreachable")  # pragma: no cover - abort raises


class GPUSharePlugin(api_pb2_grpc.DevicePluginServicer):
    """The DevicePlugin service; ``update_cards`` feeds it, the kubelet calls it."""

    def __init__(
        self,
        node_name: str,
        pods: PodSource,
        unit: MemoryUnit = MemoryUnit.GiB,
        clock_ns: Callable[[], int] = time.time_ns,
        on_allocate: Callable[[str], None] = lambda result: None,
    ) -> None:
        self.node_name = node_name
        self.pods = pods
        self.unit = unit
        self._clock_ns = clock_ns
        self._on_allocate = on_allocate
        self._cards: tuple[Card, ...] = ()
        self._devices: list[FakeDevice] = []
        self._version = 0
        self._changed = threading.Condition()
        self._stopped = False
        self._allocate_lock = threading.Lock()
        self._served: dict[str, Counter[int]] = {}
        """Units of the containers served so far, per pod UID still ASSIGNED=false."""

    # -- fed by the agent --------------------------------------------------------------------

    def update_cards(self, cards: Sequence[Card]) -> bool:
        """Take the node's cards; True (and a ListAndWatch update) when anything changed."""
        ordered = tuple(sorted(cards, key=lambda c: c.index))
        with self._changed:
            if ordered == self._cards and self._version:
                return False
            self._cards = ordered
            self._devices = fake_devices(ordered, self.unit)
            self._version += 1
            self._changed.notify_all()
        return True

    @property
    def cards(self) -> tuple[Card, ...]:
        with self._changed:
            return self._cards

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    def restart(self) -> None:
        with self._changed:
            self._stopped = False

    # -- the kubelet's calls -----------------------------------------------------------------

    def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions()

    def _response(self) -> api_pb2.ListAndWatchResponse:
        return api_pb2.ListAndWatchResponse(
            devices=[
                api_pb2.Device(
                    ID=d.id,
                    health=HEALTHY if d.healthy else UNHEALTHY,
                    topology=(
                        api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=d.numa_node)])
                        if d.numa_node is not None
                        else None
                    ),
                )
                for d in self._devices
            ]
        )

    def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        sent = -1
        while True:
            with self._changed:
                while not self._stopped and self._version == sent and context.is_active():
                    self._changed.wait(_STREAM_POLL_S)
                if self._stopped or not context.is_active():
                    return
                sent = self._version
                response = self._response()
            yield response

    def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        # Not advertised (GetDevicePluginOptions): answer the must-include IDs, then the first
        # available ones, as the kubelet would choose without a preference.
        answers = []
        for req in request.container_requests:
            ids = list(req.must_include_deviceIDs)
            ids += [i for i in req.available_deviceIDs if i not in ids]
            answers.append(
                api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids[: req.allocation_size])
            )
        return api_pb2.PreferredAllocationResponse(container_responses=answers)

    def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse:
        container_units = [len(c.devicesIDs) for c in request.container_requests]
        total = sum(container_units)
        with self._allocate_lock:
            try:
                pod, envs = self._match(container_units)
            except AllocateError as exc:
                self._on_allocate("error")
                log.warning("gpushare allocate refused", units=total, reason=str(exc))
                _abort(context, f"{RESOURCE_GPU_MEM}: {exc}")
        self._on_allocate("ok")
        log.info(
            "gpushare allocate", pod=pod.key, units=total, card=pod.annotations[ANNOTATION_IDX]
        )
        return api_pb2.AllocateResponse(
            container_responses=[api_pb2.ContainerAllocateResponse(envs=e) for e in envs]
        )

    def _match(self, container_units: list[int]) -> tuple[PendingPod, list[dict[str, str]]]:
        for attempt in (1, 2):
            try:
                pending = self.pods.pending_gpushare_pods(self.node_name)
            except Exception as exc:  # the API is down: refuse rather than guess
                raise AllocateError(f"cannot list the node's pods: {exc}") from None
            # forget pods that are no longer waiting (served, started, deleted)
            alive = {p.uid for p in pending}
            for uid in [u for u in self._served if u not in alive]:
                del self._served[uid]
            pod = choose_pod(pending, container_units, self.unit, self._served)
            envs = allocate_envs(pod, container_units, self.cards, self.unit)
            served = self._served.get(pod.uid, Counter()) + Counter(container_units)
            left = pod.slots - served
            if left:
                # more containers of this pod to come (one Allocate per container): the pod
                # stays ASSIGNED=false until its last one is served
                self._served[pod.uid] = served
                return pod, envs
            try:
                self.pods.mark_assigned(pod, assigned_annotations(self._clock_ns()))
            except PodConflict:
                if attempt == 2:
                    raise AllocateError(f"pod {pod.key} kept changing; try again") from None
                continue
            except Exception as exc:
                raise AllocateError(f"cannot mark pod {pod.key} assigned: {exc}") from None
            self._served.pop(pod.uid, None)
            return pod, envs
        raise AssertionError("unreachable")  # pragma: no cover

    def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


class DevicePluginServer:
    """Serve ``plugin`` on ``<plugin_dir>/<socket_name>`` and keep it registered with the
    kubelet; ``cards()`` is polled every second for health and inventory changes."""

    def __init__(
        self,
        plugin: GPUSharePlugin,
        cards: Callable[[], Sequence[Card]],
        plugin_dir: str | os.PathLike[str] = DEFAULT_PLUGIN_DIR,
        socket_name: str = SOCKET_NAME,
        on_cards: Callable[[Sequence[Card]], None] = lambda cards: None,
    ) -> None:
        self.plugin = plugin
        self._cards = cards
        self.dir = Path(plugin_dir)
        self.socket = self.dir / socket_name
        self.kubelet_socket = self.dir / KUBELET_SOCKET
        self._on_cards = on_cards
        self._server: grpc.Server | None = None
        self._kubelet_inode: int | None = None
        self._registered = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.registrations = 0

    @property
    def registered(self) -> bool:
        return self._registered

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._refresh_cards()
        self._serve()
        self._register()
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="gpushare-plugin", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._shutdown()

    def _serve(self) -> None:
        self._shutdown()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        self.plugin.restart()
        server = grpc.server(ThreadPoolExecutor(max_workers=8, thread_name_prefix="gpushare"))
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.plugin, server)
        if server.add_insecure_port(f"unix://{self.socket}") == 0:
            raise OSError(f"cannot listen on {self.socket}")
        server.start()
        self._server = server
        log.info("gpushare device plugin serving", socket=str(self.socket))

    def _shutdown(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            self.plugin.stop()
            server.stop(1.0).wait(2.0)
            with contextlib.suppress(FileNotFoundError):
                self.socket.unlink()

    def _register(self) -> bool:
        self._kubelet_inode = _inode(self.kubelet_socket)
        try:
            with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
                api_pb2_grpc.RegistrationStub(channel).Register(
                    api_pb2.RegisterRequest(
                        version=API_VERSION,
                        endpoint=self.socket.name,
                        resource_name=RESOURCE_GPU_MEM,
                        options=api_pb2.DevicePluginOptions(),
                    ),
                    timeout=_REGISTER_TIMEOUT_S,
                )
        except grpc.RpcError as exc:
            self._registered = False
            log.warning(
                "registration with the kubelet failed; retrying",
                kubelet=str(self.kubelet_socket),
                error=f"{exc.code().name}: {exc.details()}",
            )
            return False
        self._registered = True
        self.registrations += 1
        log.info("registered with the kubelet", resource=RESOURCE_GPU_MEM)
        return True

    def _refresh_cards(self) -> None:
        try:
            cards = list(self._cards())
        except Exception as exc:  # keep the last picture; the agent logs its own failures
            log.warning("reading the cards failed", error=repr(exc))
            return
        if self.plugin.update_cards(cards):
            self._on_cards(cards)

    def _watch(self) -> None:
        backoff = _WATCH_PERIOD_S
        next_try = 0.0
        while not self._stop.wait(_WATCH_PERIOD_S):
            self._refresh_cards()
            kubelet = _inode(self.kubelet_socket)
            restarted = kubelet is not None and kubelet != self._kubelet_inode
            if restarted or not self.socket.exists():
                log.info("the kubelet restarted: serving and registering again")
                try:
                    self._serve()
                except OSError as exc:
                    log.error("serving the device plugin failed", error=str(exc))
                    continue
                self._registered = False
                next_try = 0.0
            if not self._registered and time.monotonic() >= next_try:
                if self._register():
                    backoff = _WATCH_PERIOD_S
                else:
                    next_try = time.monotonic() + backoff
                    backoff = min(backoff * 2, _MAX_BACKOFF_S)
