"""PURE: device-plugin device ids -> the card (GPU UUID) they live on.

Role: before the agent publishes the kubelet-allocated GPUs (SPEC section 8), every id is
turned into the UUID of its card, because the scheduler matches the Device CR's cards by
UUID and counts a matched card as fully used.  Device plugins name devices in several ways:

- ``GPU-<uuid>``: the card itself (NVIDIA device plugin, ``--device-id-strategy=uuid``);
- ``GPU-<uuid>::<n>``: a time-slicing replica of the card (NVIDIA device plugin sharing);
- ``MIG-<uuid>``: a MIG device, resolved through the library to its parent card;
  ``MIG-GPU-<uuid>/<gi>/<ci>`` (drivers before R470) carries the parent in its name;
- ``<index>`` or ``<index>:<mig>``: the NVML index of the card (``--device-id-strategy=index``);
- ``<GPU-uuid>-_-<j>``: a gpushare memory unit of the card.

Invariants: the result keeps the entries' order and each entry's first-seen order, without
duplicates; an id that names no card of this node is kept as it is (logged once per id) —
the scheduler ignores it, and dropping it would hide a misconfiguration.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Final

import structlog

from apis.checkpoint import PodDeviceEntry
from koordlet.devices.library import GPU

__all__ = ["CardResolver", "normalize_entries"]

log = structlog.get_logger("koordlet.deviceids")

_INDEX: Final = re.compile(r"([0-9]+)(?::[0-9]+)?")
_OLD_MIG: Final = re.compile(r"MIG-(GPU-[^/]+)/[0-9]+/[0-9]+")


class CardResolver:
    """Resolves ids against the node's cards; caches MIG answers (see the module docstring)."""

    def __init__(self, gpus: Sequence[GPU], mig_parent: Callable[[str], str | None]) -> None:
        self._uuids = {g.uuid for g in gpus}
        self._by_index = {str(g.index): g.uuid for g in gpus}
        self._mig_parent = mig_parent
        self._mig: dict[str, str] = {}
        self._warned: set[str] = set()

    def card(self, device_id: str) -> str | None:
        """The card of ``device_id``; None when it names no card of this node."""
        base = device_id.strip().split("::", 1)[0].split("-_-", 1)[0]
        if base in self._uuids:
            return base
        if base.startswith("MIG-"):
            return self._mig_card(base)
        m = _INDEX.fullmatch(base)
        if m is not None:
            return self._by_index.get(m.group(1))
        return None

    def _mig_card(self, mig: str) -> str | None:
        old = _OLD_MIG.fullmatch(mig)
        if old is not None:
            return old.group(1) if old.group(1) in self._uuids else None
        if mig not in self._mig:
            parent = self._mig_parent(mig)
            if parent is None or parent not in self._uuids:
                return None
            self._mig[mig] = parent
        return self._mig[mig]

    def normalize(self, entries: Iterable[PodDeviceEntry]) -> tuple[PodDeviceEntry, ...]:
        out: list[PodDeviceEntry] = []
        for e in entries:
            ids: dict[str, None] = {}
            for raw in e.device_ids:
                card = self.card(raw)
                if card is None:
                    if raw not in self._warned:
                        self._warned.add(raw)
                        log.warning(
                            "device id names no gpu of this node: published as is",
                            device_id=raw,
                            pod_uid=e.pod_uid,
                            resource=e.resource_name,
                        )
                    card = raw
                ids[card] = None
            out.append(replace(e, device_ids=tuple(ids)))
        return tuple(out)


def normalize_entries(
    entries: Iterable[PodDeviceEntry],
    gpus: Sequence[GPU],
    mig_parent: Callable[[str], str | None],
) -> tuple[PodDeviceEntry, ...]:
    """``entries`` with every device id replaced by its card's UUID (see the docstring)."""
    return CardResolver(gpus, mig_parent).normalize(entries)
