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

Taking over: a new leader schedules only once it has caught up with the cluster; that gate
(``CatchUp``) is ``scheduler/kube/catchup.py``.
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

from scheduler.kube.rest import ApiError, KubeError, RestClient, path_segment

__all__ = [
    "KubeLeaseStore",
    "LeaderElector",
    "LeaseConflict",
    "LeaseRecord",
    "LeaseStore",
    "micro_time",
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
