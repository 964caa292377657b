"""Decoded JSON from outside, named in one-line error messages and kept, bounded.

Role: decoders say what they refuse (``got [0]``) and keep fields they do not know (Device
CRs, topology links: written back as read). The value came from a peer: nested up to 10,000
levels (``apis.jsonload`` decodes what a Go server accepts) or megabytes long. ``json.dumps``,
``repr`` and ``copy.deepcopy`` recurse once per level and raise ``RecursionError`` (no
``ValueError``) on such a value, and a megabyte of it floods a log line.

Invariants: ``show`` never recurses, looks at no more than ``MAX_SHOWN_NODES`` nodes (a YAML
value may share subtrees: "billion laughs") and returns at most ``MAX_SHOWN_CHARS`` characters
plus an ellipsis: the value as ``json.dumps`` prints it when it is that small and nests at
most ``MAX_SHOWN_DEPTH`` levels, else its kind (and depth). ``too_deep`` says whether a value
nests past ``MAX_KEPT_DEPTH`` levels, the most a decoder keeps of a field it does not read
(deep copy, dump and compare stay within the recursion limit wherever the caller stands).
"""

from __future__ import annotations

import json
from typing import Final

from apis.jsonload import nesting_depth
from apis.topology import json_kind as _kind

__all__ = [
    "MAX_KEPT_DEPTH",
    "MAX_SHOWN_CHARS",
    "MAX_SHOWN_DEPTH",
    "MAX_SHOWN_NODES",
    "show",
    "too_deep",
]

MAX_SHOWN_DEPTH: Final = 20
MAX_SHOWN_CHARS: Final = 200
MAX_SHOWN_NODES: Final = 1_000
MAX_KEPT_DEPTH: Final = 100


def _shape(v: object) -> tuple[int, int] | None:
    """(nesting depth, nodes) of ``v``, or None past ``MAX_SHOWN_NODES`` nodes: iterative and
    bounded, so a value that shares subtrees (YAML aliases) costs no more than its cap."""
    depth, nodes = 0, 0
    todo: list[tuple[object, int]] = [(v, 1)]
    while todo:
        node, level = todo.pop()
        nodes += 1
        if nodes > MAX_SHOWN_NODES:
            return None
        if isinstance(node, dict | list | tuple):
            depth = max(depth, level)
            children = node.values() if isinstance(node, dict) else node
            todo.extend((child, level + 1) for child in children)
    return depth, nodes


def show(v: object) -> str:
    """``v`` for an error message (see the module docstring)."""
    shape = _shape(v)
    if shape is None:
        return f"a large {_kind(v)}"
    if shape[0] > MAX_SHOWN_DEPTH:
        return f"an {_kind(v)} nested {shape[0]} levels"
    try:
        text = json.dumps(v, ensure_ascii=False)
    except (TypeError, ValueError):  # not JSON, or an int past str()'s digit limit
        try:
            text = repr(v)
        except ValueError:
            return f"a {_kind(v)}"
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS] + "..."


def too_deep(v: object) -> bool:
    """Whether ``v`` nests more than ``MAX_KEPT_DEPTH`` levels."""
    return nesting_depth(v) > MAX_KEPT_DEPTH
