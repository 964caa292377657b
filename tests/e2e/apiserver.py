"""A throw-away etcd + kube-apiserver pair for the real-API-server test tier.

Library, not a test module. Typical use (the fixtures in ``tests/e2e/conftest.py`` do this)::

    srv = ApiServer(apiserver_bin, etcd_bin).start()
    try:
        ...  # srv.url, srv.admin_token, srv.kubeconfig_path(), srv.client_configuration()
    finally:
        srv.stop()

Both processes listen on 127.0.0.1 only, on free ports picked at runtime, with a fresh temp
dir (etcd data, certificates, token file, service-account key, kubeconfigs, logs) that
``stop()`` removes. The pair is always cleaned up: ``stop()`` is idempotent, an ``atexit``
hook stops every server still running, and on Linux the children get ``PR_SET_PDEATHSIG`` so
they die with the Python process even when it is killed.

Authentication is a static token file: ``admin_token`` (user ``koord-admin``, group
``system:masters``), ``user_token`` (user ``koord-user``, no groups: for RBAC tests) and any
``extra_users`` given to the constructor (``token_for(name)``; a name like
``system:serviceaccount:<ns>:<sa>`` is matched by RBAC ServiceAccount subjects).

Auditing (the chaos tier): ``audit_policy=`` (an ``audit.k8s.io/v1`` Policy as a dict) runs the
API server with ``--audit-policy-file`` and a JSON-lines ``--audit-log-path``; the log survives
``restart_apiserver()`` (appended) and ``audit_events()`` reads it back. ``kubeconfig_path(token,
server=...)`` points a kubeconfig at another address, e.g. a fault proxy in front of the server.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.ports import free_port as _free_port

__all__ = [
    "KUBE_VERSIONS",
    "NEWEST",
    "V120",
    "V137",
    "ApiServer",
    "ApiServerError",
    "KubeBinaries",
    "resolve_version",
]

# The control planes of the e2e matrix, oldest first: v1.20.2 from Debian's source
# (hack/kube-apiserver.sh), v1.37.2 from Go modules (hack/kube-1.37.sh).
V120 = "v1.20.2"
V137 = "v1.37.2"
KUBE_VERSIONS = (V120, V137)
NEWEST = KUBE_VERSIONS[-1]


def resolve_version(word: str) -> str:
    """The matrix's version that ``word`` names: exact (``v1.37.2``) or its minor (``1.37``,
    ``v1.37``); ValueError naming the known ones otherwise."""
    want = word.strip()
    for version in KUBE_VERSIONS:
        if version == want or version.startswith("v" + want.lstrip("v") + "."):
            return version
    raise ValueError(f"unknown version {want!r} (known: {', '.join(KUBE_VERSIONS)})")


class KubeBinaries(tuple[str, str]):
    """(kube-apiserver path, etcd path) with the control plane's ``version``: unpacks into
    ``ApiServer(*binaries)`` as the plain pair did."""

    version: str

    def __new__(cls, apiserver_bin: str, etcd_bin: str, version: str) -> KubeBinaries:
        self = super().__new__(cls, (apiserver_bin, etcd_bin))
        self.version = version
        return self


ADMIN_USER = "koord-admin"
PLAIN_USER = "koord-user"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

_LIVE: weakref.WeakSet[ApiServer] = weakref.WeakSet()
_LOG_TAIL_LINES = 40
_DIR_PREFIX = "koord-apiserver-"


class ApiServerError(RuntimeError):
    """etcd or kube-apiserver did not come up (the message carries the log tail)."""


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        data = path.read_bytes()[-64 * 1024 :]
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    text = data.decode("utf-8", "replace").splitlines()[-lines:]
    return "\n".join(text) if text else "<empty log>"


def _reap_stale_dirs(base: Path) -> None:
    """Remove temp dirs left by a process that died without cleanup (e.g. SIGKILL)."""
    try:
        candidates = list(base.glob(_DIR_PREFIX + "*"))
    except OSError:
        return
    for d in candidates:
        try:
            pid = int((d / "owner.pid").read_text())
        except (OSError, ValueError):
            continue  # not ours, or still being created
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            pass  # alive, another user's


def _pdeathsig_preexec() -> Any:
    """preexec_fn that kills the child (SIGKILL) when the creating thread's process dies."""
    if not sys.platform.startswith("linux"):
        return None
    # PDEATHSIG fires when the *thread* that forked exits: only arm it from the main thread.
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # parent already gone between fork and prctl
            os._exit(1)

    return preexec


def _gen_rsa_key(key_path: Path, pub_path: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl:
        subprocess.run(
            [openssl, "genrsa", "-out", str(key_path), "2048"],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [openssl, "rsa", "-in", str(key_path), "-pubout", "-out", str(pub_path)],
            check=True,
            capture_output=True,
        )
        return
    try:
        from cryptography.hazmat.primitives import serialization  # type: ignore[import-not-found,unused-ignore]
        from cryptography.hazmat.primitives.asymmetric import rsa  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:  # pragma: no cover - depends on the host
        raise ApiServerError(
            "need `openssl` on PATH or the python `cryptography` package to make the "
            "service-account key"
        ) from exc
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    pub_path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


class ApiServer:
    """etcd + kube-apiserver on loopback; see the module docstring."""

    def __init__(
        self,
        apiserver_bin: str | os.PathLike[str],
        etcd_bin: str | os.PathLike[str],
        *,
        authorization_mode: str = "AlwaysAllow",
        extra_users: Mapping[str, Sequence[str]] | None = None,
        extra_args: Iterable[str] = (),
        startup_timeout: float = 120.0,  # a cold v1.37 server on two busy cores
        keep_dir: bool | None = None,
        audit_policy: Mapping[str, Any] | None = None,
    ) -> None:
        if authorization_mode not in ("AlwaysAllow", "RBAC"):
            raise ValueError(
                f"authorization_mode must be AlwaysAllow or RBAC: {authorization_mode!r}"
            )
        self.apiserver_bin = str(apiserver_bin)
        self.etcd_bin = str(etcd_bin)
        self.authorization_mode = authorization_mode
        self.extra_args = list(extra_args)
        self.audit_policy = dict(audit_policy) if audit_policy is not None else None
        self.startup_timeout = startup_timeout
        self.keep_dir = (
            keep_dir if keep_dir is not None else os.environ.get("KOORD_E2E_KEEP_DIR") == "1"
        )

        self.admin_token = secrets.token_hex(16)
        self.user_token = secrets.token_hex(16)
        self.admin_user = ADMIN_USER
        self.plain_user = PLAIN_USER
        self._users: dict[str, tuple[str, tuple[str, ...]]] = {
            ADMIN_USER: (self.admin_token, ("system:masters",)),
            PLAIN_USER: (self.user_token, ()),
        }
        for name, groups in (extra_users or {}).items():
            if name in self._users:
                raise ValueError(f"user {name!r} already exists")
            self._users[name] = (secrets.token_hex(16), tuple(groups))

        self.dir: Path | None = None
        self.etcd_port = 0
        self.etcd_peer_port = 0
        self.port = 0
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ properties
    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    @property
    def etcd_log(self) -> Path:
        return self._dir / "etcd.log"

    @property
    def apiserver_log(self) -> Path:
        return self._dir / "kube-apiserver.log"

    @property
    def audit_log(self) -> Path:
        return self._dir / "audit.log"

    def audit_events(self) -> list[dict[str, Any]]:
        """The audit log's events, in file order (a torn last line is skipped)."""
        out: list[dict[str, Any]] = []
        try:
            text = self.audit_log.read_text()
        except FileNotFoundError:
            return out
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    @property
    def _dir(self) -> Path:
        if self.dir is None:
            raise ApiServerError("ApiServer not started")
        return self.dir

    def token_for(self, user: str) -> str:
        return self._users[user][0]

    @property
    def apiserver_running(self) -> bool:
        return self._apiserver is not None and self._apiserver.poll() is None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> ApiServer:
        """Start etcd and kube-apiserver and wait until ``/readyz`` answers ok."""
        with self._lock:
            if self.dir is not None:
                raise ApiServerError("ApiServer already started")
            base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # etcd fsyncs a lot
            _reap_stale_dirs(Path(base or tempfile.gettempdir()))
            self.dir = Path(tempfile.mkdtemp(prefix=_DIR_PREFIX, dir=base))
            (self.dir / "owner.pid").write_text(str(os.getpid()))
            _LIVE.add(self)
            try:
                self._prepare_files()
                self._start_etcd()
                self.port = _free_port()
                self.start_apiserver()
            except BaseException:
                self.stop()
                raise
        return self

    def stop(self) -> None:
        """Stop both processes (terminate, then kill) and remove the temp dir. Idempotent."""
        with self._lock:
            self._stop_proc("_apiserver")
            self._stop_proc("_etcd")
            if self.dir is not None:
                if self.keep_dir:
                    print(f"ApiServer: keeping {self.dir}", file=sys.stderr)
                else:
                    shutil.rmtree(self.dir, ignore_errors=True)
                self.dir = None
            _LIVE.discard(self)

    def stop_apiserver(self) -> None:
        """Take the API server away (etcd keeps running); ``start_apiserver()`` brings it back."""
        with self._lock:
            self._stop_proc("_apiserver")

    def start_apiserver(self) -> None:
        """(Re)start kube-apiserver on the same port and etcd; waits until it is ready."""
        with self._lock:
            if self.apiserver_running:
                return
            if self._etcd is None or self._etcd.poll() is not None:
                raise ApiServerError("etcd is not running:\n" + _tail(self.etcd_log))
            d = self._dir
            args = [
                self.apiserver_bin,
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--cert-dir={d / 'certs'}",
                f"--token-auth-file={d / 'tokens.csv'}",
                f"--authorization-mode={self.authorization_mode}",
                f"--service-account-key-file={d / 'sa.pub'}",
                f"--service-account-signing-key-file={d / 'sa.key'}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--endpoint-reconciler-type=none",
                "--disable-admission-plugins=ServiceAccount",
                "--allow-privileged=true",
                # No --logtostderr: stderr is the default on 1.20, and 1.26 removed the flag.
                "--v=1",
                *self._audit_args(),
                *self.extra_args,
            ]
            self._apiserver = self._spawn(args, self.apiserver_log)
            self._wait_ready()

    def restart_apiserver(self) -> None:
        with self._lock:
            self.stop_apiserver()
            self.start_apiserver()

    def __enter__(self) -> ApiServer:
        return self if self.dir is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ clients
    def kubeconfig_path(self, token: str | None = None, server: str | None = None) -> str:
        """Write (once per token and server) a kubeconfig for ``token`` (default: admin) and
        ``server`` (default: this API server's URL); return its path."""
        token = token or self.admin_token
        user = next((u for u, (t, _) in self._users.items() if t == token), "user")
        suffix = "" if server is None else "-" + server.rsplit(":", 1)[-1]
        path = self._dir / f"kubeconfig-{user.replace(':', '_')}-{token[:8]}{suffix}.json"
        if not path.exists():
            cfg = {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "koord-e2e",
                        "cluster": {"server": server or self.url, "insecure-skip-tls-verify": True},
                    }
                ],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [
                    {"name": "koord-e2e", "context": {"cluster": "koord-e2e", "user": user}}
                ],
                "current-context": "koord-e2e",
            }
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(cfg, indent=2))  # JSON is valid YAML
            tmp.replace(path)
        return str(path)

    def client_configuration(self, token: str | None = None) -> Any:
        """A ``kubernetes.client.Configuration`` for ``token`` (default: admin), no TLS verify."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.url
        cfg.verify_ssl = False
        cfg.api_key = {"authorization": token or self.admin_token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        return cfg

    # ------------------------------------------------------------------ internals
    def _prepare_files(self) -> None:
        d = self._dir
        (d / "certs").mkdir()
        (d / "etcd-data").mkdir(mode=0o700)
        lines = []
        for i, (name, (token, groups)) in enumerate(self._users.items()):
            line = f"{token},{name},uid-{i}"
            if groups:
                line += ',"' + ",".join(groups) + '"'
            lines.append(line)
        (d / "tokens.csv").write_text("\n".join(lines) + "\n")
        _gen_rsa_key(d / "sa.key", d / "sa.pub")

    def _audit_args(self) -> list[str]:
        if self.audit_policy is None:
            return []
        policy = self._dir / "audit-policy.json"
        if not policy.exists():
            policy.write_text(json.dumps(self.audit_policy))  # JSON is valid YAML
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
        ]

    def _spawn(self, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_pdeathsig_preexec(),
                cwd=self._dir,
            )

    def _start_etcd(self) -> None:
        d = self._dir
        last_err = ""
        for _attempt in range(3):  # free ports can be stolen between pick and bind
            self.etcd_port, self.etcd_peer_port = _free_port(), _free_port()
            peer = f"http://127.0.0.1:{self.etcd_peer_port}"
            self._etcd = self._spawn(
                [
                    self.etcd_bin,
                    "--name=koord-e2e",
                    f"--data-dir={d / 'etcd-data'}",
                    f"--listen-client-urls={self.etcd_url}",
                    f"--advertise-client-urls={self.etcd_url}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=koord-e2e={peer}",
                    "--initial-cluster-state=new",
                    "--logger=zap",
                    "--log-level=warn",
                ],
                self.etcd_log,
            )
            deadline = time.monotonic() + self.startup_timeout
            while time.monotonic() < deadline:
                if self._etcd.poll() is not None:
                    break
                try:
                    with urllib.request.urlopen(self.etcd_url + "/health", timeout=1) as r:
                        if json.loads(r.read()).get("health") == "true":
                            return
                except (OSError, ValueError):
                    pass
                time.sleep(0.05)
            last_err = _tail(self.etcd_log)
            self._stop_proc("_etcd")
            if "address already in use" not in last_err:
                break
            shutil.rmtree(d / "etcd-data", ignore_errors=True)
            (d / "etcd-data").mkdir(mode=0o700)
        raise ApiServerError(
            f"etcd ({self.etcd_bin}) did not become healthy; log tail:\n{last_err}"
        )

    def _wait_ready(self) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        req = urllib.request.Request(
            self.url + "/readyz", headers={"Authorization": f"Bearer {self.admin_token}"}
        )
        deadline = time.monotonic() + self.startup_timeout
        last = "no answer"
        proc = self._apiserver
        assert proc is not None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = _tail(self.apiserver_log)
                self._apiserver = None
                raise ApiServerError(
                    f"kube-apiserver exited with {proc.returncode} during startup; "
                    f"log tail:\n{tail}"
                )
            try:
                with urllib.request.urlopen(req, timeout=2, context=ctx) as r:
                    if r.status == 200:
                        return
                    last = f"HTTP {r.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except (OSError, ssl.SSLError) as exc:
                last = str(exc)
            time.sleep(0.1)
        tail = _tail(self.apiserver_log)
        self._stop_proc("_apiserver")
        raise ApiServerError(
            f"kube-apiserver not ready within {self.startup_timeout:.0f}s (last: {last}); "
            f"log tail:\n{tail}"
        )

    def _stop_proc(self, attr: str, timeout: float = 10.0) -> None:
        proc: subprocess.Popen[bytes] | None = getattr(self, attr)
        if proc is None:
            return
        setattr(self, attr, None)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=timeout)

    def __repr__(self) -> str:
        state = "running" if self.apiserver_running else "stopped"
        return f"<ApiServer {self.url} authz={self.authorization_mode} {state}>"


@atexit.register
def _stop_all() -> None:
    for srv in list(_LIVE):
        with contextlib.suppress(Exception):
            srv.stop()


# The Device CRD with an open schema, for tests that need Devices but not schema checks
# (the Debian-built 1.20 API server turns "" in custom resources into null, which the
# structural CRD of config/crd/ would then reject).
OPEN_DEVICE_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "devices.scheduling.koordinator.sh"},
    "spec": {
        "group": "scheduling.koordinator.sh",
        "scope": "Cluster",
        "names": {
            "kind": "Device",
            "plural": "devices",
            "singular": "device",
            "listKind": "DeviceList",
        },
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}
