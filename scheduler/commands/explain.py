"""``koord-scheduler explain NAMESPACE/POD``: the objects of a live cluster (or of files) fed to a
scheduler built like the simulator's, and the pod explained from that scheduler's own state."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from apis.core import Node, Pod, decode_node, decode_pod
from apis.device import Device
from scheduler.commands.common import UserError, live_objects, load_config_or_fail
from scheduler.framework.runtime import FrameworkError
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.scenario import ScenarioError, load_scenario

Objects = tuple[
    dict[str, Node], list[Device], list[Pod], list[dict[str, Any]], list[dict[str, Any]]
]


def _scenario_objects(paths: Sequence[str]) -> Objects:
    """Every file read as a scenario; an object of a later file replaces the earlier one of the
    same kind and name (``--file scenario.yaml --file result.yaml`` explains the result)."""
    nodes: dict[str, Node] = {}
    devices: dict[str, Device] = {}
    pods: dict[str, Pod] = {}
    pdbs: dict[tuple[str, str], dict[str, Any]] = {}
    groups: dict[tuple[str, str], dict[str, Any]] = {}

    def key(obj: dict[str, Any]) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return str(meta.get("namespace") or "default"), str(meta.get("name"))

    for path in paths:
        try:
            scenario = load_scenario(path)
        except ScenarioError as exc:
            raise UserError(str(exc)) from None
        for raw in scenario.nodes:
            node = decode_node(raw)
            nodes[node.name] = node
        for raw in scenario.devices:
            device = Device.from_dict(raw)
            devices[device.name] = device
        for raw in scenario.pods:
            pod = decode_pod(raw)
            pods[pod.key] = pod
        pdbs.update((key(raw), raw) for raw in scenario.pdbs)
        groups.update((key(raw), raw) for raw in scenario.pod_groups)
    return (
        nodes,
        list(devices.values()),
        list(pods.values()),
        list(pdbs.values()),
        list(groups.values()),
    )


def cmd_explain(args: argparse.Namespace) -> int:
    """Load the objects (files or the live cluster), feed them to a Scheduler built like the
    simulator's, and explain the pod from that scheduler's own state."""
    from scheduler.observability.explain import explain, render_table, to_json
    from scheduler.simulator.cluster import InMemoryCluster
    from scheduler.simulator.run import simulated_scheduler

    namespace, sep, name = args.pod.partition("/")
    if not sep or not namespace or not name:
        raise UserError(f"expected NAMESPACE/POD, got {args.pod!r}")
    pdbs: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    if args.file:
        # The simulator's loader: the API server's checks, PriorityClasses resolved into the
        # pods' priorities, PodDisruptionBudgets and PodGroups kept (what `simulate` sees).
        nodes, devices, pods, pdbs, groups = _scenario_objects(args.file)
    else:
        nodes, devices, pods = live_objects(args)
    target = next((p for p in pods if p.key == args.pod), None)
    if target is None:
        raise UserError(f"pod {args.pod} not found")
    if target.node_name:
        raise UserError(f"pod {args.pod} is already bound to node {target.node_name}")
    config = load_config_or_fail(args.config)
    cluster = InMemoryCluster()
    for node in nodes.values():
        cluster.apply_node(node.raw)
    for device in devices:
        cluster.apply_device(device.to_dict())
    for pdb in pdbs:
        cluster.apply_pdb(pdb)
    for group in groups:
        cluster.apply_pod_group(group)
    for pod in pods:
        cluster.apply_pod(pod.raw)
    try:
        sched = simulated_scheduler(config, cluster, in_tree_registry(), default_plugins(), 0)
    except FrameworkError as exc:
        raise UserError(f"{args.config or 'default configuration'}: {exc}") from None
    try:
        sched.drain()
        pod = cluster.pods[args.pod]
        try:
            answer = explain(sched, sched.cache.snapshot, pod, nodes, devices, pods)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    finally:
        sched.close()
    sys.stdout.write(to_json(answer) if args.output == "json" else render_table(answer))
    return 0
