"""The catch-up gate of a new leader (``CatchUp``): scheduling waits until the pod informer has
seen every write made before the acquisition.

Role: ``LeaderElector`` (``leader.py``) says when this replica leads; ``CatchUp`` says when a
new leader may start scheduling. ``run``'s ``ready()`` and the extender's ``leading`` ask it
(wired in ``scheduler/commands/run.py``); /readyz reports what it awaits.

Taking over (issue 23):

- A new leader's pod watch may be behind the old leader's last writes while in order (it has
  a pod's add, not its binding); scheduling from that view puts a second pod on the card the
  binding took. So each time this replica becomes leader, scheduling (``run``'s ``ready()``,
  the extender's ``leading``) waits until the pod informer has applied every event up to a
  quorum read made *after* the acquisition: a LIST of pods with ``limit=1`` and no
  ``resourceVersion`` (served from etcd, never the watch cache; a paginated list's
  ``metadata.resourceVersion`` is etcd's revision at the read) gives R. Caught up when the
  informer's last-seen version >= R compared as integers (etcd revisions; the API server's
  watch cache compares them so), or, for versions that are not numbers, equal to R; or when
  a list of the informer's that *started* after the LIST returned has been delivered. R is
  etcd's global revision, above our own Lease write, so a watch with no pod change never
  reaches it (a v1.20 watch cache sends a bookmark only 2 s before the watch's timeout, at its
  last pod event's version): after ``CATCH_UP_RELIST_AFTER`` the informer relists once. A
  failed LIST is retried with backoff, never scheduling meanwhile; /readyz (check
  ``leader-catch-up``) says what is awaited.
- That covers every write the API server had applied before our LIST, the old leader's
  last bind included. A stale-UID binding (v1.20 binds by name: a Binding for a deleted pod
  lands on its same-name successor) is one more event of that pod before R, applied like
  the others. A graceful hand-over releases the Lease only when no bind is on the wire (each
  got its answer, so it was applied or refused before the release, hence before R).
- Writes still on the wire. The deposed leader's fence stops new writes: one passes it before
  ``r + renew_deadline`` and a standby takes over at ``o + lease_duration`` (``o >= r``, see
  ``leader.py``), so at least ``lease_duration - renew_deadline`` (5 s by default) after the last
  fence pass. A fenced write is sent at once and waited for ``FENCED_WRITE_TIMEOUT`` (10 s from
  the request's start, connecting included; scheduler/kube/cluster.py). That is longer than
  the margin, so a replica that takes over an *expired* lease (``took_over_from``; a released
  one proves nothing is on the wire) makes its LIST ``in_flight_settle`` (timeout - margin,
  5 s by default) later: after the old leader's client gave up on its last write. This covers
  a write held up by the network or a slow connect for up to the timeout; it cannot cover one
  the API server received in time and applies later (the client's timeout does not bound the
  server), nor a process frozen between its fence check and the send. Kubernetes has no
  fencing token a write could carry; that residue is kube-scheduler's too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

import structlog

from scheduler.kube.ratelimit import Backoff
from scheduler.kube.rest import KubeError

__all__ = ["CATCH_UP_RELIST_AFTER", "CatchUp", "PodFeed", "in_flight_settle", "rv_reached"]

log = structlog.get_logger("koord-scheduler.leader")

CATCH_UP_RELIST_AFTER = 1.0
"""Seconds a new leader waits for its pod watch to pass the quorum LIST's resourceVersion
before it asks for a relist instead (a quiet watch never gets there: see ``CatchUp``)."""


def rv_reached(seen: str, target: str) -> bool:
    """Whether resourceVersion ``seen`` is at least ``target``. etcd-backed versions are
    integers (etcd revisions) and compared as integers, as the API server's watch cache does;
    anything else only by equality (the caller has another proof: a list started later)."""
    if seen == target:
        return True
    try:
        return int(seen) >= int(target)
    except ValueError:
        return False


def in_flight_settle(write_timeout: float, lease_duration: float, renew_deadline: float) -> float:
    """How long a new leader that took over an *expired* lease waits before its catch-up LIST,
    so that the LIST comes after the deposed leader gave up on its last write (see the module
    docstring): the write timeout less the margin the lease already guarantees."""
    return max(0.0, write_timeout - (lease_duration - renew_deadline))


class PodFeed(Protocol):
    """What ``CatchUp`` reads of the pod informer (``scheduler.kube.informer.Informer``)."""

    @property
    def resource_version(self) -> str: ...

    @property
    def lists_started(self) -> int: ...

    @property
    def list_delivered(self) -> int: ...

    def relist(self) -> None: ...


class CatchUp:
    """Each time this replica becomes leader, scheduling waits until the pod informer has
    applied every event up to a quorum read made after the acquisition (see the module
    docstring): a new leader never schedules from a view older than the old leader's last
    write.

    Per acquisition (``leading_changed(True, settle)``): after ``settle`` seconds, one quorum
    LIST (``read_rv``) gives resourceVersion R, retried with backoff while it fails; then
    ``caught_up()`` is true once the informer's last-seen version reached R (``rv_reached``)
    or a list of it that started after the LIST returned has been delivered. A quiet watch
    never reaches R (R is etcd's global revision, our own Lease write included, and a v1.20
    watch cache sends bookmarks only before a watch's timeout, at the last pod event's version),
    so after ``relist_after`` seconds the informer is asked to relist once. Once caught up, it
    stays so until leadership changes. ``step()`` does what is due (the thread of ``start()``
    calls it; tests call it on a fake clock)."""

    IDLE = 3600.0

    def __init__(
        self,
        read_rv: Callable[[], str],
        pods: PodFeed,
        *,
        clock: Callable[[], float] = time.monotonic,
        backoff: Backoff | None = None,
        relist_after: float = CATCH_UP_RELIST_AFTER,
    ) -> None:
        self._read_rv = read_rv
        self._pods = pods
        self._clock = clock
        self._backoff = backoff or Backoff(0.5, 10.0)
        self._relist_after = relist_after
        self._lock = threading.Lock()
        self._epoch = 0
        self._leading = False
        self._due = 0.0
        self._target: str | None = None
        self._mark = 0
        self._listed_at = 0.0
        self._relisted = False
        self._done = False
        self._error = ""
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lists = 0
        """Quorum LISTs attempted (failed ones included)."""

    # -- state ----------------------------------------------------------------------------------

    def leading_changed(self, leading: bool, settle: float = 0.0) -> None:
        """A leadership transition (the elector's ``on_change``): a new acquisition starts over
        with a new LIST, ``settle`` seconds from now."""
        with self._lock:
            self._epoch += 1
            self._leading = leading
            self._due = self._clock() + settle
            self._target = None
            self._relisted = self._done = False
            self._error = ""
            self._backoff.reset()
        if leading:
            log.info("leader: catching up with the cluster before scheduling", settle_s=settle)
        self._wake.set()

    def caught_up(self) -> bool:
        with self._lock:
            if not self._leading or self._target is None:
                return False
            if self._done:
                return True
            seen = self._pods.resource_version
            if not rv_reached(seen, self._target) and self._pods.list_delivered <= self._mark:
                return False
            self._done = True
            target = self._target
        log.info("leader: caught up with the cluster, scheduling", pods_rv=seen, need=target)
        return True

    def waiting(self) -> str | None:
        """Why a leader does not schedule yet (for /readyz); None when it may (or is no leader:
        the leader-election check speaks for a standby)."""
        with self._lock:
            if not self._leading:
                return None
            if self._target is None:
                left = self._due - self._clock()
                if self._error:
                    return (
                        "leader: cannot read the cluster's resourceVersion (retrying): "
                        + self._error
                    )
                if left > 0:
                    return (
                        f"leader: waiting {left:.1f}s for writes of the previous leader that "
                        "may still be on the wire (its lease expired unreleased)"
                    )
                return "leader: reading the cluster's resourceVersion"
            target = self._target
        if self.caught_up():
            return None
        return (
            f"leader: catching up with the cluster "
            f"(pods at rv {self._pods.resource_version or '-'}, need {target})"
        )

    # -- work -----------------------------------------------------------------------------------

    def step(self) -> float:
        """Do what is due; the seconds until something may be due again."""
        with self._lock:
            epoch, leading, target = self._epoch, self._leading, self._target
            due, listed_at, relisted = self._due, self._listed_at, self._relisted
        if not leading:
            return self.IDLE
        now = self._clock()
        if target is None:
            return due - now if now < due else self._list(epoch)
        if relisted or self.caught_up():
            return self.IDLE
        if now < listed_at + self._relist_after:
            return listed_at + self._relist_after - now
        with self._lock:
            if self._epoch != epoch:
                return 0.0
            self._relisted = True
        log.info("leader: the pod watch has not reached the LIST's version, relisting", need=target)
        self._pods.relist()
        return self.IDLE

    def _list(self, epoch: int) -> float:
        self.lists += 1
        try:
            rv = self._read_rv()
            if not rv:
                raise KubeError("the list carries no resourceVersion")
        except Exception as exc:  # KubeError, or anything else: retried, never scheduling
            delay = self._backoff.next()
            with self._lock:
                if self._epoch == epoch:
                    self._error = str(exc) or type(exc).__name__
                    self._due = self._clock() + delay
            log.warning(
                "leader: cannot read the cluster's resourceVersion, not scheduling yet",
                error=str(exc),
                retry_s=round(delay, 2),
            )
            return delay
        mark = self._pods.lists_started  # read after the LIST returned: later lists are fresher
        with self._lock:
            if self._epoch != epoch:
                return 0.0  # leadership changed meanwhile: start over
            self._target = rv
            self._mark = mark
            self._listed_at = self._clock()
            self._error = ""
        log.info(
            "leader: catching up with the cluster (pods watch behind the quorum LIST)",
            pods_rv=self._pods.resource_version,
            need=rv,
        )
        return 0.0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-catch-up", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before the step: a transition during it is not lost
            try:
                wait = self.step()
            except Exception:  # a bug must not end the gate: it would never open again
                log.exception("leader catch-up error")
                wait = 1.0
            if wait > 0:
                self._wake.wait(wait)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
