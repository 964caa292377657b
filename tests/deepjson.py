"""Deeply nested Kubernetes objects as JSON text, for the tests of every decoder that reads
what the API server (or a peer) serves.

A tenant can nest ``metadata.managedFields[].fieldsV1`` at will; the API server accepts and
serves it back up to Go's 10,000 levels. ``json.dumps`` of such an object recurses past
Python's limit, so the text is written by substitution: ``with_deep_managed_fields`` puts a
chain of ``{"f:a":...}`` objects ``levels`` deep into any JSON-shaped object.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["chain", "deep_list_page", "deep_managed_fields", "with_deep_managed_fields"]

_MARKER = "__deep_fields_v1__"


def chain(levels: int) -> str:
    """``levels`` nested objects in fieldsV1's shape: ``{"f:a":{"f:a":...{}}}``."""
    return '{"f:a":' * (levels - 1) + "{}" + "}" * (levels - 1)


def deep_managed_fields(api_version: str = "v1") -> list[dict[str, Any]]:
    """A managedFields entry as written by hand (``api_version``: the object's, or the API
    server drops the entry); its ``fieldsV1`` is a marker that ``with_deep_managed_fields``
    replaces by a chain."""
    return [
        {
            "manager": "tenant",
            "operation": "Update",
            "apiVersion": api_version,
            "time": "2026-11-29T07:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": _MARKER,
        }
    ]


def with_deep_managed_fields(obj: dict[str, Any], levels: int) -> str:
    """``obj`` as JSON text with ``metadata.managedFields[0].fieldsV1`` ``levels`` deep."""
    entries = deep_managed_fields(str(obj.get("apiVersion") or "v1"))
    shallow = {**obj, "metadata": {**obj["metadata"], "managedFields": entries}}
    text = json.dumps(shallow, separators=(",", ":"))
    return text.replace(json.dumps(_MARKER), chain(levels), 1)


def deep_list_page(objects: list[str], rv: str = "10", kind: str = "List") -> bytes:
    """A list page of objects already written as JSON text."""
    meta = json.dumps({"resourceVersion": rv})
    head = '{"kind":"' + kind + '","apiVersion":"v1","metadata":' + meta + ',"items":['
    return (head + ",".join(objects) + "]}").encode()
