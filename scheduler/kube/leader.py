"""Leader election on a ``coordination.k8s.io/v1`` Lease, client-go's algorithm.

Role: only one replica schedules. ``LeaderElector.try_acquire_or_renew`` is one attempt of
client-go's ``tryAcquireOrRenew``: read the Lease; take it when it is absent, ours, or held by
someone who has not renewed it for ``leaseDurationSeconds`` *as observed on our own clock*
(the time we last saw the record change, never the other side's timestamps); write it back
with the resourceVersion read, so two candidates cannot both win. The thread (``start``)
retries every ``retry_period`` (jittered while standing by).

Invariants:

- ``leading`` is true only while the last successful renewal is younger than
  ``renew_deadline`` on our monotonic clock, counted from *before* the renewal's GET (the
  earliest moment the write can have happened), checked at every read: a leader whose API
  calls hang stops scheduling at the deadline even before its thread notices.
- A rival's record is dated when our GET *returned* (``observedTime``), never when it was
  sent: the write we see happened before the answer arrived, however slow the call. So for
  a leader renewing at ``r`` (start of its attempt) and a standby whose GET returned at
  ``o >= r``, the leader believes it leads until ``r + renew_deadline`` and the standby may
  take over from ``o + lease_duration > r + renew_deadline``: the two never both believe they
  lead, however long the Lease calls take (clock rates assumed sane). Dating the observation
  from before the GET breaks this as soon as a GET takes longer than
  ``lease_duration - renew_deadline``.
- ``standby_healthy`` is true while the Lease could be read within the last lease duration.
- ``stop(release=True)`` gives the Lease up (empty holder, 1 s duration) when we hold it, so a
  rolling restart hands over at once instead of after a lease duration.
- Times written are ``metav1.MicroTime`` in UTC; the clock and the store are injected (tests
  use a fake clock and an in-memory store).

Taking over (``CatchUp``; issue 23):

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
  above), so at least ``lease_duration - renew_deadline`` (5 s by default) after the last
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

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from scheduler.kube.ratelimit import Backoff
from scheduler.kube.rest import ApiError, KubeError, RestClient, path_segment

__all__ = [
    "CATCH_UP_RELIST_AFTER",
    "CatchUp",
    "KubeLeaseStore",
    "LeaderElector",
    "LeaseConflict",
    "LeaseRecord",
    "LeaseStore",
    "PodFeed",
    "in_flight_settle",
    "micro_time",
    "rv_reached",
]

log = structlog.get_logger("koord-scheduler.leader")


def micro_time(moment: datetime) -> str:
    """``metav1.MicroTime`` text: ``2006-01-02T15:04:05.000000Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    holder: str = ""
    lease_duration: int = 15
    acquire_time: str = ""
    renew_time: str = ""
    transitions: int = 0


class LeaseConflict(Exception):
    """Someone else wrote the Lease first (409), or created it first."""


class LeaseStore(Protocol):
    def get(self) -> tuple[LeaseRecord, str] | None:
        """The record and its resourceVersion; None when the Lease does not exist."""
        ...

    def create(self, record: LeaseRecord) -> str:
        """Create the Lease; its resourceVersion. ``LeaseConflict`` when it exists."""
        ...

    def update(self, record: LeaseRecord, resource_version: str) -> str:
        """Replace the Lease if still at ``resource_version``; else ``LeaseConflict``."""
        ...


class KubeLeaseStore:
    """A Lease on the API server."""

    def __init__(self, rest: RestClient, namespace: str, name: str, timeout: float) -> None:
        self._rest = rest
        self.namespace = namespace
        self.name = name
        self._timeout = timeout
        self._base = f"/apis/coordination.k8s.io/v1/namespaces/{path_segment(namespace)}/leases"

    def _body(self, record: LeaseRecord, rv: str = "") -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if rv:
            meta["resourceVersion"] = rv
        spec: dict[str, Any] = {
            "holderIdentity": record.holder,
            "leaseDurationSeconds": record.lease_duration,
            "leaseTransitions": record.transitions,
        }
        if record.acquire_time:
            spec["acquireTime"] = record.acquire_time
        if record.renew_time:
            spec["renewTime"] = record.renew_time
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    def get(self) -> tuple[LeaseRecord, str] | None:
        try:
            doc = self._rest.request(
                "GET", f"{self._base}/{path_segment(self.name)}", timeout=self._timeout
            )
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        spec = doc.get("spec") or {}
        record = LeaseRecord(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=str(spec.get("acquireTime") or ""),
            renew_time=str(spec.get("renewTime") or ""),
            transitions=int(spec.get("leaseTransitions") or 0),
        )
        return record, str((doc.get("metadata") or {}).get("resourceVersion") or "")

    def create(self, record: LeaseRecord) -> str:
        try:
            doc = self._rest.request(
                "POST", self._base, body=self._body(record), timeout=self._timeout
            )
        except ApiError as exc:
            if exc.status == 409:
                raise LeaseConflict(str(exc)) from exc
            raise
        return str((doc.get("metadata") or {}).get("resourceVersion") or "")

    def update(self, record: LeaseRecord, resource_version: str) -> str:
        try:
            doc = self._rest.request(
                "PUT",
                f"{self._base}/{path_segment(self.name)}",
                body=self._body(record, resource_version),
                timeout=self._timeout,
            )
        except ApiError as exc:
            if exc.status == 409:
                raise LeaseConflict(str(exc)) from exc
            raise
        return str((doc.get("metadata") or {}).get("resourceVersion") or "")


class LeaderElector:
    """client-go's LeaderElector (see the module docstring)."""

    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        rng: random.Random | None = None,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if not lease_duration > renew_deadline > retry_period > 0:
            raise ValueError("need lease_duration > renew_deadline > retry_period > 0")
        self.store = store
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._clock = clock
        self._wall = wall
        self._rng = rng or random.Random()
        self._on_change = on_change
        self._observed: LeaseRecord | None = None
        self._observed_rv = ""
        self._observed_at = 0.0
        self._renewed_at: float | None = None
        self._last_read_at: float | None = None
        self._was_leading = False
        self.took_over_from = ""
        """The holder named by the record our latest acquisition replaced: "" when the Lease
        was new or released (a release is sent only with no bind on the wire), else a holder
        whose lease expired, whose writes may still be on the wire (see ``in_flight_settle``)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.transitions_seen = 0

    # -- state ----------------------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        renewed = self._renewed_at
        return renewed is not None and self._clock() - renewed < self.renew_deadline

    @property
    def holder(self) -> str:
        return self._observed.holder if self._observed is not None else ""

    @property
    def standby_healthy(self) -> bool:
        read = self._last_read_at
        return read is not None and self._clock() - read < self.lease_duration

    # -- one attempt ----------------------------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """One attempt to take or keep the Lease; True when we hold it afterwards."""
        now = self._clock()
        was_leading = self.leading
        stamp = micro_time(self._wall())
        mine = LeaseRecord(
            holder=self.identity,
            lease_duration=max(1, round(self.lease_duration)),
            acquire_time=stamp,
            renew_time=stamp,
        )
        try:
            got = self.store.get()
        except KubeError as exc:
            log.debug("lease read failed", error=str(exc))
            return False
        # The observation is dated when the GET *returned* (client-go's observedTime): the
        # record may have been written at any moment during the call, so only the end of the
        # call is a time at which we know it had been written already.
        observed = self._clock()
        self._last_read_at = observed
        if got is None:
            try:
                rv = self.store.create(mine)
            except (LeaseConflict, KubeError) as exc:
                log.debug("lease create failed", error=str(exc))
                return False
            self._observe(mine, rv, now)
            self.took_over_from = ""
            self._renewed_at = now
            return True
        current, rv = got
        if current != self._observed:
            self._observe(current, rv, observed)
        self._observed_rv = rv
        held_by_other = bool(current.holder) and current.holder != self.identity
        duration = current.lease_duration or self.lease_duration
        if held_by_other and self._observed_at + duration > self._clock():
            return False
        if current.holder == self.identity:
            mine = replace(
                mine, acquire_time=current.acquire_time or stamp, transitions=current.transitions
            )
        else:
            mine = replace(mine, transitions=current.transitions + 1)
        try:
            new_rv = self.store.update(mine, rv)
        except (LeaseConflict, KubeError) as exc:
            log.debug("lease update failed", error=str(exc))
            return False
        self._observe(mine, new_rv, now)
        if current.holder != self.identity:
            self.took_over_from = current.holder
        elif not was_leading:
            self.took_over_from = ""  # our own record, untouched while we lapsed
        self._renewed_at = now
        return True

    def _observe(self, record: LeaseRecord, rv: str, now: float) -> None:
        if self._observed is not None and record.holder != self._observed.holder:
            self.transitions_seen += 1
        self._observed = record
        self._observed_rv = rv
        self._observed_at = now

    def release(self) -> bool:
        """Give the Lease up if we hold it (empty holder, 1 s duration)."""
        if self._observed is None or self._observed.holder != self.identity:
            return False
        self._renewed_at = None
        stamp = micro_time(self._wall())
        record = LeaseRecord(
            holder="",
            lease_duration=1,
            acquire_time=stamp,
            renew_time=stamp,
            transitions=self._observed.transitions,
        )
        try:
            self.store.update(record, self._observed_rv)
        except (LeaseConflict, KubeError) as exc:
            log.warning("lease release failed", error=str(exc))
            return False
        log.info("lease released", identity=self.identity)
        return True

    # -- the thread -----------------------------------------------------------------------------

    def _notify(self) -> None:
        leading = self.leading
        if leading == self._was_leading:
            return
        self._was_leading = leading
        if leading:
            log.info("became leader", identity=self.identity)
        else:
            log.warning("lost leadership: scheduling stops", identity=self.identity)
        if self._on_change is not None:
            self._on_change(leading)

    def step(self) -> float:
        """One iteration of the loop; returns how long to wait before the next."""
        self.try_acquire_or_renew()
        self._notify()
        if self.leading:
            return self.retry_period
        return self.retry_period * (1.0 + 0.2 * self._rng.random())

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-elector", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        log.info("leader election started", identity=self.identity)
        while not self._stop.is_set():
            wait = self.step()
            # Wake in time to notice a missed renew deadline even while waiting.
            renewed = self._renewed_at
            if renewed is not None:
                left = renewed + self.renew_deadline - self._clock()
                if left > 0:
                    wait = min(wait, left + 0.01)
            self._stop.wait(wait)
            self._notify()

    def stop(self, release: bool = True, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if release:
            self.release()
        self._notify()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


# -- catching up after an acquisition -----------------------------------------------------------

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
