"""``koord-scheduler inspect``: the per-node, per-GPU allocation table of a live cluster (through
the Kubernetes adapter) or of files, as ``scheduler.observability.inspect`` accounts it."""

from __future__ import annotations

import argparse
import sys

from scheduler.commands.common import UserError, live_objects
from scheduler.observability.inspect import InspectError, load_objects, render_inspect


def cmd_inspect(args: argparse.Namespace) -> int:
    if args.file:
        try:
            nodes, devices, pods = load_objects(args.file)
        except InspectError as exc:
            raise UserError(str(exc)) from None
    else:
        nodes, devices, pods = live_objects(args)
    try:
        sys.stdout.write(render_inspect(nodes, devices, pods, args.node))
    except InspectError as exc:
        raise UserError(str(exc)) from None
    return 0
