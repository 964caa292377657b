"""A test double of koord-runtime-proxy's CreateContainer path, as its source behaves.

What it follows (koordinator-sh/koordinator, ``pkg/runtimeproxy``):

- ``config/config_manager.go``: every file of the hook directory whose name ends in ``json`` is
  a ``RuntimeHookConfig`` (``remote-endpoint``, ``failure-policy``, ``runtime-hooks``).
- ``resexecutor/cri/container.go`` ``ParseRequest``: a pod labelled
  ``runtimeproxy.koordinator.sh/skip-hookserver: "true"`` (the proxy's default
  ``--runtime-hook-server-key``/``-val``) is never sent to a hook server.
- ``dispatcher/dispatcher.go``: the first configuration that lists ``PreCreateContainer`` is
  called (only one hook server per request), over ``unix://<remote-endpoint>`` with a
  non-blocking dial, so a dead socket is an RPC error; the configuration's policy comes back
  with the error.
- ``server/cri/criserver.go`` ``InterceptRuntimeRequest``: an error under ``Fail`` fails the CRI
  call (the container is not created); under ``Ignore`` (or no policy) the request goes to the
  runtime unchanged.  On success ``UpdateRequest`` replaces the environment with the
  response's (when it has one) and merges its annotations into the request's.

The runtime then starts the container with the image's environment under the request's
(containerd: the CRI envs override the image config's), which is what ``created`` returns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from runtimehooks.api import api_pb2, api_pb2_grpc

SKIP_LABEL = "runtimeproxy.koordinator.sh/skip-hookserver"


class CreateContainerError(Exception):
    """The proxy failed the CRI CreateContainer (``hook server err: ...``)."""


@dataclass
class Created:
    envs: dict[str, str]
    annotations: dict[str, str]
    hooked: bool


@dataclass
class Pod:
    uid: str
    name: str
    namespace: str = "default"
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


class RuntimeProxy:
    def __init__(self, hook_dir: Path, *, timeout_s: float = 5.0) -> None:
        self.hook_dir = hook_dir
        self.timeout_s = timeout_s

    def _configs(self) -> list[dict[str, object]]:
        configs = []
        for path in sorted(self.hook_dir.iterdir()) if self.hook_dir.is_dir() else []:
            if path.is_file() and path.name.endswith("json"):
                configs.append(json.loads(path.read_text()))
        return configs

    def create_container(
        self,
        pod: Pod,
        container: str,
        envs: dict[str, str],
        image_envs: dict[str, str],
        annotations: dict[str, str] | None = None,
    ) -> Created:
        req_envs, req_annotations = dict(envs), dict(annotations or {})
        hooked = False
        if pod.labels.get(SKIP_LABEL) != "true":
            for config in self._configs():
                if "PreCreateContainer" not in (config.get("runtime-hooks") or []):
                    continue
                policy = config.get("failure-policy", "")
                try:
                    resp = self._call(str(config["remote-endpoint"]), pod, container,
                                      req_envs, req_annotations)  # fmt: skip
                except grpc.RpcError as err:
                    if policy == "Fail":
                        raise CreateContainerError(f"hook server err: {err.code()}") from err
                    break  # Ignore: the request goes on unchanged
                hooked = True
                if resp.container_envs:
                    req_envs = dict(resp.container_envs)
                req_annotations.update(resp.container_annotations)
                break  # one hook server per request
        return Created({**image_envs, **req_envs}, req_annotations, hooked)

    def _call(self, endpoint: str, pod: Pod, container: str, envs: dict[str, str],
              annotations: dict[str, str]) -> api_pb2.ContainerResourceHookResponse:  # fmt: skip
        req = api_pb2.ContainerResourceHookRequest()
        meta = req.pod_meta
        meta.name, meta.namespace, meta.uid = pod.name, pod.namespace, pod.uid
        req.container_meta.name = container
        req.pod_labels.update(pod.labels)
        req.pod_annotations.update(pod.annotations)
        req.container_envs.update(envs)
        req.container_annotations.update(annotations)
        with grpc.insecure_channel(f"unix://{endpoint}") as channel:
            stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
            resp: api_pb2.ContainerResourceHookResponse = stub.PreCreateContainerHook(
                req, timeout=self.timeout_s
            )
            return resp
