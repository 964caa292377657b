"""Fast YAML loading with the pure-Python loader's errors.

Role: scenarios, ``inspect``/``explain`` files and configurations are parsed with libyaml's C
parser (``yaml.CSafeLoader``, several times faster on big inputs) when PyYAML was built with
it. The values are the same (the constructor is PyYAML's Python ``SafeConstructor`` either
way, so a loader's own ``construct_mapping``, e.g. duplicate-key detection, runs unchanged).
Error messages are not: libyaml words problems and places marks differently. So on any
``YAMLError`` the text is parsed again with the pure-Python loader, and its error is the one
raised: users see exactly the messages (line, column, problem) they saw before. The slow
parse happens only for bad input.

Nesting is bounded: a document nested deeper than ``MAX_DEPTH`` collections is refused with
a ``yaml.MarkedYAMLError`` at the first collection past the limit, before any loader composes
it. Both composers recurse once per level: PyYAML's pure one until ``RecursionError`` (about
400 levels), libyaml's (PyYAML <= 6.0.3) in C until the stack runs out and the process dies
with SIGSEGV (about 30,000 levels of ``[``, a 60 kB file). The check (``check_depth``) reads
the parser's events only, libyaml's when present (about 30 % of a C load's time), never
composes, and counts an alias as the one node it is, so anchors and aliases ("billion
laughs") cost here what their text costs; what a caller does with a shared subtree is its own
bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import yaml
from yaml.events import (
    MappingEndEvent,
    MappingStartEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)

__all__ = ["HAVE_LIBYAML", "MAX_DEPTH", "check_depth", "load_all", "load_one"]

HAVE_LIBYAML: bool = bool(getattr(yaml, "__with_libyaml__", False)) and hasattr(yaml, "CSafeLoader")

MAX_DEPTH: Final = 100
"""The deepest nesting of collections accepted. Kubernetes objects, scheduler configurations
and fake-GPU files nest a dozen levels; the pure composer still has head-room for 100 under
the interpreter's default recursion limit, however deep the caller's own stack is."""

Progress = Callable[[int, int], None]
"""``(documents loaded, documents in all)``; the total counts ``---`` separators."""


def _fast(loader: type[Any], fast: type[Any] | None) -> type[Any] | None:
    """The C loader to try first: ``fast``, or ``CSafeLoader`` for the plain safe loader."""
    if not HAVE_LIBYAML:
        return None
    if fast is None and loader is yaml.SafeLoader:
        return yaml.CSafeLoader
    return fast


def check_depth(text: str) -> None:
    """Raise ``yaml.MarkedYAMLError`` if ``text`` nests collections deeper than ``MAX_DEPTH``.
    A syntax error before that point ends the check quietly: the loader reports it. libyaml
    may stop at a syntax error it finds while reading ahead (PyYAML 6.0.4's own limit of
    1,000 flow levels among them), before the parser has passed the limit; the pure parser
    (a state machine: no recursion) then reads the events up to that error."""
    if HAVE_LIBYAML and _depth_ok(yaml.CBaseLoader(text)):
        return
    _depth_ok(yaml.BaseLoader(text))


_OPENS: Final = (SequenceStartEvent, MappingStartEvent)
_CLOSES: Final = (SequenceEndEvent, MappingEndEvent)


def _depth_ok(parser: Any) -> bool:
    """True when the document parses without passing ``MAX_DEPTH``; False at a syntax error
    (nesting up to there within the limit); raises past the limit. (A tight loop: the scan
    runs on every load, about 30 % of a C load's time.)"""
    get = parser.get_event
    depth = 0
    try:
        while True:
            event = get()
            kind = type(event)
            if kind in _OPENS:
                depth += 1
                if depth > MAX_DEPTH:
                    mark: Any = event.start_mark  # libyaml's Mark or PyYAML's: same fields
                    raise yaml.composer.ComposerError(
                        None, None, f"nested deeper than {MAX_DEPTH} levels", mark
                    )
            elif kind in _CLOSES:
                depth -= 1
            elif kind is StreamEndEvent or event is None:
                return True
    except yaml.composer.ComposerError:
        raise
    except yaml.YAMLError:
        return False
    finally:
        parser.dispose()


@contextmanager
def _constructed() -> Iterator[None]:
    """PyYAML's constructors raise ``ValueError`` for a scalar that matches a type's pattern
    but is no value of it (an integer past ``str()``'s 4,300 digits, ``2001-13-45``): a
    ``yaml.constructor.ConstructorError`` here, as any other problem of the text."""
    try:
        yield
    except (ValueError, OverflowError) as exc:
        raise yaml.constructor.ConstructorError(None, None, f"invalid value: {exc}") from None


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
    check_depth(text)
    c_loader = _fast(loader, fast)
    with _constructed():
        if c_loader is not None:
            try:
                return _documents(text, c_loader, progress)
            except yaml.YAMLError:
                pass  # reported below, in the pure loader's words
        return _documents(text, loader, progress)


def load_one(text: str, loader: type[Any] = yaml.SafeLoader, fast: type[Any] | None = None) -> Any:
    """The single document of ``text`` (``yaml.load``), C-parsed when possible."""
    check_depth(text)
    c_loader = _fast(loader, fast)
    with _constructed():
        if c_loader is not None:
            try:
                return yaml.load(text, Loader=c_loader)
            except yaml.YAMLError:
                pass
        return yaml.load(text, Loader=loader)
