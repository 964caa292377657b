"""Event handling (kube-scheduler's eventhandlers.go): cluster changes into the cache, the
queue, the nominator and the plugins' event handlers, on the scheduling thread between cycles
(the ownership rule is in ``scheduler.core.binding_cycle``).

Beyond kube's handlers, a pod's delete reaches the plugins (the device ledger) only once
nothing of ours can still hold its cards: a delete that arrives while the pod's bind is in
flight, or after a 201 its bound event has not confirmed, is *deferred* (``_deferred``) and
released once the bind's outcome — or a read-back of what holds the name now — is known
(``_release_deferred``); "unknown" keeps it held. A pod re-created under the same name (seen
as one update by a relist) is two pods: the old one leaves, the new one arrives; an assumed
pod whose name a newer incarnation holds (by resourceVersion) is released as deleted.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future

from apis.core import Pod
from apis.gpushare import capacity_cards
from scheduler.core.base import Call, log
from scheduler.core.binding_cycle import BindingCycle
from scheduler.framework.events import (
    ASSIGNED_POD_DELETE,
    POD_GROUP_KIND,
    UNHEALTHY_GPUS_KIND,
    Action,
    Change,
    ClusterEvent,
    Resource,
)

DELETED_UIDS_KEPT = 10_000
"""Deleted pod UIDs remembered for ``place`` (an extender bind arrives within seconds)."""
_NOTHING = Change("Pod")
"""``_defer_if_binding``'s answer when nothing is to be forwarded now."""


class EventHandlers(BindingCycle):
    """Applies the inbox's cluster changes (scheduling thread)."""

    def _apply(self, change: Change) -> None:
        never_sent = False
        if change.kind == "Node":
            self.cache.apply(change)
            if change.action is Action.ADD:
                self.queue.node_added(change.new)
            elif change.action is Action.UPDATE:
                self.queue.node_updated(change.old, change.new)
                if capacity_cards(change.old.capacity) != capacity_cards(change.new.capacity):
                    # gpushare's cards of a node without a Device CR: a device change
                    self.queue.device_changed(Action.UPDATE)
            else:
                self.queue.node_deleted(change.old)
        elif change.kind == "Pod":
            self._settle_read_back_held(change)
            for superseded in self._superseded_assumed(change):
                self._apply(Change("Pod", superseded, None))
            self._remember_deleted(change)
            never_sent = self._reject_if_waiting(change)
            unconfirmed = self._bound_unconfirmed(change)
            self._apply_pod(change.old, change.new)
            if unconfirmed:
                self._read_back_before_release(change.old)
        elif change.kind == "Device":
            self.queue.device_changed(change.action)
        elif change.kind == UNHEALTHY_GPUS_KIND:  # cards taken away or given back
            self.queue.device_changed(Action.UPDATE)
        elif change.kind == POD_GROUP_KIND:
            event = ClusterEvent(Resource.POD_GROUP, change.action)
            self.queue.move_all_to_active_or_backoff(event)  # gangs waiting for their PodGroup
        forward = change if never_sent else self._defer_if_binding(change)
        if forward is not _NOTHING:
            for handler in self._event_handlers:
                handler(forward)

    def _reject_if_waiting(self, change: Change) -> bool:
        """A pod deleted (or re-created) while it waits at Permit is rejected at once, as
        kube-scheduler's RejectWaitingPod on delete: its binding cycle ends now, so its
        reservation is settled without waiting for a timeout. True when the pod's wait is
        rejected: its bind will never be sent, so its delete reaches the plugins at once (a
        gang must not count a deleted member as waiting)."""
        old, new = change.old, change.new
        if old is None or (new is not None and new.uid == old.uid):
            return False
        waiting = self.waiting_pods.get(old.uid)
        if waiting is None:
            return False
        return waiting.reject("", f"pod {old.key} was deleted while waiting on Permit")

    def _superseded_assumed(self, change: Change) -> list[Pod]:
        """An assumed pod whose name a *newer* incarnation now holds: it is gone, though its
        delete may never reach us — the informer may never have seen it (a pod the extender
        read from the API server, deleted before our watch delivered it, then folded away by a
        relist). Newer by resourceVersion (etcd's revision), so a late event of an older
        incarnation never displaces a newer assumed one."""
        new = change.new
        if new is None or not new.resource_version.isdigit():
            return []
        replaced = change.old.uid if change.old is not None else ""  # _apply_pod splits that
        return [
            pod
            for pod in self.cache.assumed_named(new.key)
            if pod.uid not in (new.uid, replaced)
            and pod.resource_version.isdigit()
            and int(new.resource_version) > int(pod.resource_version)
        ]

    def _remember_deleted(self, change: Change) -> None:
        old, new = change.old, change.new
        if old is not None and (new is None or new.uid != old.uid):
            self._deleted_uids[old.uid] = None
            if len(self._deleted_uids) > DELETED_UIDS_KEPT:
                self._deleted_uids.popitem(last=False)

    def _bound_unconfirmed(self, change: Change) -> bool:
        """The delete (or same-name replacement) of a pod whose bind answered 201 while its
        bound event has not arrived yet. On an API server that binds by name (v1.20 ignores a
        Binding's UID) that 201 may have bound a same-name successor instead: its cards are
        then held by the successor, whose bound event may still be in the watch."""
        old, new = change.old, change.new
        if old is None or old.uid in self._binding or old.uid in self._deferred:
            return False
        if new is not None and new.uid == old.uid:
            return False
        return self.cache.is_assumed(old)

    def _defer_if_binding(self, change: Change) -> Change:
        """A pod whose bind is in flight, or whose 201 is not confirmed by its bound event,
        leaves the device ledger only once we know where the bind landed: an API server that
        binds by name may have put the old incarnation's allocation on a same-name successor,
        so its cards must not be handed out before that is known."""
        old, new = change.old, change.new
        if change.kind != "Pod" or old is None or (new is not None and new.uid == old.uid):
            return change
        if old.uid in self._binding:
            self._deleted_while_binding.add(old.uid)
        elif old.uid not in self._deferred:
            return change
        self._deferred[old.uid] = Change("Pod", old, None)
        return Change("Pod", None, new) if new is not None else _NOTHING

    def _read_back_before_release(self, old: Pod) -> None:
        """Find out on the worker pool what holds ``old``'s name now; its cards leave the
        ledger (``_release_deferred``) only after a bound successor's allocation reached it."""
        self._deferred[old.uid] = Change("Pod", old, None)

        def read_back() -> None:
            resolution = self._where_it_landed(old)

            def settle() -> None:
                self._in_flight -= 1
                self._release_deferred(old.uid, resolution)

            self._inbox.put(Call(settle, Future()))

        try:
            self._binder.submit(read_back)
        except RuntimeError:  # the pool is shut down (closing): keep holding the cards
            log.info("closing: the cards of a deleted pod stay held", pod=old.key)
            return
        self._in_flight += 1  # counted as a bind is: run_until_idle waits for it

    def _apply_pod(self, old: Pod | None, new: Pod | None) -> None:
        if old is not None and new is not None and old.uid != new.uid:
            # Deleted and re-created under the same name, seen as one update (a relist):
            # two pods — the old one leaves (cache or queue), the new one arrives.
            self._apply_pod(old, None)
            self._apply_pod(None, new)
            return
        was_assigned = old is not None and old.assigned
        if new is None or new.assigned or new.terminal:
            if old is not None:
                self.nominator.remove(old.uid)  # bound (anywhere) or gone: the room is free
        elif self._responsible(new) and not self.cache.is_assumed(new):
            # An assumed pod is in the cache on its node already: the echo of a nomination
            # (a preemption's, or the one written before its Permit wait) must not count it
            # there twice (kube-scheduler skips assumed pods' updates too).
            self.nominator.update(old, new)
        if new is not None and new.assigned:
            if was_assigned:
                assert old is not None
                self.cache.update_pod(old, new)
                self.queue.assigned_pod_updated(old, new)
            else:
                if old is not None:
                    self.queue.delete(old)
                self.failures.pop(new.key, None)
                self.cache.add_pod(new)
                self.queue.assigned_pod_added(new)
            return
        if was_assigned:
            assert old is not None
            self.cache.remove_pod(old)
            self.queue.assigned_pod_deleted(old)
            return
        if new is None and old is not None and self.cache.is_assumed(old):
            # Deleted while assumed — its bind may even have landed unseen (a relist folds
            # "bound" and "deleted" into one delete of the unassigned record we knew): it
            # leaves the cache, as its reservation leaves the device ledger.
            self.cache.remove_pod(old)
            self.queue.assigned_pod_deleted(old)
        # Unassigned pods: the queue's business, when one of our profiles owns them.
        if new is None or new.terminal or new.terminating or not self._responsible(new):
            if old is not None:
                self.queue.delete(old)
                self.failures.pop(old.key, None)
            return
        if old is None:
            self.queue.add(new)
        elif _spec_changed(old, new):
            self.queue.update(old, new)
        else:
            self.queue.refresh(new)  # a status write: the newest record, not moved

    def _hand_read_back_to_ledger(self, uid: str) -> None:
        read_back = self._read_back.pop(uid, None)
        if read_back is None or read_back.uid in self._deleted_uids:
            # A successor whose delete was applied since the read holds nothing any more.
            return
        self._read_back_held[read_back.key] = read_back
        change = Change("Pod", None, read_back)
        for handler in self._event_handlers:
            handler(change)  # what the cluster shows bound under that name holds its cards

    def _settle_read_back_held(self, change: Change) -> None:
        """The watch speaks of a name whose holder we learnt from a read-back: the same
        incarnation — the watch owns it from now on; another one (a relist can fold the
        holder's whole life into nothing) — the holder is gone, and so is its holding."""
        pod = change.new if change.new is not None else change.old
        held = self._read_back_held.get(pod.key) if pod is not None else None
        if pod is None or held is None:
            return
        if held.uid in {p.uid for p in (change.old, change.new) if p is not None}:
            del self._read_back_held[pod.key]
            return
        if not _newer(pod, held):
            return  # a late event of an older incarnation says nothing of the holder
        del self._read_back_held[pod.key]
        release = Change("Pod", held, None)
        for handler in self._event_handlers:
            handler(release)
        self.queue.move_all_to_active_or_backoff(ASSIGNED_POD_DELETE)

    def _release_deferred(self, uid: str, resolution: str, move: bool = True) -> None:
        """Apply a delete held back from the plugins (``_defer_if_binding``) once we know
        where the bind landed; "unknown" (stopping, the API unreadable) keeps it held."""
        self._hand_read_back_to_ledger(uid)
        deferred = self._deferred.pop(uid, None)
        if deferred is None or resolution == "unknown":
            return
        for handler in self._event_handlers:
            handler(deferred)
        if move:
            # The delete moved the waiting pods when it arrived, while the ledger still held
            # the cards; they are free only now.
            self.queue.move_all_to_active_or_backoff(ASSIGNED_POD_DELETE)


def _newer(pod: Pod, than: Pod) -> bool:
    """``pod``'s record is later than ``than``'s (resourceVersions are etcd revisions)."""
    a, b = pod.resource_version, than.resource_version
    return a.isdigit() and b.isdigit() and int(a) > int(b)


def _spec_changed(old: Pod, new: Pod) -> bool:
    """Status-only updates (our own condition writes) must not requeue the pod."""
    def spec(pod: Pod) -> Pod:
        return dataclasses.replace(
            pod, resource_version="", phase="", nominated_node_name="", start_time=""
        )

    return spec(old) != spec(new)
