"""Fast YAML loading with the pure-Python loader's errors.

Role: scenarios, ``inspect``/``explain`` files and configurations are parsed with libyaml's C
parser (``yaml.CSafeLoader``, several times faster on big inputs) when PyYAML was built with
it. The values are the same (the constructor is PyYAML's Python ``SafeConstructor`` either
way, so a loader's own ``construct_mapping``, e.g. duplicate-key detection, runs unchanged).
Error messages are not: libyaml words problems and places marks differently. So on any
``YAMLError`` the text is parsed again with the pure-Python loader, and its error is the one
raised: users see exactly the messages (line, column, problem) they saw before. The slow
parse happens only for bad input.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

__all__ = ["HAVE_LIBYAML", "load_all", "load_one"]

HAVE_LIBYAML: bool = bool(getattr(yaml, "__with_libyaml__", False)) and hasattr(yaml, "CSafeLoader")

Progress = Callable[[int, int], None]
"""``(documents loaded, documents in all)``; the total counts ``---`` separators."""


def _fast(loader: type[Any], fast: type[Any] | None) -> type[Any] | None:
    """The C loader to try first: ``fast``, or ``CSafeLoader`` for the plain safe loader."""
    if not HAVE_LIBYAML:
        return None
    if fast is None and loader is yaml.SafeLoader:
        return yaml.CSafeLoader
    return fast


def _documents(text: str, loader: type[Any], progress: Progress | None) -> list[Any]:
    total = text.count("\n---") + 1 if progress is not None else 0
    reader = loader(text)
    try:
        docs: list[Any] = []
        while reader.check_data():
            docs.append(reader.get_data())
            if progress is not None:
                progress(len(docs), max(total, len(docs)))
        return docs
    finally:
        reader.dispose()


def load_all(
    text: str,
    loader: type[Any] = yaml.SafeLoader,
    fast: type[Any] | None = None,
    progress: Progress | None = None,
) -> list[Any]:
    """Every document of ``text``, as ``yaml.load_all(text, loader)`` gives them, parsed by
    the C loader when there is one (``fast``: the C twin of a ``loader`` subclass, built on
    ``yaml.CSafeLoader``); an error is the pure loader's."""
    c_loader = _fast(loader, fast)
    if c_loader is not None:
        try:
            return _documents(text, c_loader, progress)
        except yaml.YAMLError:
            pass  # reported below, in the pure loader's words
    return _documents(text, loader, progress)


def load_one(text: str, loader: type[Any] = yaml.SafeLoader, fast: type[Any] | None = None) -> Any:
    """The single document of ``text`` (``yaml.load``), C-parsed when possible."""
    c_loader = _fast(loader, fast)
    if c_loader is not None:
        try:
            return yaml.load(text, Loader=c_loader)
        except yaml.YAMLError:
            pass
    return yaml.load(text, Loader=loader)
