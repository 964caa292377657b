"""NodeAffinity's pluginConfig args: kube's ``NodeAffinityArgs`` (``addedAffinity``).

Role: ``parse_args`` decodes and strictly validates the args at profile build time; a bad
field is one ``PluginArgsError`` line naming it (``addedAffinity.<path>``), so a scheduler
never starts with an enforced affinity it would silently ignore.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from apis.core import DecodeError, decode_pod
from apis.core import NodeAffinity as NodeAffinitySpec
from scheduler.framework.interfaces import PluginArgsError
from scheduler.plugins.nodeaffinity.selector import NodeSelector, Preferred

__all__ = ["NodeAffinityArgs", "parse_args"]


@dataclass(frozen=True, slots=True)
class NodeAffinityArgs:
    added_affinity: NodeAffinitySpec | None = None


_ARG_KEYS = frozenset({"addedAffinity"})
_AFFINITY_KEYS = frozenset(
    {
        "requiredDuringSchedulingIgnoredDuringExecution",
        "preferredDuringSchedulingIgnoredDuringExecution",
    }
)


def parse_args(args: Mapping[str, Any]) -> NodeAffinityArgs:
    """kube's NodeAffinityArgs: ``addedAffinity`` (a v1 NodeAffinity), strictly validated."""
    unknown = sorted(set(args) - _ARG_KEYS)
    if unknown:
        raise PluginArgsError(f"NodeAffinity args: unknown field(s) {', '.join(unknown)}")
    added = args.get("addedAffinity")
    if added is None:
        return NodeAffinityArgs()
    if not isinstance(added, Mapping):
        raise PluginArgsError(
            f"NodeAffinity args: addedAffinity: expected a mapping, got {added!r}"
        )
    unknown = sorted(set(added) - _AFFINITY_KEYS)
    if unknown:
        raise PluginArgsError(
            f"NodeAffinity args: addedAffinity: unknown field(s) {', '.join(unknown)}"
        )
    prefix = "spec.affinity.nodeAffinity"
    try:
        pod = decode_pod(
            {"metadata": {"name": "args"}, "spec": {"affinity": {"nodeAffinity": added}}}
        )
    except DecodeError as exc:
        path = exc.path.replace(prefix, "addedAffinity", 1)
        raise PluginArgsError(f"NodeAffinity args: {path}: {exc.problem}") from None
    spec = pod.node_affinity
    if spec is None:
        return NodeAffinityArgs()
    problems: list[str] = []
    if spec.required is not None:
        problems += NodeSelector.compile(spec.required).errors
    problems += Preferred.compile(spec.preferred).errors
    if problems:
        raise PluginArgsError(f"NodeAffinity args: addedAffinity: {'; '.join(problems)}")
    return NodeAffinityArgs(added_affinity=spec)


