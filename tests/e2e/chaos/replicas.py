"""Scheduler replicas of the chaos tier, as a supervisor (kubelet, systemd) would run them.

Each ``Replica`` is one ``koord-scheduler run`` subprocess with leader election, its own API
user (token) and its own ``FaultProxy`` in front of the API server. Every process incarnation
gets a fresh leader-election identity ``<name>-<n>`` (kube-scheduler uses hostname + uuid), so
the audit log tells incarnations apart through the Lease and replicas apart through the user.

``Supervisor`` restarts a replica whose process has exited (after ``restart_delay``), which is
what makes "exit on lost lease" (kube-scheduler's OnStoppedLeading) a recovery and not an
outage. Signals are sent to the process only through ``Replica`` methods so that the log of
faults and the supervisor agree on what happened.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.chaos.faultproxy import FaultProxy
from tests.e2e.test_scheduler_harness import SchedulerProcess


@dataclass
class Exit:
    identity: str
    code: int | None
    at: float


@dataclass
class Replica:
    name: str  # e.g. "replica-a"
    user: str  # the API user of its token, e.g. "koord-chaos-replica-a"
    kubeconfig: str  # points at the proxy
    config: Path
    workdir: Path
    proxy: FaultProxy
    extra_args: tuple[str, ...] = ()
    incarnation: int = 0
    proc: SchedulerProcess | None = None
    stopped: bool = False  # SIGSTOPped now
    resumes: list[float] = field(default_factory=list)  # wall-clock times of each SIGCONT
    exits: list[Exit] = field(default_factory=list)
    incarnations: list[SchedulerProcess] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def identity_prefix(self) -> str:
        return f"{self.name}-"

    @property
    def identity(self) -> str:
        return f"{self.name}-{self.incarnation}"

    def start(self) -> None:
        with self.lock:
            self.incarnation += 1
            self.stopped = False
            self.proc = SchedulerProcess(
                self.kubeconfig,
                self.config,
                self.workdir,
                identity=self.identity,
                extra_args=("--log-level=info", *self.extra_args),
            ).start()
            self.incarnations.append(self.proc)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.running

    def _popen(self) -> subprocess.Popen[bytes] | None:
        return self.proc.proc if self.proc is not None else None

    def signal(self, sig: signal.Signals) -> bool:
        with self.lock:
            p = self._popen()
            if p is None or p.poll() is not None:
                return False
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(sig)
            if sig == signal.SIGSTOP:
                self.stopped = True
            elif sig in (signal.SIGCONT, signal.SIGKILL):
                if sig == signal.SIGCONT and self.stopped:
                    self.resumes.append(time.time())
                self.stopped = False
            return True

    def reap(self) -> Exit | None:
        """The exit of the current incarnation, once (None while it runs)."""
        with self.lock:
            p = self._popen()
            if p is None or p.poll() is None:
                return None
            ex = Exit(self.identity, p.returncode, time.monotonic())
            self.exits.append(ex)
            self.proc = None
            return ex

    def shutdown(self) -> None:
        with self.lock:
            p = self._popen()
            if p is not None and p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGCONT)
                    p.send_signal(signal.SIGKILL)
                p.wait(15)
            self.proc = None


class Supervisor:
    """Restarts exited replicas; ``pause()`` while the test tears down."""

    def __init__(self, replicas: list[Replica], restart_delay: float = 1.0) -> None:
        self.replicas = replicas
        self.restart_delay = restart_delay
        self.restarts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-supervisor", daemon=True)

    def start(self) -> Supervisor:
        for r in self.replicas:
            r.start()
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            for r in self.replicas:
                ex = r.reap()
                if ex is None:
                    continue
                time.sleep(self.restart_delay)
                if self._stop.is_set():
                    return
                r.start()
                self.restarts += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for r in self.replicas:
            r.shutdown()
