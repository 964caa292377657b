"""``koord-scheduler explain NAMESPACE/POD``: the objects of a live cluster (or of files) fed to a
scheduler built like the simulator's, and the pod explained from that scheduler's own state."""

from __future__ import annotations

import argparse
import sys

from scheduler.commands.common import UserError, live_objects, load_config_or_fail
from scheduler.framework.runtime import FrameworkError
from scheduler.observability.inspect import InspectError, load_objects
from scheduler.plugins.registry import default_plugins, in_tree_registry


def cmd_explain(args: argparse.Namespace) -> int:
    """Load the objects (files or the live cluster), feed them to a Scheduler built like the
    simulator's, and explain the pod from that scheduler's own state."""
    from scheduler.observability.explain import explain, render_table, to_json
    from scheduler.simulator.cluster import InMemoryCluster
    from scheduler.simulator.run import simulated_scheduler

    namespace, sep, name = args.pod.partition("/")
    if not sep or not namespace or not name:
        raise UserError(f"expected NAMESPACE/POD, got {args.pod!r}")
    if args.file:
        try:
            nodes, devices, pods = load_objects(args.file)
        except InspectError as exc:
            raise UserError(str(exc)) from None
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
