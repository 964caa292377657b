"""ADAPTER: the ``NodeAPI`` port over a real API server; the only koordlet module importing
``kubernetes``.

Role: raw JSON requests through the official client's ``ApiClient`` (its configuration,
authentication and connection pool; never its generated models), decoded once here into the
port's slim records (``NodeState``, ``NodePods``, ``apis.device.Device``).

Invariants:

- Every response body is read and its connection released, whatever the status.
- 404 -> ``NotFoundError``, 409 -> ``ConflictError``, any other failure (status or transport)
  -> ``ApiError``; nothing else escapes. A 2xx answer that does not decode is an
  ``ApiError`` (status 0, like a transport failure).
- Bodies are decoded with ``apis.jsonload.loads`` (any depth a Go server serves; a tenant's
  pod with 1,500-deep managedFields no longer stops the node's pod list, hence the Device
  sync and GPU admission), and ``metadata.managedFields`` is dropped from the answer and its
  ``items`` at once (``apis.core.drop_managed_fields``).
- Node labels and status are changed with JSON merge patches (``application/merge-patch+json``)
  that name only the keys the agent manages; the Device is created with POST and replaced
  with PUT at the resourceVersion it was read at.
- Pods in phase ``Succeeded`` or ``Failed`` count as gone (they hold no devices any more).
- A Device CR that does not decode is replaced: it reads as its metadata with no devices, so
  the next update rewrites its spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

import structlog
from yaml import YAMLError

from apis.core import drop_managed_fields
from apis.device import API_VERSION, KIND, PLURAL, Device, DeviceDecodeError
from apis.gpushare import GPUShareDecodeError, placement_of
from apis.jsonload import loads
from koordlet.deviceplugin.gpushare import PendingPod, PodConflict, pending_pods
from koordlet.pods.cache import PodMissing, PodUnavailable
from koordlet.pods.record import PodRecord, decode_pod_record, str_map
from koordlet.reporting.reporter import NodePods
from koordlet.reporting.sync import ApiError, ConflictError, NodeState, NotFoundError

__all__ = ["KubeConfigError", "KubeNodeAPI"]

log = structlog.get_logger("koordlet.kube")

_JSON: Final = "application/json"
_MERGE_PATCH: Final = "application/merge-patch+json"
_DEVICES_PATH: Final = f"/apis/{API_VERSION}/{PLURAL}"
_TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})


class KubeConfigError(Exception):
    """No usable kubeconfig or in-cluster configuration (a user error)."""


def _gpushare_placed(annotations: Mapping[str, str]) -> bool:
    """A pod gpushare's extender (or ours) placed: the scheduler accounts its card memory."""
    try:
        return placement_of(annotations) is not None
    except GPUShareDecodeError:
        return False


def _q(name: str) -> str:
    return quote(name, safe="")


class KubeNodeAPI:
    """The port over ``kubernetes.client.ApiClient``; see the module docstring."""

    def __init__(self, api_client: Any, *, timeout_s: float = 30.0) -> None:
        self._client = api_client
        self._timeout_s = timeout_s

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, *, timeout_s: float = 30.0) -> KubeNodeAPI:
        """From ``path``; without one, in-cluster, then ``$KUBECONFIG`` or ``~/.kube/config``."""
        from kubernetes import client
        from kubernetes import config as kube_config

        config: Any = kube_config  # its loaders are untyped
        try:
            if path:
                return cls(config.new_client_from_config(config_file=path), timeout_s=timeout_s)
            try:
                cfg = client.Configuration()
                config.load_incluster_config(client_configuration=cfg)
                return cls(client.ApiClient(cfg), timeout_s=timeout_s)
            except config.ConfigException:
                return cls(config.new_client_from_config(), timeout_s=timeout_s)
        except (config.ConfigException, OSError, ValueError, TypeError, KeyError, YAMLError) as exc:
            where = path or "in-cluster, $KUBECONFIG or ~/.kube/config"
            raise KubeConfigError(f"cannot load a kubeconfig ({where}): {exc}") from None

    @property
    def verifies_tls(self) -> bool:
        """False when the kubeconfig disables certificate verification."""
        return bool(getattr(self._client.configuration, "verify_ssl", True))

    def close(self) -> None:
        self._client.close()

    # -- transport ----------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: object = None,
        content_type: str = _JSON,
        timeout_s: float | tuple[float, float] | None = None,
    ) -> Any:
        headers = {"Accept": _JSON}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            method, url, headers, body, _ = self._client.param_serialize(
                method=method,
                resource_path=path,
                query_params=query,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            resp = self._client.call_api(
                method,
                url,
                header_params=headers,
                body=body,
                _request_timeout=timeout_s if timeout_s is not None else self._timeout_s,
            )
        except Exception as exc:  # urllib3 transport errors, TLS errors, ApiException(0)
            raise ApiError(0, f"{method} {path}: {exc}") from None
        try:
            data = resp.read()
        finally:
            release = getattr(resp.response, "release_conn", None)
            if release is not None:
                release()
        status = int(resp.status)
        try:
            payload = drop_managed_fields(loads(data)) if data else None
        except ValueError as exc:
            if 200 <= status < 300:
                raise ApiError(0, f"{method} {path}: undecodable answer: {exc}") from None
            payload = None
        if 200 <= status < 300:
            return payload
        message = payload.get("message") if isinstance(payload, Mapping) else None
        text = f"{method} {path}: {message or resp.reason or 'failed'}"
        if status == 404:
            raise NotFoundError(status, text)
        if status == 409:
            raise ConflictError(status, text)
        raise ApiError(status, text)

    # -- nodes and pods -----------------------------------------------------------------------

    def get_node(self, name: str) -> NodeState:
        obj = self._request("GET", f"/api/v1/nodes/{_q(name)}")
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        return NodeState(
            name=str(meta.get("name") or name),
            uid=str(meta.get("uid") or ""),
            labels=str_map(meta.get("labels")),
            capacity=str_map(status.get("capacity")),
            allocatable=str_map(status.get("allocatable")),
        )

    def list_node_pods(self, node_name: str) -> NodePods:
        obj = self._request(
            "GET", "/api/v1/pods", query=[("fieldSelector", f"spec.nodeName={node_name}")]
        )
        uids: set[str] = set()
        allocated: set[str] = set()
        records: dict[str, PodRecord] = {}
        for pod in obj.get("items") or []:
            if (pod.get("status") or {}).get("phase") in _TERMINAL_PHASES:
                continue
            record = decode_pod_record(pod)
            if not record.uid:
                continue
            uids.add(record.uid)
            if record.allocation is not None or _gpushare_placed(record.annotations):
                allocated.add(record.uid)
            records[record.uid] = record
        return NodePods(uids=frozenset(uids), allocated=frozenset(allocated), records=records)

    def get_pod(self, namespace: str, name: str, timeout_s: float) -> PodRecord:
        """``koordlet.pods.cache.PodGetter``: one GET, at most ``timeout_s`` seconds (half to
        connect, half to read)."""
        path = f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}"
        half = timeout_s / 2
        try:
            return decode_pod_record(self._request("GET", path, timeout_s=(half, half)))
        except NotFoundError:
            raise PodMissing(f"pod {namespace}/{name} does not exist") from None
        except ApiError as exc:
            raise PodUnavailable(f"reading pod {namespace}/{name} failed: {exc}") from None

    def fail_pod(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        """``koordlet.admission.PodStatusAPI``: merge-patch the pod's status to phase
        ``Failed`` (as kubelet admission does), only while it is still the pod ``uid``."""
        self._request(
            "PATCH",
            f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}/status",
            body={
                "metadata": {"uid": uid},
                "status": {"phase": "Failed", "reason": reason, "message": message},
            },
            content_type=_MERGE_PATCH,
        )

    def create_event(self, event: Mapping[str, Any]) -> None:
        """``koordlet.events.EventAPI``: POST a core/v1 Event into its namespace."""
        namespace = str((event.get("metadata") or {}).get("namespace") or "default")
        self._request("POST", f"/api/v1/namespaces/{_q(namespace)}/events", body=dict(event))

    def list_node_pod_records(self, node_name: str) -> list[PodRecord]:
        """The node's live pods (not Succeeded/Failed): the same list and records as
        ``list_node_pods``."""
        return list(self.list_node_pods(node_name).records.values())

    # -- gpushare's device plugin (koordlet.deviceplugin.server.PodSource) -------------------

    def pending_gpushare_pods(self, node_name: str) -> list[PendingPod]:
        """The node's Pending pods that carry ``ALIYUN_COM_GPU_MEM_ASSIGNED=false``."""
        selector = f"spec.nodeName={node_name},status.phase=Pending"
        obj = self._request("GET", "/api/v1/pods", query=[("fieldSelector", selector)])
        items = obj.get("items")
        return pending_pods(items if isinstance(items, list) else [], node_name)

    def mark_assigned(self, pod: PendingPod, annotations: dict[str, str]) -> None:
        """Merge ``annotations`` at the pod's resourceVersion and UID (409 -> PodConflict)."""
        meta: dict[str, Any] = {"annotations": annotations, "uid": pod.uid}
        if pod.resource_version:
            meta["resourceVersion"] = pod.resource_version
        try:
            self._request(
                "PATCH",
                f"/api/v1/namespaces/{_q(pod.namespace)}/pods/{_q(pod.name)}",
                body={"metadata": meta},
                content_type=_MERGE_PATCH,
            )
        except (ConflictError, NotFoundError) as exc:
            raise PodConflict(str(exc)) from None

    def patch_node_labels(self, name: str, labels: Mapping[str, str]) -> None:
        self._request(
            "PATCH",
            f"/api/v1/nodes/{_q(name)}",
            body={"metadata": {"labels": dict(labels)}},
            content_type=_MERGE_PATCH,
        )

    def patch_node_status(
        self,
        name: str,
        capacity: Mapping[str, str | None],
        allocatable: Mapping[str, str | None],
    ) -> None:
        status: dict[str, Any] = {}
        if capacity:
            status["capacity"] = dict(capacity)
        if allocatable:
            status["allocatable"] = dict(allocatable)
        if not status:
            return
        self._request(
            "PATCH",
            f"/api/v1/nodes/{_q(name)}/status",
            body={"status": status},
            content_type=_MERGE_PATCH,
        )

    # -- the Device CR ------------------------------------------------------------------------

    @staticmethod
    def _decode_device(obj: Any) -> Device:
        try:
            return Device.from_dict(obj)
        except DeviceDecodeError as exc:
            log.warning("existing device does not decode: it will be rewritten", error=str(exc))
        try:
            return Device.from_dict(
                {"apiVersion": API_VERSION, "kind": KIND, "metadata": obj.get("metadata")}
            )
        except (DeviceDecodeError, AttributeError) as exc:
            raise ApiError(0, f"device answer cannot be decoded: {exc}") from None

    def get_device(self, name: str) -> Device:
        return self._decode_device(self._request("GET", f"{_DEVICES_PATH}/{_q(name)}"))

    def create_device(self, device: Device) -> Device:
        return self._decode_device(self._request("POST", _DEVICES_PATH, body=device.to_dict()))

    def update_device(self, device: Device) -> Device:
        path = f"{_DEVICES_PATH}/{_q(device.name)}"
        return self._decode_device(self._request("PUT", path, body=device.to_dict()))
