"""What every command shares: the one-line user error, the configuration loader, the flag
value parsers (booleans, Go durations), and the read of a live cluster's objects (``inspect``
and ``explain``)."""

from __future__ import annotations

import argparse
from typing import Any

from apis.duration import DurationError, parse_go_duration_seconds
from scheduler.config import ConfigError, SchedulerConfiguration, default_config, load_config


class UserError(Exception):
    """Reported as one line on stderr with exit code 2."""


def bool_flag(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def duration_flag(text: str) -> float:
    """A Go duration (``15s``, ``500ms``, ``1m30s``) in seconds, as kube's duration flags."""
    try:
        return parse_go_duration_seconds(text)
    except DurationError:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r} (examples: 15s, 500ms, 1m30s)"
        ) from None


def load_config_or_fail(path: str | None) -> SchedulerConfiguration:
    if path is None:
        return default_config()
    try:
        return load_config(path)
    except ConfigError as exc:
        raise UserError(str(exc)) from None


def live_objects(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any], list[Any]]:
    """Nodes, Device CRs and Pods of the live cluster (``inspect`` and ``explain``)."""
    from scheduler.kube.cluster import fetch_view
    from scheduler.kube.credentials import load_credentials
    from scheduler.kube.rest import CredentialsError, KubeError, RestClient
    from scheduler.kube.transport import Urllib3Transport

    try:
        creds = load_credentials(args.kubeconfig, args.master, args.context)
    except CredentialsError as exc:
        raise UserError(str(exc)) from None
    transport = Urllib3Transport(creds, pool_size=2)
    try:
        view = fetch_view(RestClient(transport, token=creds.token))
    except KubeError as exc:
        raise UserError(f"{creds.host}: {exc}") from None
    finally:
        transport.close()
    return dict(view.nodes), list(view.devices), list(view.pods)
