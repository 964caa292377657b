"""Run a scenario through the real scheduler on the in-memory cluster.

The same ``Scheduler``, the same profiles and plugins as ``koord-scheduler run``: only the
cluster (in memory) and the clock (simulated, standing still) differ. Pending pods enter the
queue in file order and each gets its attempt; a pod that fits nowhere keeps its FitError
message, since nothing in a static scenario could make it fit later.

Invariant: the same scenario, configuration and seed always give the same placements.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.config import Plugins, SchedulerConfiguration
from scheduler.core import Preemption, Scheduler
from scheduler.framework.interfaces import PluginFactory
from scheduler.observability.inspect import card_usage
from scheduler.simulator.cluster import InMemoryCluster
from scheduler.simulator.scenario import Scenario


class SimulatedClock:
    """A clock that moves only when told to (the simulator never waits)."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> None:
        self._t += seconds


@dataclass(slots=True)
class SimulationResult:
    cluster: InMemoryCluster
    pending: list[str]
    """Keys of the pods that were to be scheduled, in file order."""
    failures: dict[str, str] = field(default_factory=dict)
    """Pod key → the scheduler's message, for pods left unscheduled."""
    preemptions: list[Preemption] = field(default_factory=list)
    """Every preemption of the run, in order (the victims as they were, cards included)."""
    foreign: dict[str, str] = field(default_factory=dict)
    """Pod key → its ``spec.schedulerName``, for pending pods no profile of the configuration
    schedules (a real cluster leaves them to another scheduler): not in ``pending``."""
    profiles: tuple[str, ...] = ()
    """The configuration's scheduler names."""
    warnings: list[str] = field(default_factory=list)
    """What is odd in the input as given (a card the running pods over-commit): one line each."""

    def node_of(self, key: str) -> str:
        pod = self.cluster.pods.get(key)
        return pod.node_name if pod is not None else ""


def simulated_scheduler(
    config: SchedulerConfiguration,
    cluster: InMemoryCluster,
    registry: Mapping[str, PluginFactory],
    default_plugins: Plugins | None,
    seed: int,
) -> Scheduler:
    """The real Scheduler as every simulation runs it: a clock that stands still, a seeded
    tie-breaking generator, and one bind worker so binds complete in scheduling order."""
    return Scheduler(
        config,
        cluster,
        registry,
        default_plugins,
        clock=SimulatedClock(),
        rng=random.Random(seed),
        bind_workers=1,
    )


def run_to_rest(sched: Scheduler, clock: SimulatedClock, rounds: int = 20) -> None:
    """Schedule until idle, then let pods that are backing off retry (a preemptor waits for its
    victims' deletes, which move it to backoff): advance the clock past the longest backoff and
    go on, while any pod becomes ready. Pods left unschedulable stay where they are."""
    sched.run_until_idle()
    for _ in range(rounds):
        if not sched.queue.pending_counts().get("backoff"):
            return
        clock.advance(sched.config.pod_max_backoff_seconds)
        sched.queue.flush()
        sched.run_until_idle()


def simulate(
    scenario: Scenario,
    config: SchedulerConfiguration,
    registry: Mapping[str, PluginFactory],
    default_plugins: Plugins | None = None,
    seed: int = 0,
) -> SimulationResult:
    cluster = InMemoryCluster()
    for node in scenario.nodes:
        cluster.apply_node(node)
    for device in scenario.devices:
        cluster.apply_device(device)
    for pdb in scenario.pdbs:
        cluster.apply_pdb(pdb)
    for group in scenario.pod_groups:
        cluster.apply_pod_group(group)
    for pod in scenario.running_pods:
        cluster.apply_pod(pod)
    warnings = overcommitted_cards(cluster)
    sched = simulated_scheduler(config, cluster, registry, default_plugins, seed)
    profiles = tuple(sched.profiles)
    foreign: dict[str, str] = {}
    pending: list[str] = []
    try:
        for raw in scenario.pending_pods:
            queued = cluster.apply_pod(raw)
            if queued.scheduler_name in sched.profiles:
                pending.append(queued.key)
            else:
                foreign[queued.key] = queued.scheduler_name
        assert isinstance(sched.clock, SimulatedClock)
        run_to_rest(sched, sched.clock)
    finally:
        sched.close()
    failures = {
        key: sched.failures.get(key, "pod was not scheduled")
        for key in pending
        if key in cluster.pods and not cluster.pods[key].node_name
    }
    return SimulationResult(
        cluster, pending, failures, list(sched.preemptions), foreign, profiles, warnings
    )


def overcommitted_cards(cluster: InMemoryCluster) -> list[str]:
    """One line per card and resource that the bound pods' annotations allocate beyond the
    card's capacity. A warning, not an error: a real cluster can be in that state (a Device CR
    that shrank, pods bound by hand), and the scheduler must cope with it."""
    lines = []
    for card in card_usage(cluster.nodes, cluster.devices.values(), cluster.pods.values()):
        for resource, used in sorted(card.allocated.items()):
            total = card.capacity.get(resource, 0)
            if used > total:
                lines.append(
                    f"node {card.node} {card.device_type} {card.minor}: running pods allocate "
                    f"{resource} {used} of {total} ({', '.join(sorted(card.pods))})"
                )
    return lines
