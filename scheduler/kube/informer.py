"""One informer: list + watch of one resource, decoded into our records, fed to subscribers.

Role: client-go's reflector + indexer + shared informer, for one resource (Nodes, Pods or
Device CRs), in one thread. It lists (in pages), delivers the result as changes, then watches
from the list's resourceVersion; when a watch ends normally it resumes from the last
resourceVersion it saw (bookmarks included); on ``410 Gone`` it relists at once, and on any
other error it waits (jittered exponential backoff) and relists. A relist is diffed against the
store: new objects are adds, changed ones (another resourceVersion) updates, and objects that
vanished get a synthesised delete carrying their last known state.

Invariants:

- The store and the subscriber list change only under ``_lock``, and every change is delivered
  to every subscriber under that lock, in the order the store saw it: ``subscribe`` hands over
  the current state as adds and then exactly the later changes, never one twice or out of order.
- ``synced`` becomes true after the first complete list has been delivered and stays true;
  ``healthy`` is false from a failed request until the next list or watch is established.
- One object never blocks a list or a watch. An object that does not decode (its decoder
  raises anything) is *quarantined*: treated as absent (an update that does not decode
  deletes the last good state), counted (``decode_errors``, every time), and named in one
  warning line (kind, namespace/name, reason) when it enters quarantine, not on every relist
  or event; it leaves quarantine (one info line) when it decodes again, is deleted, or is
  missing from a list. ``quarantined()`` is what is held now (the metrics' gauge). Objects
  nested deeper than ``json.loads`` can go are decoded (``scheduler.kube.rest``); objects the
  spec does not ``accept`` are absent too, silently.
- A collection with ``alternatives`` (``policy/v1`` PDBs, else ``policy/v1beta1``) is listed
  at the first path that does not answer 404; any other error (5xx, a timeout, a refused
  connection) is retried on the same path with backoff, so a failed call never makes it
  settle on a version the server does not serve. Only when every path answered 404 is the
  resource not served.
- An ``optional`` resource (a CRD the cluster may not have) answered 404 is *absent*: the
  informer counts as synced and healthy with an empty store, logs one line (once per absence),
  and lists again every ``absent_retry`` seconds, so a CRD installed later is picked up.
- Namespaced objects are keyed ``namespace/name`` (the decoders' keys), cluster-scoped ones by
  name, for deletes as for adds.
- ``start()`` starts the one thread and ``stop()`` ends it (closing a blocked watch stream).
- ``relist()`` closes the watch and lists afresh (a new leader's catch-up gate asks for it when
  a quiet watch cannot prove it has reached a given resourceVersion). Lists are numbered as
  they start (``lists_started``); ``list_delivered`` is the number of the latest list whose
  result has been delivered, so "a list that started after moment M has been applied" is
  ``list_delivered > lists_started`` read at M.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import structlog

from apis.core import drop_managed_fields
from scheduler.cluster import ChangeHandler
from scheduler.framework.events import Change
from scheduler.kube.ratelimit import Backoff
from scheduler.kube.rest import ApiError, KubeError, RestClient, WatchStream

__all__ = ["Informer", "ResourceSpec", "list_objects", "wait_all"]

log = structlog.get_logger("koord-scheduler.informer")

ABSENT_RETRY = 10.0
"""Seconds between lists of an optional resource that is not served: a CRD installed later
(koordlet's Device CRD, during a move from gpushare) is picked up this soon; the price is
one 404 per interval."""

Record = Any
Decoder = Callable[[Mapping[str, Any]], Record]


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    """What to list and watch and how to turn an object into a record."""

    kind: str
    """The ``Change.kind``: "Node", "Pod" or "Device"."""
    path: str
    """The collection's path, e.g. ``/api/v1/nodes``."""
    decode: Decoder
    key: Callable[[Record], str]
    version: Callable[[Record], str]
    field_selector: str = ""
    missing_hint: str = ""
    """Appended to the error when the collection answers 404 (e.g. a CRD not installed)."""
    optional: bool = False
    """A 404 means "not installed": synced, healthy and empty (see the module docstring)."""
    alternatives: tuple[str, ...] = ()
    """Other paths of the same collection (older API versions), tried in order when ``path``
    answers 404: the version served is found by listing it, never guessed from a failed call."""
    accept: Callable[[Mapping[str, Any]], bool] | None = None
    """Which objects of the collection are ours (``unhealthy-gpu-*`` of the ConfigMaps): the
    others are not decoded, stored or delivered (no field selector matches a name prefix)."""


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): relist."""


def _meta_rv(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return rv if isinstance(rv, str) else ""  # a server's string; str() of a value may recurse


class Informer:
    """List + watch of one resource in one thread (see the module docstring)."""

    def __init__(
        self,
        rest: RestClient,
        spec: ResourceSpec,
        *,
        page_size: int = 500,
        watch_timeout: tuple[int, int] = (300, 600),
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        absent_retry: float = ABSENT_RETRY,
    ) -> None:
        self.rest = rest
        self.spec = spec
        self.kind = spec.kind
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._rng = rng or random.Random()
        self._backoff = backoff or Backoff(0.5, 10.0, rng=self._rng)
        self._lock = threading.RLock()
        self._store: dict[str, Record] = {}
        self._handlers: list[ChangeHandler] = []
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stream: WatchStream | None = None
        self._rv = ""
        self.healthy = False
        self.last_error = "not started"
        self.decode_errors = 0
        self._quarantine: dict[str, str] = {}
        """Objects that do not decode, by key: the reason (see the module docstring)."""
        self._listed_bad: set[str] | None = None
        """Keys quarantined during the list in progress (None between lists)."""
        self.relists = 0
        self.lists_started = 0
        """Lists begun (numbered as they start; see ``list_delivered``)."""
        self.list_delivered = 0
        """The number of the latest list whose result was delivered to the subscribers."""
        self._relist = threading.Event()
        self._absent_retry = absent_retry
        self._paths = (spec.path, *spec.alternatives)
        self._not_found: set[str] = set()
        self.absent = False
        """True while an optional resource is not served (404)."""

    # -- reading --------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def wait_for_sync(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    @property
    def resource_version(self) -> str:
        return self._rv

    def items(self) -> list[Record]:
        with self._lock:
            return list(self._store.values())

    def get(self, key: str) -> Record | None:
        with self._lock:
            return self._store.get(key)

    def quarantined(self) -> dict[str, str]:
        """The objects quarantined now (they do not decode), by key: the reason."""
        with self._lock:
            return dict(self._quarantine)

    def subscribe(self, handler: ChangeHandler) -> None:
        """The current objects as adds, then every later change (see the invariants)."""
        with self._lock:
            for record in self._store.values():
                handler(Change(self.kind, None, record))
            self._handlers.append(handler)

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.kind} informer already started")
        self._thread = threading.Thread(
            target=self._run, name=f"informer-{self.kind.lower()}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.close()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def relist(self) -> None:
        """List afresh now instead of waiting on the watch (see the module docstring)."""
        self._relist.set()  # set before the stream is read: ``_watch`` checks it after opening
        stream = self._stream
        if stream is not None:
            stream.close()

    # -- the loop -------------------------------------------------------------------------------

    def _run(self) -> None:
        need_list = True
        gone_in_a_row = 0
        while not self._stop.is_set():
            try:
                if need_list or self._relist.is_set():
                    self._relist.clear()
                    self._list_and_replace()
                    need_list = False
                started = time.monotonic()
                self._watch()
                gone_in_a_row = 0
                if self._relist.is_set():
                    continue  # ended by relist(): list at once
                if time.monotonic() - started < 1.0:  # a server that ends watches at once
                    self._stop.wait(self._backoff.next())
            except _Gone:
                log.info("watch expired, relisting", resource=self.kind, rv=self._rv)
                need_list = True
                gone_in_a_row += 1
                if gone_in_a_row > 1:  # a fresh list's version already too old: do not spin
                    self._stop.wait(self._backoff.next())
            except ApiError as exc:
                if self._stop.is_set():
                    return
                if exc.status == 404 and self._next_path():
                    need_list = True
                    continue
                if exc.status == 404 and self.spec.optional:
                    self._not_served(exc)
                    need_list = True
                    self._stop.wait(self._absent_retry)
                    continue
                self._failed(exc)
                need_list = True
                self._stop.wait(self._backoff.next())
            except KubeError as exc:
                if self._stop.is_set():
                    return
                self._failed(exc)
                need_list = True
                self._stop.wait(self._backoff.next())
            except Exception as exc:  # a bug must not end the informer for good
                if self._stop.is_set():
                    return
                log.exception("informer error", resource=self.kind)
                self._failed(exc)
                need_list = True
                self._stop.wait(self._backoff.next())

    def _next_path(self) -> bool:
        """After a 404: move to the next of the collection's paths not yet answered 404 in
        this round (True), or start the round again from the first path (False)."""
        paths = self._paths
        self._not_found.add(self.spec.path)
        untried = [p for p in paths if p not in self._not_found]
        if untried:
            log.info(
                "not served, trying another version",
                resource=self.kind,
                path=self.spec.path,
                next=untried[0],
            )
            self.spec = replace(self.spec, path=untried[0])
            return True
        self._not_found.clear()
        self.spec = replace(self.spec, path=paths[0])
        return False

    def _not_served(self, exc: ApiError) -> None:
        """An optional resource answered 404: empty, synced, healthy; said once."""
        if not self.absent:
            log.warning(
                "resource not served, working without it",
                resource=self.kind,
                path=self.spec.path,
                hint=self.spec.missing_hint,
                error=str(exc),
            )
        self.absent = True
        self._replace({})
        self.healthy = True
        self.last_error = ""
        if not self._synced.is_set():
            self._synced.set()

    def _failed(self, exc: BaseException) -> None:
        message = str(exc) or type(exc).__name__
        if isinstance(exc, ApiError) and exc.status == 404 and self.spec.missing_hint:
            message = f"{message} ({self.spec.missing_hint})"
        if self.healthy or message != self.last_error:
            log.warning("list/watch failed", resource=self.kind, error=message)
        self.healthy = False
        self.last_error = message

    def _query(self) -> dict[str, str]:
        query: dict[str, str] = {}
        if self.spec.field_selector:
            query["fieldSelector"] = self.spec.field_selector
        return query

    def _list_and_replace(self) -> None:
        self.lists_started += 1
        number = self.lists_started
        records: dict[str, Record] = {}

        def keep(obj: Mapping[str, Any]) -> None:
            record = self._decode(obj)
            if record is not None:
                records[self.spec.key(record)] = record

        self._listed_bad = set()
        try:
            rv, _ = list_objects(self.rest, self.spec, self._page_size, each=keep)
            for key in [k for k in self._quarantine if k not in self._listed_bad]:
                self._release(key, "not listed any more")
        finally:
            self._listed_bad = None
        self._replace(records)
        self._rv = rv
        self._not_found.clear()
        self.list_delivered = number
        self.relists += 1
        if self.absent:
            log.info("resource served again", resource=self.kind, path=self.spec.path)
            self.absent = False
        self.healthy = True
        self.last_error = ""
        self._backoff.reset()
        if not self._synced.is_set():
            log.info("synced", resource=self.kind, objects=len(records), rv=rv)
            self._synced.set()

    def _watch(self) -> None:
        low, high = self._watch_timeout
        seconds = self._rng.randint(low, high) if high > low else low
        query = self._query()
        query.update(
            watch="1",
            resourceVersion=self._rv,
            allowWatchBookmarks="true",
            timeoutSeconds=str(seconds),
        )
        try:
            stream = self.rest.watch(self.spec.path, query, read_timeout=seconds + 30.0)
        except ApiError as exc:
            if exc.status == 410:
                raise _Gone() from exc
            raise
        self._stream = stream
        try:
            if self._stop.is_set() or self._relist.is_set():
                return
            self.healthy = True
            self.last_error = ""
            for etype, obj in stream:
                if self._stop.is_set() or self._relist.is_set():
                    return
                self._handle(etype, obj)
                self._backoff.reset()
        finally:
            self._stream = None
            stream.close()

    def _handle(self, etype: str, obj: Mapping[str, Any]) -> None:
        if etype == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise _Gone()
            reason, message = obj.get("reason"), obj.get("message")
            raise ApiError(  # a Status's strings; anything else (str() may recurse) unread
                int(code) if isinstance(code, int) else 500,
                reason if isinstance(reason, str) else "",
                message if isinstance(message, str) and message else "watch error",
            )
        rv = _meta_rv(obj)
        if etype == "BOOKMARK":
            if rv:
                self._rv = rv
            return
        if etype in ("ADDED", "MODIFIED"):
            record = self._decode(obj)
            if record is None:
                key = self._raw_key(obj)
                if key:
                    self._delete(key)
            else:
                self._upsert(record)
        elif etype == "DELETED":
            key = self._raw_key(obj)
            if key:
                self._release(key, "deleted")
                self._delete(key)
        else:
            log.warning("unknown watch event", resource=self.kind, type=etype)
        if rv:
            self._rv = rv

    # -- the store ------------------------------------------------------------------------------

    def _decode(self, obj: Mapping[str, Any]) -> Record | None:
        # Server-side apply bookkeeping: often the largest part of an object, read by no one
        # here, kept for every pod in ``raw``, and nested at will by a tenant. RestClient
        # already drops it; objects handed in by other means too.
        drop_managed_fields(obj)
        if self.spec.accept is not None and not self.spec.accept(obj):
            return None
        try:
            record = self.spec.decode(obj)
        except Exception as exc:  # DecodeError, DeviceDecodeError, RecursionError, anything
            self._hold(self._raw_key(obj), str(exc) or type(exc).__name__)
            return None
        if self._quarantine:  # the key only when something is held (the LIST hot path)
            self._release(self._raw_key(obj), "decodes again")
        return record

    def _hold(self, key: str, reason: str) -> None:
        """Quarantine ``key``: counted every time, said once (see the module docstring)."""
        self.decode_errors += 1
        if self._listed_bad is not None:
            self._listed_bad.add(key)
        with self._lock:
            new = key not in self._quarantine
            self._quarantine[key] = reason
        if new:
            log.warning(
                "object quarantined: it does not decode, treated as absent",
                resource=self.kind,
                object=key,
                error=reason,
            )

    def _release(self, key: str, why: str) -> None:
        if key not in self._quarantine:
            return
        with self._lock:
            self._quarantine.pop(key, None)
        log.info("object left quarantine", resource=self.kind, object=key, why=why)

    def _raw_key(self, obj: Mapping[str, Any]) -> str:
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping):
            return ""
        # strings as the server writes them; anything else is no key (formatting it may recurse)
        name, namespace = meta.get("name"), meta.get("namespace")
        name = name if isinstance(name, str) else ""
        namespace = namespace if isinstance(namespace, str) else ""
        if self.kind == "Pod":
            return f"{namespace or 'default'}/{name}"
        if namespace:
            return f"{namespace}/{name}"
        return name

    def _emit(self, change: Change) -> None:
        for handler in self._handlers:
            handler(change)

    def _upsert(self, record: Record) -> None:
        key = self.spec.key(record)
        with self._lock:
            old = self._store.get(key)
            self._store[key] = record
            self._emit(Change(self.kind, old, record))

    def _delete(self, key: str) -> None:
        with self._lock:
            old = self._store.pop(key, None)
            if old is not None:
                self._emit(Change(self.kind, old, None))

    def _replace(self, records: dict[str, Record]) -> None:
        version = self.spec.version
        with self._lock:
            for key in [k for k in self._store if k not in records]:
                self._emit(Change(self.kind, self._store.pop(key), None))
            for key, record in records.items():
                old = self._store.get(key)
                if old is not None and version(old) == version(record):
                    continue
                self._store[key] = record
                self._emit(Change(self.kind, old, record))


def list_objects(
    rest: RestClient,
    spec: ResourceSpec,
    page_size: int = 500,
    each: Callable[[Mapping[str, Any]], None] | None = None,
) -> tuple[str, list[Mapping[str, Any]]]:
    """A complete list of ``spec``'s collection, in pages: (resourceVersion, raw objects).

    With ``each``, every object is handed to it as its page arrives and none is kept (the
    returned list is empty): a 50,000-pod list then never holds more than one page of raw
    JSON objects at a time."""
    objects: list[Mapping[str, Any]] = []
    cont = ""
    while True:
        query: dict[str, str] = {"limit": str(page_size)}
        if spec.field_selector:
            query["fieldSelector"] = spec.field_selector
        if cont:
            query["continue"] = cont
        page = rest.request("GET", spec.path, query=query)
        items = [o for o in page.get("items") or () if isinstance(o, Mapping)]
        if each is None:
            objects.extend(items)
        else:
            for obj in items:
                each(obj)
        meta = page.get("metadata") or {}
        cont = str(meta.get("continue") or "")
        if not cont:
            return str(meta.get("resourceVersion") or ""), objects


def wait_all(informers: list[Informer], timeout: float | None) -> bool:
    """True once every informer synced (within ``timeout`` seconds overall)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for informer in informers:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not informer.wait_for_sync(left):
            return False
    return True
