"""ADAPTER: the runtime-hook gRPC server on a unix socket, and the proxy's registration file.

Role: serve ``runtime.v1alpha1.RuntimeHookService`` (SPEC section 7) for koord-runtime-proxy:
each RPC decodes its request (``protocol``), runs the registry's hooks for its stage and
answers with the resulting context.  The only module besides ``runtimehooks/api/`` that
imports grpc.

Invariants:

- Nothing happens at construction or import: ``HookServer.start()`` creates the parent
  directory, replaces a stale socket, binds, restricts the socket to mode 0600 (before the
  server starts serving) and starts; ``stop(grace)`` stops serving and removes the socket file
  it created.  A path that exists and is not a socket (a regular file, a directory, a symlink)
  is never deleted, and neither is a socket some server still answers on.
- Errors map to status codes and the server keeps serving: ``HookInputError`` ->
  ``INVALID_ARGUMENT`` with its message; any other exception (a hook under the Fail policy, a
  bug) -> ``INTERNAL``.
- Every RPC of the service is implemented: container RPCs run their stage's hooks
  (PreCreateContainerHook -> the GPU hook by default), sandbox RPCs run theirs; a stage
  without hooks answers an echo of the request.
- The registration file ``<hook dir>/koordlet.json`` is koordlet's: the same JSON as Go's
  ``json.MarshalIndent(RuntimeHookConfig, "", "\\t")`` (``remote-endpoint``,
  ``failure-policy``, ``runtime-hooks``, each omitted when empty; the policy ``Fail`` unless
  told otherwise: the proxy then refuses a container when this server cannot answer, rather
  than create it unchanged), written atomically
  (a temporary file whose name does not end in ``json``, which the proxy ignores, then
  ``rename``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, Final, NoReturn

import grpc
import structlog

from runtimehooks import protocol
from runtimehooks.api import api_pb2, api_pb2_grpc
from runtimehooks.context import HookInputError
from runtimehooks.files import fsync_dir, write_atomically
from runtimehooks.registry import FailurePolicy, HookRegistry, Stage

__all__ = [
    "DEFAULT_HOOK_DIR",
    "DEFAULT_SOCKET_PATH",
    "REGISTRATION_FILE",
    "SOCKET_MODE",
    "HookServer",
    "SocketPathError",
    "registration_json",
    "remove_registration",
    "write_registration",
]

DEFAULT_SOCKET_PATH: Final = "/var/run/koordlet/koordlet.sock"
DEFAULT_HOOK_DIR: Final = "/etc/runtime/hookserver.d"
REGISTRATION_FILE: Final = "koordlet.json"
SOCKET_MODE: Final = 0o600

_MAX_SUN_PATH: Final = 107  # sockaddr_un.sun_path holds 108 bytes, NUL included
_PROBE_TIMEOUT_S: Final = 0.5

log = structlog.get_logger("koordlet.runtimehooks")


class SocketPathError(RuntimeError):
    """The socket path cannot be (re)used: not a socket, in use, too long, or bind failed."""


# -- the servicer ---------------------------------------------------------------------------------


def _abort(context: Any, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message)  # raises
    raise AssertionError("grpc ServicerContext.abort returned")  # pragma: no cover


class _Servicer(api_pb2_grpc.RuntimeHookServiceServicer):
    """RuntimeHookService over a HookRegistry."""

    def __init__(self, registry: HookRegistry) -> None:
        self._registry = registry

    def _container(
        self, stage: Stage, request: api_pb2.ContainerResourceHookRequest, context: Any
    ) -> api_pb2.ContainerResourceHookResponse:
        try:
            ctx = protocol.container_context(request)
            return protocol.container_response(self._registry.run_container(stage, ctx))
        except HookInputError as err:
            code, message = grpc.StatusCode.INVALID_ARGUMENT, str(err)
            log.info("runtime hook request rejected", stage=str(stage), error=message)
        except Exception as err:
            code, message = grpc.StatusCode.INTERNAL, str(err)
            log.error("runtime hook failed", stage=str(stage), error=message, exc_info=True)
        _abort(context, code, message)

    def _sandbox(
        self, stage: Stage, request: api_pb2.PodSandboxHookRequest, context: Any
    ) -> api_pb2.PodSandboxHookResponse:
        try:
            ctx = protocol.sandbox_context(request)
            return protocol.sandbox_response(self._registry.run_sandbox(stage, ctx))
        except HookInputError as err:
            code, message = grpc.StatusCode.INVALID_ARGUMENT, str(err)
            log.info("runtime hook request rejected", stage=str(stage), error=message)
        except Exception as err:
            code, message = grpc.StatusCode.INTERNAL, str(err)
            log.error("runtime hook failed", stage=str(stage), error=message, exc_info=True)
        _abort(context, code, message)

    def PreRunPodSandboxHook(
        self, request: api_pb2.PodSandboxHookRequest, context: Any
    ) -> api_pb2.PodSandboxHookResponse:
        return self._sandbox(Stage.PRE_RUN_POD_SANDBOX, request, context)

    def PostStopPodSandboxHook(
        self, request: api_pb2.PodSandboxHookRequest, context: Any
    ) -> api_pb2.PodSandboxHookResponse:
        return self._sandbox(Stage.POST_STOP_POD_SANDBOX, request, context)

    def PreCreateContainerHook(
        self, request: api_pb2.ContainerResourceHookRequest, context: Any
    ) -> api_pb2.ContainerResourceHookResponse:
        return self._container(Stage.PRE_CREATE_CONTAINER, request, context)

    def PreStartContainerHook(
        self, request: api_pb2.ContainerResourceHookRequest, context: Any
    ) -> api_pb2.ContainerResourceHookResponse:
        return self._container(Stage.PRE_START_CONTAINER, request, context)

    def PostStartContainerHook(
        self, request: api_pb2.ContainerResourceHookRequest, context: Any
    ) -> api_pb2.ContainerResourceHookResponse:
        return self._container(Stage.POST_START_CONTAINER, request, context)

    def PostStopContainerHook(
        self, request: api_pb2.ContainerResourceHookRequest, context: Any
    ) -> api_pb2.ContainerResourceHookResponse:
        return self._container(Stage.POST_STOP_CONTAINER, request, context)

    def PreUpdateContainerResourcesHook(
        self, request: api_pb2.ContainerResourceHookRequest, context: Any
    ) -> api_pb2.ContainerResourceHookResponse:
        return self._container(Stage.PRE_UPDATE_CONTAINER_RESOURCES, request, context)


# -- the socket -----------------------------------------------------------------------------------


def _answers(path: Path) -> bool:
    """Whether something accepts connections on the unix socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(_PROBE_TIMEOUT_S)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except TimeoutError:
            return True  # a full backlog: a server is there
        except OSError as err:
            raise SocketPathError(f"{path}: cannot probe the existing socket: {err}") from err
        return True


def _clear_stale_socket(path: Path) -> None:
    """Remove a socket file nobody serves on; refuse anything else at ``path``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketPathError(f"{path} exists and is not a socket; refusing to replace it")
    if _answers(path):
        raise SocketPathError(f"{path}: another server is listening on this socket")
    log.info("removing stale runtime hook socket", path=str(path))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class HookServer:
    """The runtime-hook gRPC server on a unix socket; ``start()``/``stop()`` explicitly."""

    def __init__(
        self,
        registry: HookRegistry,
        socket_path: str | os.PathLike[str] = DEFAULT_SOCKET_PATH,
        *,
        max_workers: int = 8,
    ) -> None:
        self.registry = registry
        self.socket_path = Path(socket_path).absolute()
        self._max_workers = max_workers
        self._server: Any = None
        self._inode: int | None = None

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        """Bind the socket (mode 0600) and start serving; raises SocketPathError."""
        if self._server is not None:
            raise RuntimeError("HookServer already started")
        path = self.socket_path
        if len(os.fsencode(path)) > _MAX_SUN_PATH:
            raise SocketPathError(f"{path}: longer than {_MAX_SUN_PATH} bytes")
        path.parent.mkdir(parents=True, exist_ok=True)
        _clear_stale_socket(path)
        server = grpc.server(
            ThreadPoolExecutor(self._max_workers, thread_name_prefix="runtimehooks")
        )
        api_pb2_grpc.add_RuntimeHookServiceServicer_to_server(_Servicer(self.registry), server)
        try:
            bound = server.add_insecure_port(f"unix:{path}")
        except RuntimeError as err:
            raise SocketPathError(f"{path}: cannot bind: {err}") from err
        if not bound:
            raise SocketPathError(f"{path}: cannot bind")
        try:
            os.chmod(path, SOCKET_MODE)  # bound, not yet serving
            self._inode = os.lstat(path).st_ino
        except OSError:
            server.stop(None)
            raise
        server.start()
        self._server = server
        log.info("runtime hook server started", socket=str(path))

    def stop(self, grace: float | None = None) -> None:
        """Stop serving (in-flight RPCs get ``grace`` seconds) and remove the socket file."""
        server, self._server = self._server, None
        if server is None:
            return
        server.stop(grace).wait()
        try:
            st = os.lstat(self.socket_path)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISSOCK(st.st_mode) and st.st_ino == self._inode:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
        self._inode = None
        log.info("runtime hook server stopped", socket=str(self.socket_path))

    def __enter__(self) -> HookServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(None)


# -- the proxy's registration ---------------------------------------------------------------------


def registration_json(
    socket_path: str | os.PathLike[str],
    stages: Iterable[str],
    failure_policy: str = FailurePolicy.FAIL,
) -> str:
    """The registration file's content (Go ``json.MarshalIndent`` with a tab, no newline)."""
    config: dict[str, Any] = {}
    if endpoint := os.fspath(socket_path):
        config["remote-endpoint"] = endpoint
    if policy := str(FailurePolicy(failure_policy)):
        config["failure-policy"] = policy
    if hooks := [str(Stage(s)) for s in stages]:
        config["runtime-hooks"] = hooks
    return json.dumps(config, indent="\t", ensure_ascii=False)


def write_registration(
    hook_dir: str | os.PathLike[str] = DEFAULT_HOOK_DIR,
    socket_path: str | os.PathLike[str] = DEFAULT_SOCKET_PATH,
    stages: Iterable[str] = (Stage.PRE_CREATE_CONTAINER,),
    *,
    failure_policy: str = FailurePolicy.FAIL,
) -> Path:
    """Atomically write ``<hook_dir>/koordlet.json`` for koord-runtime-proxy; returns its path.

    ``socket_path`` is the endpoint as the proxy sees it (the host path when the agent runs
    in a container with the socket directory mounted elsewhere); ``stages`` are stage names
    (``Stage`` values, e.g. ``HookRegistry.stages()``); an unknown name is a ValueError.
    """
    content = registration_json(socket_path, stages, failure_policy).encode()
    directory = Path(hook_dir)
    directory.mkdir(parents=True, exist_ok=True)
    return write_atomically(directory, REGISTRATION_FILE, content)


def remove_registration(hook_dir: str | os.PathLike[str] = DEFAULT_HOOK_DIR) -> bool:
    """Remove ``<hook_dir>/koordlet.json``; returns whether there was one."""
    try:
        os.unlink(Path(hook_dir) / REGISTRATION_FILE)
    except FileNotFoundError:
        return False
    fsync_dir(Path(hook_dir))
    return True
