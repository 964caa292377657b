"""Plays the kubelet's side of deviceplugin/v1beta1 with a client generated from the kubelet's
own ``api.proto`` (run in a subprocess by ``test_deviceplugin_kubelet.py``: the kubelet's
``v1beta1`` messages and koordlet's cannot share one protobuf descriptor pool).

Usage: ``python kubelet_player.py GENERATED_DIR PLUGIN_DIR``. Serves ``Registration`` on
``PLUGIN_DIR/kubelet.sock``; on each registration dials the plugin, asks its options and follows
``ListAndWatch``. Reads JSON commands on stdin, one per line, and writes JSON events on stdout:

- ``{"cmd": "allocate", "containers": [[id, ...], ...]}`` -> ``{"event": "allocate", "envs":
  [...]}`` or ``{"event": "allocate_error", "code": ..., "details": ...}``;
- ``{"cmd": "restart"}``: stop, delete every socket in the directory (as the kubelet does when
  it starts), serve ``kubelet.sock`` again -> the plugin must register again;
- ``{"cmd": "quit"}``.
Events: ``register`` (the request), ``options``, ``devices`` (each ListAndWatch answer).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, sys.argv[1])
from k8s.io.kubelet.pkg.apis.deviceplugin.v1beta1 import (  # type: ignore[import-not-found]
    api_pb2,
    api_pb2_grpc,
)

PLUGIN_DIR = Path(sys.argv[2])
_out = threading.Lock()


def emit(event: dict[str, Any]) -> None:
    with _out:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()


class Kubelet(api_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.endpoint = ""

    def Register(self, request: Any, context: Any) -> Any:
        self.endpoint = request.endpoint
        emit(
            {
                "event": "register",
                "version": request.version,
                "endpoint": request.endpoint,
                "resource_name": request.resource_name,
            }
        )
        threading.Thread(target=self.follow, args=(request.endpoint,), daemon=True).start()
        return api_pb2.Empty()

    def follow(self, endpoint: str) -> None:
        channel = grpc.insecure_channel(f"unix://{PLUGIN_DIR / endpoint}")
        stub = api_pb2_grpc.DevicePluginStub(channel)
        options = stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
        emit({"event": "options", "pre_start_required": options.pre_start_required})
        try:
            for answer in stub.ListAndWatch(api_pb2.Empty()):
                emit(
                    {
                        "event": "devices",
                        "devices": [
                            [d.ID, d.health, [n.ID for n in d.topology.nodes]]
                            for d in answer.devices
                        ],
                    }
                )
        except grpc.RpcError:
            pass  # the plugin went away (stopped or restarted)


def serve(kubelet: Kubelet) -> grpc.Server:
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    api_pb2_grpc.add_RegistrationServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{PLUGIN_DIR / 'kubelet.sock'}")
    server.start()
    return server


def main() -> None:
    kubelet = Kubelet()
    server = serve(kubelet)
    emit({"event": "ready"})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            break
        if cmd["cmd"] == "restart":
            server.stop(None).wait()
            for p in PLUGIN_DIR.iterdir():
                if p.is_socket():
                    os.unlink(p)
            server = serve(kubelet)
            emit({"event": "restarted"})
        elif cmd["cmd"] == "allocate":
            channel = grpc.insecure_channel(f"unix://{PLUGIN_DIR / kubelet.endpoint}")
            request = api_pb2.AllocateRequest(
                container_requests=[
                    api_pb2.ContainerAllocateRequest(devicesIDs=ids) for ids in cmd["containers"]
                ]
            )
            try:
                answer = api_pb2_grpc.DevicePluginStub(channel).Allocate(request, timeout=30)
                emit(
                    {
                        "event": "allocate",
                        "envs": [dict(r.envs) for r in answer.container_responses],
                    }
                )
            except grpc.RpcError as exc:
                emit({"event": "allocate_error", "code": exc.code().name, "details": exc.details()})
            channel.close()
    server.stop(None)


if __name__ == "__main__":
    main()
