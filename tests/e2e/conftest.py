"""Fixtures of the real-API-server tier (etcd + kube-apiserver on loopback, v1.20.2 and v1.37.2).

v1.20.2 comes from ``hack/kube-apiserver.sh``: env ``KUBE_APISERVER_BIN``/``ETCD_BIN``, else
the cache ``${KOORD_CACHE_DIR:-~/.cache/koord-py}/kube-apiserver-v1.20.2/``, else a build from
Debian's ``kubernetes`` source package (first use only; minutes).

- ``KOORD_SKIP_E2E=1``: skip the tier.
- Binaries unavailable: skip with the script's reason, or FAIL when ``CI`` is set.

The current control plane (kube-apiserver, kube-controller-manager, kube-scheduler v1.37.2 and
etcd v3.7.3) comes from ``hack/kube-1.37.sh``: cached, else built on first use (most of half
an hour cold; ``make test`` starts both builds in the background before the unit tiers,
``hack/control-planes.sh``). Unavailable: skip, or FAIL under ``CI``.

The version matrix: ``kube_version`` is a session fixture parametrized over
``selected_versions()`` (both versions unless env ``KOORD_KUBE_VERSIONS`` narrows it), and
``kube_binaries`` gives that version's binaries, so every test that starts an API server runs
on v1.20.2 and on v1.37.2, its id suffixed ``[k8s-v1.20.2]`` / ``[k8s-v1.37.2]``.

Fixtures: ``kube_version`` and ``kube_binaries`` (session), ``kube137_binaries`` (session, dict
of the v1.37.2 binaries by their script key), ``apiserver`` (session, AlwaysAllow),
``rbac_apiserver`` (session, RBAC, started only when requested), ``make_apiserver``
(function-scoped factory; servers are stopped at the end of the test), ``kube_client``
(function-scoped ``kubernetes.client.ApiClient`` with the admin token of ``apiserver``).
"""

from __future__ import annotations

import collections
import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

try:  # tests/e2e as a package
    from .apiserver import KUBE_VERSIONS, V120, V137, ApiServer, KubeBinaries, resolve_version
except ImportError:  # rootdir-relative "prepend" import (no __init__.py) or importlib mode
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from apiserver import KUBE_VERSIONS, V120, V137, ApiServer, KubeBinaries, resolve_version

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "hack" / "kube-apiserver.sh"
BUILD_TIMEOUT_S = 3600


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The tier talks HTTPS to a self-signed loopback server on purpose.
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.path)).resolve().parents:
            item.add_marker(
                pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
            )


def _unavailable(reason: str) -> None:
    msg = f"real-API-server tier unavailable: {reason}"
    if os.environ.get("CI"):
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


def _provide(
    request: pytest.FixtureRequest, script_name: str, keys: tuple[str, ...]
) -> dict[str, str]:
    """Run ``hack/<script_name>`` (it prints ``KEY=path`` lines: cached binaries, else built
    now, or waited for when a build is under way, e.g. ``hack/control-planes.sh``'s), streaming
    its progress to the terminal; the paths of ``keys``. Unavailable: skip, or FAIL under CI."""
    script = REPO_ROOT / "hack" / script_name
    if not script.is_file():
        _unavailable(f"{script} missing")
    capman = request.config.pluginmanager.getplugin("capturemanager")
    tail: collections.deque[str] = collections.deque(maxlen=20)
    # Stream the script's progress to the terminal: a first-use build takes minutes.
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        try:
            proc = subprocess.Popen(
                ["bash", str(script)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO_ROOT,
            )
        except OSError as exc:
            _unavailable(f"cannot run {script}: {exc}")
        assert proc.stderr is not None and proc.stdout is not None
        try:
            for line in proc.stderr:
                tail.append(line.rstrip("\n"))
                sys.stderr.write(line)
                sys.stderr.flush()
            out = proc.stdout.read()
            rc = proc.wait(timeout=BUILD_TIMEOUT_S)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if rc != 0:
        errors = [ln for ln in tail if "error:" in ln]
        _unavailable((errors or list(tail) or [f"{script.name} exited with {rc}"])[-1])
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    missing = [k for k in keys if k not in values]
    if missing:
        _unavailable(f"{script.name} printed no {', '.join(missing)}: {out!r}")
    return {k: values[k] for k in keys}


def _binaries_120(request: pytest.FixtureRequest) -> KubeBinaries:
    """v1.20.2's (kube-apiserver, etcd) from hack/kube-apiserver.sh (builds on first use)."""
    values = _provide(request, SCRIPT.name, ("KUBE_APISERVER_BIN", "ETCD_BIN"))
    return KubeBinaries(values["KUBE_APISERVER_BIN"], values["ETCD_BIN"], V120)


KUBE_137_KEYS = (
    "KUBE_APISERVER_BIN",
    "KUBE_CONTROLLER_MANAGER_BIN",
    "KUBE_SCHEDULER_BIN",
    "ETCD_BIN",
)
_BINARIES_137: dict[str, str] = {}


def _binaries_137(request: pytest.FixtureRequest) -> dict[str, str]:
    """The v1.37.2 control plane's binaries (keys: ``KUBE_137_KEYS``) from hack/kube-1.37.sh
    (builds on first use: most of half an hour cold; ``make test`` starts it in the
    background first)."""
    if not _BINARIES_137:
        _BINARIES_137.update(_provide(request, "kube-1.37.sh", KUBE_137_KEYS))
    return dict(_BINARIES_137)


@pytest.fixture(scope="session")
def kube137_binaries(request: pytest.FixtureRequest) -> dict[str, str]:
    """The v1.37.2 control plane's binaries (keys: ``KUBE_137_KEYS``). Unavailable: skip, or
    FAIL under CI."""
    _skip_if_disabled()
    return _binaries_137(request)


def _skip_if_disabled() -> None:
    if os.environ.get("KOORD_SKIP_E2E") == "1":
        pytest.skip("KOORD_SKIP_E2E=1: real-API-server tier disabled")


def selected_versions() -> list[str]:
    """The control-plane versions of the matrix: env ``KOORD_KUBE_VERSIONS`` (comma-separated,
    e.g. ``1.37`` or ``v1.20.2,v1.37.2``), else every version in ``KUBE_VERSIONS``."""
    raw = os.environ.get("KOORD_KUBE_VERSIONS", "").strip()
    if not raw:
        return list(KUBE_VERSIONS)
    chosen: list[str] = []
    for word in (w for w in raw.split(",") if w.strip()):
        try:
            version = resolve_version(word)
        except ValueError as exc:
            raise pytest.UsageError(f"KOORD_KUBE_VERSIONS: {exc}") from None
        if version not in chosen:
            chosen.append(version)
    return chosen


@pytest.fixture(scope="session", params=selected_versions(), ids=lambda v: f"k8s-{v}")
def kube_version(request: pytest.FixtureRequest) -> str:
    """The control plane's version under test: every e2e test that starts an API server runs
    once per version of the matrix (``selected_versions()``). A test pins one with
    ``@pytest.mark.parametrize("kube_version", [NEWEST], indirect=True)``."""
    version: str = request.param
    return version


@pytest.fixture(scope="session")
def kube_binaries(request: pytest.FixtureRequest, kube_version: str) -> KubeBinaries:
    """(kube-apiserver path, etcd path) of ``kube_version``, with ``.version``: v1.20.2 from
    hack/kube-apiserver.sh (built on first use), v1.37.2 from hack/kube-1.37.sh's cache."""
    _skip_if_disabled()
    if kube_version == V120:
        return _binaries_120(request)
    if kube_version == V137:
        bins = _binaries_137(request)
        return KubeBinaries(bins["KUBE_APISERVER_BIN"], bins["ETCD_BIN"], V137)
    raise AssertionError(f"no binaries for {kube_version}")  # KUBE_VERSIONS and this agree


@pytest.fixture(scope="session")
def apiserver(kube_binaries: tuple[str, str]) -> Iterator[ApiServer]:
    """A started AlwaysAllow etcd + kube-apiserver shared by the whole session."""
    srv = ApiServer(*kube_binaries).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def rbac_apiserver(kube_binaries: tuple[str, str]) -> Iterator[ApiServer]:
    """A started etcd + kube-apiserver with ``--authorization-mode=RBAC``."""
    srv = ApiServer(*kube_binaries, authorization_mode="RBAC").start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def make_apiserver(kube_binaries: tuple[str, str]) -> Iterator[Callable[..., ApiServer]]:
    """Factory: ``make_apiserver(authorization_mode=..., extra_users=...)`` -> started server."""
    started: list[ApiServer] = []

    def make(**kwargs: Any) -> ApiServer:
        srv = ApiServer(*kube_binaries, **kwargs)
        started.append(srv)
        return srv.start()

    try:
        yield make
    finally:
        for srv in started:
            srv.stop()


@pytest.fixture
def kube_client(apiserver: ApiServer) -> Iterator[Any]:
    """``kubernetes.client.ApiClient`` for ``apiserver`` with the admin token (no TLS verify)."""
    from kubernetes import client

    api = client.ApiClient(apiserver.client_configuration())
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def kube_scheduler_bin(request: pytest.FixtureRequest, kube_binaries: KubeBinaries) -> str:
    """Go kube-scheduler of the control plane's version: v1.20.2 from hack/kube-scheduler.sh
    (same source tree as the API server; built on first use, cached), v1.37.2 from
    hack/kube-1.37.sh's cache. Unavailable: skip, or FAIL under CI."""
    if kube_binaries.version == V137:
        return _binaries_137(request)["KUBE_SCHEDULER_BIN"]
    script = REPO_ROOT / "hack" / "kube-scheduler.sh"
    try:
        proc = subprocess.run(
            ["bash", str(script)],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            timeout=BUILD_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        _unavailable(f"cannot run {script}: {exc}")
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"{script.name} exited {proc.returncode}"]
        _unavailable(f"Go kube-scheduler: {lines[-1]}")
    values = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    if "KUBE_SCHEDULER_BIN" not in values:
        _unavailable(f"{script.name} printed no binary path: {proc.stdout!r}")
    return values["KUBE_SCHEDULER_BIN"]
