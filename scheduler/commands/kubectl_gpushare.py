"""``kubectl-inspect-gpushare``: the kubectl plugin gpushare users know, on koord-py's objects.

Role: a composition root like ``scheduler.cli`` (kubectl finds ``kubectl-inspect-gpushare`` on
PATH and runs it for ``kubectl inspect gpushare [-d]``): read Nodes, Device CRs and Pods from the
live cluster (``$KUBECONFIG``, ``--kubeconfig``, in-cluster) or from files (``--file``, as
``koord-scheduler inspect --file``), and print ``scheduler.observability.inspect_gpushare``'s table.

Invariants: read-only; a user error (no credentials, unreachable server, bad file) is one line on
stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from apis.core import Node, Pod
from apis.device import Device
from scheduler.observability import logs
from scheduler.observability.inspect import InspectError, load_objects
from scheduler.observability.inspect_gpushare import UNITS, gpushare_view, render_gpushare

__all__ = ["main"]

PROG = "kubectl-inspect-gpushare"
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kubectl inspect gpushare",
        description="GPU memory allocated per node and card (gpushare pods and koordinator pods).",
    )
    p.add_argument("-d", "--details", action="store_true", help="list the pods on each card")
    p.add_argument("--unit", choices=tuple(UNITS), default="GiB", help="memory unit (GiB)")
    p.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig file (default $KUBECONFIG)")
    p.add_argument("--context", metavar="NAME", help="kubeconfig context")
    p.add_argument("--server", "--master", dest="master", metavar="URL", help="API server")
    p.add_argument(
        "--file", "-f", action="append", metavar="FILE", help="read objects from YAML/JSON files"
    )
    return p


def _objects(args: argparse.Namespace) -> tuple[list[Node], list[Device], list[Pod]]:
    if args.file:
        nodes, devices, pods = load_objects(args.file)
        return list(nodes.values()), devices, pods
    from scheduler.kube.cluster import fetch_view
    from scheduler.kube.rest import KubeError, RestClient, Urllib3Transport, load_credentials

    creds = load_credentials(args.kubeconfig, args.master, args.context)
    transport = Urllib3Transport(creds, pool_size=2)
    try:
        view = fetch_view(RestClient(transport, token=creds.token))
    except KubeError as exc:
        raise InspectError(f"{creds.host}: {exc}") from None
    finally:
        transport.close()
    return list(view.nodes.values()), list(view.devices), list(view.pods)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure("console", "warning", stdlib=False)
    from scheduler.kube.rest import CredentialsError

    try:
        nodes, devices, pods = _objects(args)
    except (InspectError, CredentialsError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    view, problems = gpushare_view(nodes, devices, pods, args.unit)
    try:
        sys.stdout.write(render_gpushare(view, problems, details=args.details, unit=args.unit))
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
