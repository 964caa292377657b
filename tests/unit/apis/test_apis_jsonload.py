"""apis.jsonload: ``loads`` is ``json.loads`` wherever that succeeds, decodes any document up to
MAX_DEPTH levels, and raises only ValueError (JSONDecodeDepthError beyond MAX_DEPTH).

The explicit-stack decoder (``_decode_deep``) is also held to ``json.loads`` on shallow input,
with the C scanner's recursion budget squeezed to a few levels (``with_budget``), so its
descend / retry-in-C paths run on every example."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.jsonload import (
    GO_MAX_DEPTH,
    MAX_DEPTH,
    JSONDecodeDepthError,
    _decode_deep,
    loads,
    nesting_depth,
)

T = TypeVar("T")


def with_budget(levels: int, fn: Callable[[], T]) -> T:
    """``fn()`` called so deep in the Python stack that json's C scanner has about ``levels``
    levels of recursion left: the deepest frame where ``levels`` + 4 nested arrays still
    decode (``fn`` and the decoder's own frames take a few)."""
    probe = "[" * (levels + 4) + "]" * (levels + 4)
    too_deep = object()

    def down() -> Any:
        try:
            json.loads(probe)
        except RecursionError:
            return too_deep
        below = down()
        return fn() if below is too_deep else below

    result = down()
    assert result is not too_deep
    return result  # type: ignore[no-any-return]


def canonical(value: Any) -> str:
    """Types, values and key order, NaN included (NaN != NaN)."""
    return json.dumps(value)


def chain(levels: int) -> str:
    """managedFields' shape: ``levels`` nested objects (``{"f:a":...{}...}``)."""
    return '{"f:a":' * (levels - 1) + "{}" + "}" * (levels - 1)


def outcome(fn: Callable[[], Any]) -> tuple[str, str]:
    try:
        return "ok", canonical(fn())
    except ValueError:
        return "error", ""


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=30,
)
layouts = st.sampled_from([{}, {"separators": (",", ":")}, {"indent": 1}, {"indent": "\t "}])


@given(json_values, layouts)
def test_equal_to_json_loads_on_valid_text(value: Any, layout: dict[str, Any]) -> None:
    text = json.dumps(value, **layout)
    expected = canonical(json.loads(text))
    assert canonical(loads(text)) == expected
    assert canonical(loads(text.encode())) == expected
    assert canonical(_decode_deep(text)) == expected
    assert canonical(with_budget(3, lambda: _decode_deep(text))) == expected


@given(json_values, st.data())
def test_same_verdict_as_json_loads_on_damaged_text(value: Any, data: st.DataObject) -> None:
    text = json.dumps(value, separators=(",", ":"))
    at = data.draw(st.integers(0, len(text)))
    cut = data.draw(st.integers(0, 2))
    insert = data.draw(st.sampled_from(["", ",", "]", "}", "[", "{", ":", '"', " ", "x", "1"]))
    damaged = text[:at] + insert + text[at + cut :]
    expected = outcome(lambda: json.loads(damaged))
    assert outcome(lambda: _decode_deep(damaged)) == expected
    assert outcome(lambda: with_budget(2, lambda: _decode_deep(damaged))) == expected


@given(st.binary(max_size=64))
def test_garbage_raises_only_value_error(data: bytes) -> None:
    for doc in (data, b"[" * 2000 + data, b'{"a":' * 1500 + data):
        with contextlib.suppress(ValueError):
            loads(doc)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "Expecting value"),
        ("[" * 1500, "Expecting value"),
        ("[" * 1500 + "]" * 1499, "Expecting ',' delimiter"),
        ("[" * 1500 + "1," + "]" * 1500, "Expecting value"),
        ('{"a":' * 1500 + "1" + "}" * 1500 + "x", "Extra data"),
        ('{"a":' * 1500 + "}" * 1500, "Expecting value"),
        ('{"a":' * 1500 + '{"b" 1}' + "}" * 1500, "Expecting ':' delimiter"),
        ('{"a":' * 1500 + '{"b":1,}' + "}" * 1500, "Expecting property name"),
        ("[" * 1500 + '"\x01"' + "]" * 1500, "Invalid control character"),
        ("\ufeff" + "[" * 1500 + "]" * 1500, "Unexpected UTF-8 BOM"),
    ],
)
def test_deep_malformed_text_names_the_problem(text: str, message: str) -> None:
    with pytest.raises(json.JSONDecodeError, match=message):
        loads(text)


@pytest.mark.parametrize("levels", [999, 1000, 1500, 5000, GO_MAX_DEPTH, MAX_DEPTH])
def test_decodes_up_to_max_depth(levels: int) -> None:
    for text in (chain(levels), "[" * levels + "]" * levels):
        value = loads(text.encode())
        assert nesting_depth(value) == levels
    # one deep object among shallow ones (a list page: 2 levels above it): all decoded, in order
    deep = min(levels, MAX_DEPTH - 2)
    objects = [f'{{"n":{i}}}' for i in range(50)]
    page = '{"items":[' + ",".join([*objects[:25], chain(deep), *objects[25:]]) + "]}"
    items = loads(page)["items"]
    assert [i["n"] for i in items[:25] + items[26:]] == list(range(50))
    assert nesting_depth(items[25]) == deep


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, MAX_DEPTH + 2, 3 * MAX_DEPTH])
def test_deeper_than_max_depth_is_the_declared_error(levels: int) -> None:
    for text in (chain(levels), "[" * levels + "]" * levels, "[" * levels):
        with pytest.raises(JSONDecodeDepthError, match=f"deeper than {MAX_DEPTH}"):
            loads(text)
    # also where the C scanner decoded the innermost levels (its budget ends above them)
    with pytest.raises(JSONDecodeDepthError):
        with_budget(900, lambda: loads(chain(MAX_DEPTH + 1)))


def test_deep_values_keep_their_siblings_and_keys() -> None:
    inner = '{"x":[1,2.5,"s",null,true,NaN],"y":{}}'
    text = '{"a":' * 1200 + inner + ',"b":[' + "[" * 1100 + "]" * 1100 + "]}" + "}" * 1199
    value = loads(text)
    node = value
    for _ in range(1199):
        node = node["a"]
    assert list(node) == ["a", "b"]
    assert canonical(node["a"]) == canonical(json.loads(inner))
    assert nesting_depth(node["b"]) == 1101


def test_json_loads_itself_stops_far_below_max_depth() -> None:
    """The fast path returns json.loads' answer unchecked: that is sound only while the C
    scanner runs out of recursion long before MAX_DEPTH (CPython 3.11: the recursion limit).
    An interpreter where this fails needs a depth check on the fast path."""
    result: list[BaseException] = []

    def shallow_thread() -> None:
        try:
            json.loads("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=shallow_thread)
    thread.start()
    thread.join()
    assert result and isinstance(result[0], RecursionError)


def test_recursion_limit_unchanged() -> None:
    before = sys.getrecursionlimit()
    loads(chain(5000))
    assert sys.getrecursionlimit() == before
