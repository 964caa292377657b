"""Composition-root glue: the runtime-hook server (``runtimehooks``) as a service of the agent.

Role: build the default hook registry (the GPU hook at PreCreateContainer, and the Gemini
fair-share hook when the agent runs a fair-share server, timed into the agent's metrics
through ``observe``), serve it on the unix socket and register it with
koord-runtime-proxy through ``<hook dir>/koordlet.json``. Only ``koordlet.cli`` uses this
module; ``runtimehooks`` is imported when the service is built, so that ``koordlet report``
never loads grpc and an agent whose grpc is broken still runs (without hooks, logged).

Invariants: ``start()`` serves first, then writes the registration file; ``stop()`` stops
the server, which removes its socket. An empty socket path disables the hook server.

The registration's failure policy is ``Fail`` by default: while the agent is down (stopped,
crashed, restarting) koord-runtime-proxy refuses every container it would have sent here, so
no container starts with its image's ``NVIDIA_VISIBLE_DEVICES=all``; the kubelet retries the
creation with back-off and it succeeds once the agent is back.  So ``stop()`` keeps a ``Fail``
registration (removing it would let the proxy start containers unchanged); pods labelled
``runtimeproxy.koordinator.sh/skip-hookserver: "true"`` (the agent's own DaemonSet, other
node-critical pods) are never sent to a hook server and always start.  Under an operator's
``Ignore`` the registration goes with ``stop()``, as before (an unreachable server then means
"unchanged" anyway).

With ``pods`` (the agent's ``PodCache``) the GPU hook works per container and fails closed;
this module adapts the agent to the hooks' ports (``runtimehooks.ports``): the cache's
records become ``PodSpec``s, ``PodMissing``/``PodUnavailable`` become ``PodLookupError``s,
denials go to ``on_denied``, device-plugin ids to ``on_kubelet_devices``, and with
``admission`` (the agent's ``NodeAdmission``) the GPU and RDMA hooks admit a pod at the node
before its containers see its cards or RDMA devices; ``kubelet_gpus`` (the agent's
``KubeletGrants``) says which GPUs the kubelet's device plugins gave a container (without it,
no container outside our allocations sees a GPU).

With ``sysfs_root`` the RDMA hook runs; with ``cdi_dir`` too, it delivers the devices through
CDI spec files there (``runtimehooks.cdi``), removed at PostStopPodSandbox and, through
``pods_listed`` (the agent's pod lists), once the pod is gone from the node.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import structlog

from apis.fairshare import DefaultLimit
from koordlet.admission import ADMITTED, NodeAdmission
from koordlet.fairshare.server import FairShareServer
from koordlet.pods.cache import PodCache, PodMissing, PodUnavailable
from koordlet.pods.fairshare import FairSharePod

__all__ = [
    "DEFAULT_CDI_DIR",
    "DEFAULT_HOOK_DIR",
    "DEFAULT_SOCKET",
    "FAIL",
    "IGNORE",
    "FairShareWiring",
    "HookService",
    "HookServiceError",
    "hook_service",
]

DEFAULT_HOOK_DIR: Final = "/etc/runtime/hookserver.d"
DEFAULT_CDI_DIR: Final = "/var/run/cdi"
"""The dynamic CDI spec directory containerd and CRI-O read by default (``runtimehooks.cdi``)."""
DEFAULT_SOCKET: Final = "/var/run/koordlet/koordlet.sock"

log = structlog.get_logger("koordlet.hooks")

Observe = Callable[[str, str, float], None]
OnDenied = Callable[[str, str, str, str, str, str], None]
"""(namespace, name, uid, container, reason, message)"""
OnKubeletDevices = Callable[[str, str, tuple[str, ...]], None]
"""(pod uid, container, device ids)"""
KubeletGPUs = Callable[[str, str], tuple[str, ...]]
"""(pod uid, container) -> the GPU ids the kubelet gave it"""
FAIL: Final = "Fail"
IGNORE: Final = "Ignore"


def _hook_ports(
    pods: PodCache,
    on_denied: OnDenied | None,
    on_kubelet_devices: OnKubeletDevices | None,
    admission: NodeAdmission | None = None,
) -> dict[str, Any]:
    """The runtimehooks ports over the agent's pod cache (imports runtimehooks lazily)."""
    from runtimehooks.context import PodMeta
    from runtimehooks.ports import (
        REASON_POD_LOOKUP_ERROR,
        REASON_POD_NOT_FOUND,
        AdmissionRefused,
        ContainerKind,
        ContainerSpec,
        Denial,
        PodLookupError,
        PodSpec,
    )

    class Pods:
        def pod_spec(self, pod: PodMeta) -> PodSpec:
            try:
                record = pods.lookup(pod.uid, pod.namespace, pod.name)
            except PodMissing as exc:
                raise PodLookupError(REASON_POD_NOT_FOUND, str(exc)) from None
            except PodUnavailable as exc:
                raise PodLookupError(REASON_POD_LOOKUP_ERROR, str(exc)) from None
            return PodSpec(
                record.uid,
                tuple(
                    ContainerSpec(c.name, ContainerKind(c.kind), c.gpu_requests)
                    for c in record.containers
                ),
            )

    class Denials:
        def denied(self, d: Denial) -> None:
            if on_denied is not None:
                on_denied(d.pod.namespace, d.pod.name, d.pod.uid, d.container, d.reason, d.message)

    class KubeletDevices:
        def container_devices(self, pod: PodMeta, container: str, ids: tuple[str, ...]) -> None:
            if on_kubelet_devices is not None:
                on_kubelet_devices(pod.uid, container, ids)

    class Admission:
        def admit(self, pod: PodMeta, allocation: str) -> None:
            assert admission is not None
            verdict = admission.decide(pod.uid, pod.namespace, pod.name, allocation)
            if verdict.outcome != ADMITTED:
                raise AdmissionRefused(verdict.outcome, verdict.message)

    ports: dict[str, Any] = {
        "pods": Pods(),
        "denials": Denials(),
        "kubelet_devices": KubeletDevices(),
    }
    if admission is not None:
        ports["admission"] = Admission()
    return ports


def _kubelet_port(kubelet_gpus: KubeletGPUs) -> Any:
    from runtimehooks.context import PodMeta

    class KubeletAllocations:
        def gpu_devices(self, pod: PodMeta, container: str) -> tuple[str, ...]:
            return kubelet_gpus(pod.uid, container)

    return KubeletAllocations()


class HookServiceError(Exception):
    """The hook server could not start (socket path in use, not a socket, unwritable dir)."""


class _Observer:
    def __init__(self, observe: Observe) -> None:
        self._observe = observe

    def observe(self, stage: str, result: str, seconds: float) -> None:
        self._observe(str(stage), result, seconds)


@dataclass(frozen=True, slots=True)
class FairShareWiring:
    """The fair-share server the Gemini hook asks, and the hook's node settings."""

    server: FairShareServer | None
    """None: fair share is off on this node, and opted-in pods fail (fail closed)."""
    library: str
    default_limit: DefaultLimit


def _fairshare_hook(wiring: FairShareWiring, denials: Any = None) -> Any:
    from runtimehooks.hooks.fairshare import (
        FairShareEndpoint,
        FairShareHook,
        FairShareHookOptions,
        FairShareTarget,
    )

    def resolve(target: FairShareTarget) -> FairShareEndpoint:
        if wiring.server is None:
            raise RuntimeError(
                "pod asks for Gemini isolation, but fair share is off on this node "
                "(koordlet --fairshare=off)"
            )
        pod = FairSharePod(target.uid, target.namespace, target.name, target.spec)
        ep = wiring.server.ensure(pod)
        return FairShareEndpoint(
            ep.client_name, ep.scheduler_ip, ep.scheduler_port, ep.manager_ip, ep.manager_port
        )

    options = FairShareHookOptions(wiring.library, wiring.default_limit)
    return FairShareHook(resolve, options, denials=denials)


class HookService:
    """The runtime-hook gRPC server plus its registration file, started and stopped together."""

    def __init__(
        self,
        *,
        socket_path: str | os.PathLike[str],
        hook_dir: str | os.PathLike[str],
        visible_devices_by: str,
        observe: Observe,
        fairshare: FairShareWiring | None = None,
        pods: PodCache | None = None,
        on_denied: OnDenied | None = None,
        on_kubelet_devices: OnKubeletDevices | None = None,
        admission: NodeAdmission | None = None,
        sysfs_root: str | os.PathLike[str] | None = None,
        cdi_dir: str | os.PathLike[str] = "",
        kubelet_gpus: KubeletGPUs | None = None,
        failure_policy: str = FAIL,
        gpu_delivery: str = "env",
    ) -> None:
        from runtimehooks.cdi import CDISpecs
        from runtimehooks.hooks import new_default_registry
        from runtimehooks.hooks.gpu import GPUHookOptions
        from runtimehooks.hooks.rdma import RDMAHook

        self.socket_path = Path(socket_path)
        self.hook_dir = Path(hook_dir) if os.fspath(hook_dir) else None
        if failure_policy not in (FAIL, IGNORE):
            raise ValueError(f"failure policy {failure_policy!r}: not {FAIL} or {IGNORE}")
        self.failure_policy = failure_policy
        ports = (
            _hook_ports(pods, on_denied, on_kubelet_devices, admission) if pods is not None else {}
        )
        if kubelet_gpus is not None:
            ports["kubelet_allocations"] = _kubelet_port(kubelet_gpus)
        self.cdi = (
            CDISpecs(cdi_dir) if sysfs_root is not None and os.fspath(cdi_dir) else None
        )
        self.registry = new_default_registry(
            GPUHookOptions(
                visible_devices_by=visible_devices_by,  # type: ignore[arg-type]
                delivery=gpu_delivery,  # type: ignore[arg-type]
            ),
            observer=_Observer(observe),
            fairshare=(
                _fairshare_hook(fairshare, ports.get("denials")) if fairshare is not None else None
            ),
            rdma=(
                RDMAHook(sysfs_root, denials=ports.get("denials"), cdi=self.cdi,
                         admission=ports.get("admission"))
                if sysfs_root is not None else None
            ),
            **ports,
        )
        self._server: Any = None
        self.registration: Path | None = None

    def pods_listed(self, pod_uids: frozenset[str], listed_at: float) -> None:
        """The node's pods (listed from ``listed_at``): the CDI specs of the others go."""
        if self.cdi is None:
            return
        try:
            removed = self.cdi.retain(pod_uids, listed_at)
        except OSError as exc:
            log.error("removing stale rdma cdi specs failed", error=str(exc))
            return
        if removed:
            log.info("rdma cdi specs of departed pods removed", count=removed)

    def start(self) -> None:
        from runtimehooks.server import HookServer, SocketPathError, write_registration

        server = HookServer(self.registry, self.socket_path)
        try:
            server.start()
        except (SocketPathError, OSError) as exc:
            raise HookServiceError(f"runtime hook server: {exc}") from None
        self._server = server
        if self.hook_dir is not None:
            try:
                self.registration = write_registration(
                    self.hook_dir, self.socket_path, [str(s) for s in self.registry.stages()],
                    failure_policy=self.failure_policy,
                )
            except OSError as exc:
                server.stop(None)
                self._server = None
                raise HookServiceError(f"runtime hook registration: {exc}") from None
            log.info("runtime hook registration written", path=str(self.registration),
                     failure_policy=self.failure_policy)

    def stop(self) -> None:
        from runtimehooks.server import remove_registration

        if self.registration is not None and self.failure_policy == FAIL:
            log.info("runtime hook registration kept: the proxy refuses containers until the "
                     "agent is back", path=str(self.registration))
            self.registration = None
        if self.registration is not None and self.hook_dir is not None:
            try:
                remove_registration(self.hook_dir)
                log.info("runtime hook registration removed", path=str(self.registration))
            except OSError as exc:
                log.error("removing the runtime hook registration failed", error=str(exc))
            self.registration = None
        server, self._server = self._server, None
        if server is not None:
            server.stop(1.0)


def hook_service(
    *,
    socket_path: str,
    hook_dir: str,
    visible_devices_by: str,
    observe: Observe,
    fairshare: FairShareWiring | None = None,
    pods: PodCache | None = None,
    on_denied: OnDenied | None = None,
    on_kubelet_devices: OnKubeletDevices | None = None,
    admission: NodeAdmission | None = None,
    sysfs_root: str | os.PathLike[str] | None = None,
    cdi_dir: str | os.PathLike[str] = "",
    kubelet_gpus: KubeletGPUs | None = None,
    failure_policy: str = FAIL,
    gpu_delivery: str = "env",
) -> HookService | None:
    """The hook service, or None when disabled (empty socket) or unavailable (logged)."""
    if not socket_path:
        log.info("runtime hook server disabled (empty --socket)")
        return None
    try:
        return HookService(
            socket_path=socket_path,
            hook_dir=hook_dir,
            visible_devices_by=visible_devices_by,
            observe=observe,
            fairshare=fairshare,
            pods=pods,
            on_denied=on_denied,
            on_kubelet_devices=on_kubelet_devices,
            admission=admission,
            sysfs_root=sysfs_root,
            cdi_dir=cdi_dir,
            kubelet_gpus=kubelet_gpus,
            failure_policy=failure_policy,
            gpu_delivery=gpu_delivery,
        )
    except ImportError as exc:
        log.warning("runtime hook server unavailable: running without it", error=str(exc))
        return None
