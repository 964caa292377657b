"""``kubectl-inspect-gpushare``: the kubectl plugin gpushare users know, on koord-py's objects.

Role: a composition root like ``scheduler.cli`` (kubectl finds ``kubectl-inspect-gpushare`` on
PATH and runs it for ``kubectl inspect gpushare [-d] [NODE]``): read Nodes, Device CRs and Pods
from the live cluster (``$KUBECONFIG``, ``--kubeconfig``, in-cluster) or from files (``--file``,
as ``koord-scheduler inspect --file``), and print what gpushare's own plugin prints for them
(``scheduler.observability.gpushare_display``). ``--koord`` prints koord-py's account instead
(``inspect_gpushare``: Device CR card sizes, koordinator pods too, unreadable annotations
reported on stderr) in the same layout.

Invariants: read-only; an unknown NODE prints the original's ``Failed due to nodes "NODE" not
found`` on stdout and exits 1, as the original; any other user error (no credentials,
unreachable server, bad file) is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import quote

from apis.core import Node, Pod, decode_node
from apis.device import Device
from scheduler.observability import logs
from scheduler.observability.gpushare_display import (
    NodeInfo,
    build_node_infos,
    display_details,
    display_summary,
    koord_nodes,
    nodes_of,
)
from scheduler.observability.inspect import InspectError, load_objects
from scheduler.observability.inspect_gpushare import UNITS, gpushare_view

__all__ = ["main"]

PROG = "kubectl-inspect-gpushare"
EXIT_USAGE = 2
EXIT_FAILED = 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kubectl inspect gpushare",
        description="GPU memory allocated per node and card, as gpushare's plugin prints it.",
    )
    p.add_argument("node", nargs="?", metavar="NODE", help="only this node")
    p.add_argument("-d", "--details", action="store_true", help="list the pods on each card")
    p.add_argument(
        "--koord",
        action="store_true",
        help="koord-py's account: card sizes from Device CRs, koordinator pods counted too, "
        "unreadable annotations reported on stderr",
    )
    p.add_argument(
        "--unit", choices=tuple(UNITS), default=None, help="memory unit with --koord (GiB)"
    )
    p.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig file (default $KUBECONFIG)")
    p.add_argument("--context", metavar="NAME", help="kubeconfig context")
    p.add_argument("--server", "--master", dest="master", metavar="URL", help="API server")
    p.add_argument(
        "--file", "-f", action="append", metavar="FILE", help="read objects from YAML/JSON files"
    )
    return p


class _NodeNotFound(Exception):
    pass


def _objects(args: argparse.Namespace) -> tuple[list[Node], list[Device], list[Pod]]:
    """The nodes to show (all, or NODE: ``_NodeNotFound`` when it does not exist), the Device
    CRs (``--koord`` only) and the pods."""
    if args.file:
        by_name, devices, pods = load_objects(args.file)
        nodes = list(by_name.values())
    else:
        nodes, devices, pods = _fetch(args)
    if args.node:
        nodes = [n for n in nodes if n.name == args.node]
        if not nodes:
            raise _NodeNotFound(args.node)
    return nodes, devices, pods


def _fetch(args: argparse.Namespace) -> tuple[list[Node], list[Device], list[Pod]]:
    """One read of the cluster: with NODE, that node and its pods only (a field selector, as
    the original: large clusters need not send every pod); Device CRs only for ``--koord``,
    none when their CRD is not installed (a gpushare cluster)."""
    from scheduler.kube.cluster import NODES_PATH, device_spec, node_spec, pod_spec
    from scheduler.kube.credentials import load_credentials
    from scheduler.kube.informer import ResourceSpec, list_objects
    from scheduler.kube.rest import ApiError, KubeError, RestClient
    from scheduler.kube.transport import Urllib3Transport

    def listed(spec: ResourceSpec) -> list[Any]:
        out = []
        for obj in list_objects(rest, spec)[1]:
            try:
                out.append(spec.decode(obj))
            except Exception as exc:  # shown, never fatal: inspect is for broken clusters too
                print(f"{PROG}: warning: undecodable {spec.kind} skipped: {exc}", file=sys.stderr)
        return out

    creds = load_credentials(args.kubeconfig, args.master, args.context)
    transport = Urllib3Transport(creds, pool_size=2)
    rest = RestClient(transport, token=creds.token)
    pods = pod_spec(full=True)
    try:
        if args.node:
            try:
                path = f"{NODES_PATH}/{quote(args.node, safe='')}"
                nodes = [decode_node(rest.request("GET", path))]
            except ApiError as exc:
                if exc.status == 404:
                    raise _NodeNotFound(args.node) from None
                raise
            pods = replace(pods, field_selector=f"{pods.field_selector},spec.nodeName={args.node}")
        else:
            nodes = listed(node_spec())
        devices = []
        if args.koord:
            try:
                devices = listed(device_spec())
            except ApiError as exc:
                if exc.status != 404:
                    raise
        return nodes, devices, listed(pods)
    except KubeError as exc:
        raise InspectError(f"{creds.host}: {exc}") from None
    finally:
        transport.close()


def _infos(
    args: argparse.Namespace, nodes: list[Node], devices: list[Device], pods: list[Pod]
) -> tuple[list[NodeInfo], str]:
    problems: list[str] = []
    if args.koord:
        unit = args.unit or "GiB"
        view, problems = gpushare_view(nodes, devices, pods, unit)
        infos = koord_nodes(view, problems)
    else:
        infos, unit = build_node_infos(nodes if args.node else nodes_of(nodes), pods, problems)
    for problem in problems:
        print(f"{PROG}: warning: {problem}", file=sys.stderr)
    return infos, unit


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.unit and not args.koord:
        parser.error("--unit applies to --koord only (gpushare's own units are shown as they are)")
    logs.configure("console", "warning", stdlib=False)
    from scheduler.kube.rest import CredentialsError

    try:
        nodes, devices, pods = _objects(args)
    except _NodeNotFound:
        print(f'Failed due to nodes "{args.node}" not found')  # the original's words
        return EXIT_FAILED
    except (InspectError, CredentialsError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    infos, unit = _infos(args, nodes, devices, pods)
    text = display_details(infos) if args.details else display_summary(infos, unit)
    try:
        sys.stdout.write(text)
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
