"""``koord-scheduler extender``: the same composition as ``run`` (``scheduler.commands.run``),
with the extender's HTTP server as its front end: the core never pops its own queue, it
answers the default kube-scheduler's filter, prioritize, bind and preempt verbs
(``scheduler.extender``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from scheduler.commands.common import UserError
from scheduler.commands.run import Served, serve_cluster


def cmd_extender(args: argparse.Namespace) -> int:
    return serve_cluster(args, front=extender_server)


def extender_server(
    args: argparse.Namespace,
    sched: Any,
    cluster: Any,
    metrics: Any,
    leading: Callable[[], bool],
) -> Served:
    """The extender's engine over ``sched`` and its server on --extender-address:port."""
    from apis.version import version
    from scheduler.extender.engine import ExtenderEngine
    from scheduler.extender.server import ExtenderServer

    profile = args.profile or next(iter(sched.profiles))
    try:
        engine = ExtenderEngine(
            sched,
            profile,
            leading=leading,
            lookup_pod=cluster.lookup_pod,
            timeout=args.bind_timeout,
        )
        return ExtenderServer(
            args.extender_address,
            args.extender_port,
            engine,
            version=version(),
            view=cluster.view,
            gpushare_unit=args.gpushare_memory_unit,
            observe=metrics.extender_request,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(
            f"cannot listen on {args.extender_address}:{args.extender_port}: {exc}"
        ) from None
