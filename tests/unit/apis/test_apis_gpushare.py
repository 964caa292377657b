"""apis.gpushare: gpushare's picture of a node's cards and its unhealthy-card ConfigMap, as
gpushare-scheduler-extender reads them (``pkg/utils/node.go``, ``pkg/cache/nodeinfo.go``)."""

from __future__ import annotations

from typing import Any

import pytest

from apis.gpushare import (
    GPUShareDecodeError,
    UnhealthyGPUs,
    capacity_cards,
    decode_unhealthy,
    is_unhealthy_configmap,
    parse_unhealthy,
)


@pytest.mark.parametrize(
    ("capacity", "want"),
    [
        pytest.param({"aliyun.com/gpu-mem": 32, "aliyun.com/gpu-count": 2}, (2, 16), id="even"),
        pytest.param({"aliyun.com/gpu-mem": 31, "aliyun.com/gpu-count": 2}, (2, 15), id="floor"),
        pytest.param({"aliyun.com/gpu-mem": 32, "aliyun.com/gpu-count": 0}, None, id="count-0"),
        pytest.param({"aliyun.com/gpu-mem": 1, "aliyun.com/gpu-count": 2}, None, id="0-per"),
        pytest.param({"aliyun.com/gpu-mem": 32}, None, id="no-count"),
        pytest.param({}, None, id="none"),
    ],
)
def test_capacity_cards(capacity: dict[str, int], want: tuple[int, int] | None) -> None:
    assert capacity_cards(capacity) == want


@pytest.mark.parametrize(
    ("text", "minors", "problems"),
    [
        pytest.param("0,2", {0, 2}, [], id="gpushare-form"),
        pytest.param(" 1 , 3,", {1, 3}, [], id="blanks-and-trailing-comma"),
        pytest.param("", set(), [], id="empty"),
        pytest.param("0,x", {0}, ["gpus: 'x' is not a card index"], id="bad-entry"),
        pytest.param("-1,1.5,+2", set(), [
            "gpus: '-1' is not a card index",
            "gpus: '1.5' is not a card index",
            "gpus: '+2' is not a card index",
        ], id="not-whole-numbers"),
        pytest.param("٣", set(), ["gpus: '٣' is not a card index"], id="non-ascii-digit"),
        pytest.param("3," + "y," * 10**5, {3}, [
            *["gpus: 'y' is not a card index"] * 5, "gpus: 99995 more entries are not card indexes",
        ], id="many-bad-entries-one-bounded-line"),
    ],
)
def test_parse_unhealthy(text: str, minors: set[int], problems: list[str]) -> None:
    assert parse_unhealthy(text) == (frozenset(minors), tuple(problems))


def cm(name: str, data: Any, namespace: str = "kube-system") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": "9"},
        "data": data,
    }


def test_decode_unhealthy_configmap() -> None:
    assert decode_unhealthy(cm("unhealthy-gpu-node-a", {"gpus": "0,x"})) == UnhealthyGPUs(
        "node-a", frozenset({0}), ("gpus: 'x' is not a card index",), "9"
    )
    assert decode_unhealthy(cm("unhealthy-gpu-n", None)).minors == frozenset()
    assert decode_unhealthy(cm("unhealthy-gpu-n", {"other": "1"})).minors == frozenset()
    assert decode_unhealthy(cm("unhealthy-gpu-n", {"gpus": "1"})).key == (
        "kube-system/unhealthy-gpu-n"
    )


@pytest.mark.parametrize(
    ("obj", "wanted"),
    [
        pytest.param(cm("unhealthy-gpu-n", {}), True, id="ours"),
        pytest.param(cm("unhealthy-gpu-", {}), False, id="no-node"),
        pytest.param(cm("kube-proxy", {}), False, id="other-name"),
        pytest.param(cm("unhealthy-gpu-n", {}, "default"), False, id="other-namespace"),
        pytest.param({"metadata": None}, False, id="no-metadata"),
    ],
)
def test_is_unhealthy_configmap(obj: dict[str, Any], wanted: bool) -> None:
    assert is_unhealthy_configmap(obj) is wanted
    if not wanted:
        with pytest.raises(GPUShareDecodeError):
            decode_unhealthy(obj)


def test_more_cards_than_any_node_describe_none() -> None:
    from apis.gpushare import MAX_CAPACITY_CARDS

    many = {"aliyun.com/gpu-mem": 10**6, "aliyun.com/gpu-count": MAX_CAPACITY_CARDS}
    assert capacity_cards(many) == (MAX_CAPACITY_CARDS, 10**6 // MAX_CAPACITY_CARDS)
    assert capacity_cards({**many, "aliyun.com/gpu-count": MAX_CAPACITY_CARDS + 1}) is None
