"""A running extender core on the in-memory cluster: a Scheduler whose thread only answers
(``ready`` is False, as in ``koord-scheduler extender``), GPU nodes with Device CRs."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from scheduler.cluster import Cluster
from scheduler.config import default_config, parse_config
from scheduler.core import Scheduler
from scheduler.extender.engine import ExtenderEngine
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.cluster import InMemoryCluster
from tests.builders import make_node

PROFILE = "koord-scheduler"


def device_obj(node: str, memories: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": node},
        "spec": {
            "devices": [
                {
                    "type": "gpu",
                    "id": f"GPU-{node}-{m}",
                    "minor": m,
                    "health": True,
                    "resources": {
                        "koordinator.sh/gpu-core": "100",
                        "koordinator.sh/gpu-memory": mem,
                        "koordinator.sh/gpu-memory-ratio": "100",
                    },
                }
                for m, mem in enumerate(memories)
            ]
        },
    }


def gpu_cluster(cards: dict[str, list[str]]) -> InMemoryCluster:
    cluster = InMemoryCluster()
    for name, memories in cards.items():
        units = sum(int(m.removesuffix("Gi")) for m in memories)
        cluster.apply_node(  # aliyun.com/gpu-mem: what gpushare's device plugin advertises
            make_node(name)
            .cpu("64")
            .memory("256Gi")
            .gpu_resources(len(memories), "40Gi")
            .resource("aliyun.com/gpu-mem", units)
            .obj()
        )
        cluster.apply_device(device_obj(name, memories))
    return cluster


@dataclass
class Running:
    cluster: InMemoryCluster
    sched: Scheduler
    engine: ExtenderEngine
    leading: list[bool] = field(default_factory=lambda: [True])


@contextmanager
def running(
    cluster: InMemoryCluster,
    scoring: str | None = None,
    timeout: float = 30.0,
    port: Cluster | None = None,
) -> Iterator[Running]:
    """The core over ``cluster``, or over ``port`` (e.g. an ``AdversarialCluster`` whose truth
    is ``cluster``: a lagging informer, a v1.20 API server) when given."""
    via: Cluster = port if port is not None else cluster
    if scoring is None:
        config = default_config()
    else:
        config = parse_config(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "profiles": [
                    {
                        "schedulerName": PROFILE,
                        "pluginConfig": [
                            {
                                "name": "DeviceShare",
                                "args": {"scoringStrategy": {"type": scoring}},
                            }
                        ],
                    }
                ],
            }
        )
    sched = Scheduler(
        config,
        via,
        in_tree_registry(),
        default_plugins(),
        rng=random.Random(0),
        bind_workers=8,
    )
    leading = [True]
    engine = ExtenderEngine(
        sched,
        PROFILE,
        leading=lambda: leading[0],
        lookup_pod=via.lookup_pod,
        timeout=timeout,
    )
    stop = threading.Event()
    thread = threading.Thread(target=sched.run, args=(stop, lambda: False), daemon=True)
    thread.start()
    try:
        yield Running(cluster, sched, engine, leading)
    finally:
        stop.set()
        thread.join(timeout=10)
        sched.close()
