"""``koord-scheduler inspect``: the per-node, per-GPU allocation table of a live cluster (through
the Kubernetes adapter) or of files, as ``scheduler.observability.inspect`` accounts it."""

from __future__ import annotations

import argparse
import json
import sys

import yaml

from scheduler.commands.common import UserError, live_objects
from scheduler.observability.inspect import (
    InspectError,
    inspect_document,
    load_objects,
    render_inspect,
)


def cmd_inspect(args: argparse.Namespace) -> int:
    if args.file:
        try:
            nodes, devices, pods = load_objects(args.file)
        except InspectError as exc:
            raise UserError(str(exc)) from None
    else:
        nodes, devices, pods = live_objects(args)
    try:
        if args.output == "json":
            doc = inspect_document(nodes, devices, pods, args.node)
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        elif args.output == "yaml":
            doc = inspect_document(nodes, devices, pods, args.node)
            sys.stdout.write(yaml.safe_dump(doc, sort_keys=False))
        else:
            sys.stdout.write(render_inspect(nodes, devices, pods, args.node))
    except InspectError as exc:
        raise UserError(str(exc)) from None
    return 0
