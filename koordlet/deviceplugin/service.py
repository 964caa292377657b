"""Composition-root glue: gpushare's device plugin as a service of ``koordlet run``.

Role: turn the agent's cards (inventory + health tracker) into the plugin's ``Card`` list,
start/stop the device-plugin server with the agent, and keep the node's ``aliyun.com/gpu-count``
capacity equal to the number of cards (as gpushare's plugin does; the resource is informative,
pods never request it). The gRPC modules are imported in ``start()``, so that building the
service (and ``koordlet report``) never loads grpc.

Invariants: cards are read through callables at every poll, so health changes reach the
kubelet within the plugin's poll period; a failed capacity patch is logged and retried at the
next change of cards, never fatal.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import structlog

from koordlet.deviceplugin.gpushare import RESOURCE_GPU_COUNT, Card, MemoryUnit
from koordlet.devices.library import GPU, Health

__all__ = ["CapacityPatcher", "GPUShareService", "cards_of"]

log = structlog.get_logger("koordlet.deviceplugin")


class CapacityPatcher(Protocol):
    def patch_node_status(
        self,
        name: str,
        capacity: Mapping[str, str | None],
        allocatable: Mapping[str, str | None],
    ) -> None: ...


def cards_of(gpus: Sequence[GPU], health: Mapping[str, Health]) -> list[Card]:
    """The plugin's cards: every discovered GPU, healthy unless the tracker says otherwise."""
    return [
        Card(
            index=g.minor,
            uuid=g.uuid,
            memory_bytes=g.memory_total,
            healthy=health[g.uuid].healthy if g.uuid in health else True,
            numa_node=g.numa_node,
        )
        for g in gpus
    ]


class GPUShareService:
    """``start()``/``stop()`` the plugin server; see the module."""

    def __init__(
        self,
        *,
        node_name: str,
        cards: Callable[[], list[Card]],
        pods: Any,
        api: CapacityPatcher,
        plugin_dir: str | os.PathLike[str],
        unit: MemoryUnit,
        on_allocate: Callable[[str], None] = lambda result: None,
    ) -> None:
        self.node_name = node_name
        self._cards = cards
        self._pods = pods
        self._api = api
        self.plugin_dir = plugin_dir
        self.unit = unit
        self._on_allocate = on_allocate
        self._server: Any = None
        self._count: int | None = None

    def _patch_count(self, cards: Sequence[Card]) -> None:
        if len(cards) == self._count:
            return
        try:
            self._api.patch_node_status(self.node_name, {RESOURCE_GPU_COUNT: str(len(cards))}, {})
        except Exception as exc:
            log.error("patching aliyun.com/gpu-count failed", error=str(exc))
            return
        self._count = len(cards)

    def start(self) -> None:
        from koordlet.deviceplugin.server import DevicePluginServer, GPUSharePlugin

        plugin = GPUSharePlugin(
            self.node_name, self._pods, self.unit, on_allocate=self._on_allocate
        )
        self._server = DevicePluginServer(
            plugin, self._cards, self.plugin_dir, on_cards=self._patch_count
        )
        self._server.start()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()
