"""JSON from peers, decoded at any depth a Go server accepts: ``loads``.

Role: the one JSON decoder for what the API server, the kubelet, kube-scheduler (extender
calls) and the API server's admission requests send us. CPython's ``json`` recurses once per
nested object or array and raises ``RecursionError`` (not a ``ValueError``) at about 1,000
levels, the interpreter's recursion limit, while Go's decoders (encoding/json,
json-iterator, sigs.k8s.io/json) accept 10,000: a tenant's Pod whose
``metadata.managedFields[].fieldsV1`` nests 1,500 levels is accepted and served back by the
API server, and plain ``json.loads`` of a list page holding it fails, on every relist.

Mechanism: ``json.loads`` first (no cost for ordinary input); only when it runs out of
recursion does ``_decode_deep`` parse the text again with an explicit stack. That decoder
hands every scalar, and every container that fits the C scanner's recursion budget, to
json's own C scanner (``scan_once``), and descends level by level itself only along the
paths where the C scanner ran out. Along one deep path, failed C tries are spaced out
(``_window``: every level for the first few, then every 2, 4, ... up to 64 levels), so a
10,000-deep chain costs a few hundred failed tries, not 10,000, and siblings of the deep
path (the other pods of a list page) are still decoded in C.

Invariants:

- ``loads`` returns exactly what ``json.loads`` returns wherever ``json.loads`` succeeds
  (same types, values, key order, duplicate-key rule, NaN/Infinity literals).
- It decodes every document nested at most ``MAX_DEPTH`` levels; deeper input raises
  ``JSONDecodeDepthError``; anything else that is not JSON raises ``json.JSONDecodeError``
  (or ``UnicodeDecodeError`` for bytes that are not text). Every error is a ``ValueError``:
  no ``RecursionError`` leaves this module, and the interpreter's recursion limit is never
  changed.
- The decoded value may be deeply nested: code that walks it recursively (``json.dumps``,
  ``copy.deepcopy``, ``==``, ``repr``) can still hit the recursion limit. The adapters
  therefore drop ``metadata.managedFields`` (``apis.core.drop_managed_fields``), the only
  field of the objects we read where a tenant can nest at will, right after decoding.

Measured (``python -m bench.jsonload --repeat 7``, CPU ms, best of 7; 2-vCPU development VM,
CPython 3.11.7, 2026-11-29; the table: docs/failure-model.md, "Deep, huge and malformed
objects"): a page of 500 served pods 17.8 (``json.loads``) vs 17.7 (``loads``); one pod with
fieldsV1 1,500 deep 3.7, 9,990 deep 40; a page of 500 pods holding one 1,500-deep pod 42.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Final

__all__ = ["MAX_DEPTH", "JSONDecodeDepthError", "loads", "nesting_depth"]

GO_MAX_DEPTH: Final = 10_000
"""encoding/json's ``maxNestingDepth`` (json-iterator's and sigs.k8s.io/json's too): the
deepest object the API server decodes, counted from the object it decodes."""

MAX_DEPTH: Final = GO_MAX_DEPTH + 100
"""The deepest document ``loads`` decodes. Go's limit counts from the object the API server
decoded; what we read wraps such an object in envelopes (a list page: 2 levels, a watch
event: 1, an AdmissionReview: 2, an extender call: 1), and structured-merge-diff decodes
``fieldsV1`` from its own root (a Pod written as protobuf: 4 levels above it). 100 levels
of headroom cover every envelope we read. Measured on kube-apiserver v1.20.2: a Pod written
as JSON is accepted up to 10,000 levels (fieldsV1 9,996) and its list page is 10,002 deep,
which a limit of exactly 10,000 would refuse (tests/e2e/test_deep_objects.py)."""


class JSONDecodeDepthError(json.JSONDecodeError):
    """The document nests deeper than ``MAX_DEPTH`` (a ``ValueError``)."""


# json's C scanner and string reader (untyped in typeshed): value and end index at an index
_SCAN: Final[Callable[[str, int], tuple[Any, int]]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_SCANSTRING: Final[Callable[[str, int, bool], tuple[str, int]]] = json.decoder.scanstring  # type: ignore[attr-defined]
_WHITESPACE: Final = re.compile(r"[ \t\n\r]*")


def _skip(text: str, idx: int) -> int:
    """The index of the first non-whitespace character at or after ``idx``."""
    return _WHITESPACE.match(text, idx).end()  # type: ignore[union-attr]  # matches ""


def loads(data: str | bytes | bytearray) -> Any:
    """``json.loads(data)``, also for documents nested up to ``MAX_DEPTH`` levels (see the
    module docstring); raises only ``ValueError`` (``JSONDecodeDepthError`` when deeper)."""
    try:
        return json.loads(data)
    except RecursionError:
        pass
    text = (
        data
        if isinstance(data, str)
        else bytes(data).decode(json.detect_encoding(data), "surrogatepass")
    )
    return _decode_deep(text)


def nesting_depth(value: Any) -> int:
    """How many containers (dicts, lists) ``value`` nests: 0 for a scalar, 1 for ``[]``.
    Iterative, so it measures values deeper than the recursion limit."""
    if not isinstance(value, dict | list):
        return 0
    best = 0
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        node, level = todo.pop()
        best = max(best, level)
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                todo.append((child, level + 1))
    return best


def _window(failures: int) -> int:
    """After ``failures`` failed C tries along one path, the number of levels to descend
    before the next try: 1 for the first four (a list page's envelope, its deep item, that
    item's metadata), then doubling up to 64."""
    return min(1 << max(0, failures - 4), 64)


def _expecting(message: str, text: str, idx: int) -> json.JSONDecodeError:
    return json.JSONDecodeError(message, text, idx)


def _too_deep(text: str, idx: int) -> JSONDecodeDepthError:
    return JSONDecodeDepthError(f"nested deeper than {MAX_DEPTH} levels", text, idx)


def _key(text: str, idx: int) -> tuple[str, int]:
    """The object key starting at ``idx`` (after a ``{`` or ``,`` and whitespace), and the
    index of its value (after the ``:`` and whitespace)."""
    if text[idx : idx + 1] != '"':
        raise _expecting("Expecting property name enclosed in double quotes", text, idx)
    key, idx = _SCANSTRING(text, idx + 1, True)
    idx = _skip(text, idx)
    if text[idx : idx + 1] != ":":
        raise _expecting("Expecting ':' delimiter", text, idx)
    return key, _skip(text, idx + 1)


def _decode_deep(text: str) -> Any:
    """``json.loads(text)`` without recursion (see the module docstring)."""
    if text.startswith("\ufeff"):
        raise _expecting("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    # Open containers, innermost last; for each: the key its next value goes under (objects),
    # and the try gate of its parent (restored when it closes).
    stack: list[dict[str, Any] | list[Any]] = []
    keys: list[str] = []
    saved: list[tuple[int, int]] = []
    # C tries of containers happen at depths >= gate; failures counts them along this path.
    # The root already failed in json.loads.
    failures = 1
    gate = _window(failures)
    idx = _skip(text, 0)
    while True:
        # -- one value at idx, at depth len(stack) ----------------------------------------------
        depth = len(stack)
        char = text[idx : idx + 1]
        value: Any
        if char == "{" or char == "[":
            done = False
            if depth >= gate:
                try:
                    value, end = _SCAN(text, idx)
                except RecursionError:
                    saved.append((gate, failures))
                    failures += 1
                    gate = depth + _window(failures)
                except (StopIteration, json.JSONDecodeError) as err:
                    at = err.value if isinstance(err, StopIteration) else err.pos
                    if at - idx <= MAX_DEPTH - depth:
                        raise _expecting(getattr(err, "msg", "Expecting value"), text, at) from None
                    # Enough text before the error to pass MAX_DEPTH first, which is the
                    # error a left-to-right reader (Go's) sees: descend and find out.
                    saved.append((gate, failures))
                    failures += 1
                    gate = depth + _window(failures)
                else:
                    # a subtree the C scanner decoded nests at most (end - idx) / 2 levels
                    if end - idx > 2 * (MAX_DEPTH - depth) and (
                        depth + nesting_depth(value) > MAX_DEPTH
                    ):
                        raise _too_deep(text, idx)
                    idx = end
                    done = True
            else:
                saved.append((gate, failures))
            if not done:
                if depth + 1 > MAX_DEPTH:
                    raise _too_deep(text, idx)
                idx = _skip(text, idx + 1)
                if char == "{":
                    if text[idx : idx + 1] != "}":
                        key, idx = _key(text, idx)
                        stack.append({})
                        keys.append(key)
                        continue
                    value = {}
                else:
                    if text[idx : idx + 1] != "]":
                        stack.append([])
                        keys.append("")
                        continue
                    value = []
                idx += 1
                gate, failures = saved.pop()
        else:
            try:
                value, idx = _SCAN(text, idx)
            except StopIteration as err:
                raise _expecting("Expecting value", text, err.value) from None
        # -- value complete: store it, then read separators and closers -------------------------
        while True:
            if not stack:
                end = _skip(text, idx)
                if end != len(text):
                    raise _expecting("Extra data", text, end)
                return value
            top = stack[-1]
            if isinstance(top, dict):
                top[keys[-1]] = value
            else:
                top.append(value)
            idx = _skip(text, idx)
            char = text[idx : idx + 1]
            if char == ",":
                idx = _skip(text, idx + 1)
                if isinstance(top, dict):
                    keys[-1], idx = _key(text, idx)
                break  # the next value of the same container
            if char == ("}" if isinstance(top, dict) else "]"):
                idx += 1
                value = stack.pop()
                keys.pop()
                gate, failures = saved.pop()
                continue  # the closed container is a value of its parent
            raise _expecting("Expecting ',' delimiter", text, idx)
