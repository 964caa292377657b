"""The extender/v1 JSON codecs: kube-scheduler's keys in, its keys out, bad bodies named."""

from __future__ import annotations

import json

import pytest

from scheduler.extender.protocol import (
    ExtenderRequestError,
    FilterResult,
    decode_binding_args,
    decode_extender_args,
    decode_preemption_args,
    encode_binding_result,
    encode_filter_result,
    encode_preemption_result,
    encode_priorities,
)
from tests.builders import make_pod

POD = make_pod("p").req(cpu="1").uid("u1").obj()


def test_node_cache_capable_args_carry_node_names() -> None:
    args = decode_extender_args(json.dumps({"pod": POD, "nodenames": ["a", "b"]}).encode())
    assert args.pod.uid == "u1" and args.node_names == ("a", "b") and args.nodes is None


def test_a_node_list_is_answered_with_the_kept_node_objects() -> None:
    nodes = [{"metadata": {"name": n}} for n in ("a", "b")]
    body = json.dumps({"Pod": POD, "Nodes": {"items": nodes}}).encode()  # Go matches any case
    args = decode_extender_args(body)
    assert args.node_names == ("a", "b")
    out = json.loads(encode_filter_result(FilterResult(["b"], {"a": "full"}), args.nodes))
    assert [n["metadata"]["name"] for n in out["nodes"]["items"]] == ["b"]
    assert out["failedNodes"] == {"a": "full"}


def test_filter_result_keys_are_kube_schedulers() -> None:
    result = FilterResult(["a"], {"b": "x"}, {"c": "gone"}, "")
    assert json.loads(encode_filter_result(result, None)) == {
        "nodenames": ["a"],
        "failedNodes": {"b": "x"},
        "failedAndUnresolvableNodes": {"c": "gone"},
    }


def test_binding_args_use_go_field_names_and_the_result_is_Error() -> None:
    body = b'{"PodName":"p","PodNamespace":"ns","PodUID":"u","Node":"n"}'
    args = decode_binding_args(body)
    assert (args.namespace, args.name, args.uid, args.node) == ("ns", "p", "u", "n")
    assert json.loads(encode_binding_result("boom")) == {"Error": "boom"}


def test_priorities_and_preemption_results() -> None:
    assert json.loads(encode_priorities([("a", 10), ("b", 0)])) == [
        {"host": "a", "score": 10},
        {"host": "b", "score": 0},
    ]
    body = json.dumps(
        {
            "pod": POD,
            "nodeNameToMetaVictims": {"a": {"pods": [{"uid": "v"}], "numPDBViolations": 1}},
        }
    ).encode()
    args = decode_preemption_args(body)
    assert args.meta and args.victims == {"a": (("v",), 1)}
    assert json.loads(encode_preemption_result(args.victims)) == {
        "nodeNameToMetaVictims": {"a": {"pods": [{"uid": "v"}], "numPDBViolations": 1}}
    }
    full = json.dumps(
        {"pod": POD, "nodeNameToVictims": {"a": {"pods": [{"metadata": {"uid": "w"}}]}}}
    ).encode()
    assert decode_preemption_args(full).victims == {"a": (("w",), 0)}


@pytest.mark.parametrize(
    ("decode", "body", "message"),
    [
        pytest.param(decode_extender_args, b"{", "request body is not JSON", id="not-json"),
        pytest.param(decode_extender_args, b"[]", "must be a JSON object", id="not-object"),
        pytest.param(decode_extender_args, b'{"nodenames":[]}', '"pod" is missing', id="no-pod"),
        pytest.param(
            decode_extender_args,
            json.dumps({"pod": POD}).encode(),
            'neither "nodenames" nor "nodes"',
            id="no-nodes",
        ),
        pytest.param(
            decode_extender_args,
            json.dumps({"pod": POD, "nodenames": [1]}).encode(),
            '"nodenames" must be a list of strings',
            id="bad-names",
        ),
        pytest.param(
            decode_binding_args, b'{"PodName":"p","PodNamespace":"ns"}', '"PodUID"', id="no-uid"
        ),
        pytest.param(
            decode_preemption_args,
            json.dumps({"pod": POD, "nodeNameToVictims": {"a": {"pods": [{}]}}}).encode(),
            "a victim has no uid",
            id="victim-without-uid",
        ),
    ],
)
def test_malformed_bodies_get_one_clear_error(decode: object, body: bytes, message: str) -> None:
    with pytest.raises(ExtenderRequestError) as err:
        decode(body)  # type: ignore[operator]
    assert message in str(err.value)
