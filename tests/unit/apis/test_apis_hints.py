"""Tests for apis.hints: hint parsing, validation, selector matching."""

from __future__ import annotations

import pytest

from apis.hints import (
    ANNOTATION_DEVICE_ALLOCATE_HINT,
    ANNOTATION_DEVICE_JOINT_ALLOCATE,
    TOPOLOGY_SCOPE_LEVEL,
    DeviceHint,
    DeviceJointAllocate,
    HintDecodeError,
    LabelSelector,
    LabelSelectorRequirement,
    parse_allocate_hints,
    parse_joint_allocate,
)

Req = LabelSelectorRequirement

PARSE = [
    ("empty", "{}", {}),
    ("null", "null", {}),
    ("null-hint-dropped", '{"gpu":null}', {}),
    ("empty-hint", '{"gpu":{}}', {"gpu": DeviceHint()}),
    (
        "full",
        '{"gpu":{"selector":{"matchLabels":{"model":"A100"},"matchExpressions":'
        '[{"key":"zone","operator":"In","values":["a","b"]},{"key":"bad","operator":"DoesNotExist"}]},'
        '"allocateStrategy":"ApplyForAll","requiredTopologyScope":"PCIe",'
        '"exclusivePolicy":"DeviceLevel"},'
        '"rdma":{"vfSelector":{},"allocateStrategy":"RequestsAsCount","exclusivePolicy":"PCIeLevel"}}',
        {
            "gpu": DeviceHint(
                selector=LabelSelector(
                    {"model": "A100"},
                    (Req("zone", "In", ("a", "b")), Req("bad", "DoesNotExist")),
                ),
                allocate_strategy="ApplyForAll",
                required_topology_scope="PCIe",
                exclusive_policy="DeviceLevel",
            ),
            "rdma": DeviceHint(
                vf_selector=LabelSelector(),
                allocate_strategy="RequestsAsCount",
                exclusive_policy="PCIeLevel",
            ),
        },
    ),
    (
        "case-insensitive",
        '{"gpu":{"RequiredTopologyScope":"NUMANode","Selector":{"MatchLabels":{"a":"b"}}}}',
        {
            "gpu": DeviceHint(
                selector=LabelSelector({"a": "b"}), required_topology_scope="NUMANode"
            )
        },
    ),
    (
        "unknown-fields-ignored",
        '{"fpga":{"requiredTopologyScope":"Node","future":1}}',
        {"fpga": DeviceHint(required_topology_scope="Node")},
    ),
    (
        "prefixed-label-key",
        '{"gpu":{"selector":{"matchExpressions":[{"key":"node.koordinator.sh/gpu-model",'
        '"operator":"NotIn","values":["T4"]}]}}}',
        {
            "gpu": DeviceHint(
                selector=LabelSelector(
                    match_expressions=(Req("node.koordinator.sh/gpu-model", "NotIn", ("T4",)),)
                )
            )
        },
    ),
    ("empty-label-value", '{"gpu":{"selector":{"matchLabels":{"a":""}}}}',
     {"gpu": DeviceHint(selector=LabelSelector({"a": ""}))}),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expect"), [p[1:] for p in PARSE], ids=[p[0] for p in PARSE])
def test_parse_allocate_hints(text: str, expect: dict[str, DeviceHint]) -> None:
    assert parse_allocate_hints(text) == expect


PARSE_ERRORS = [
    ("malformed", "{", "invalid JSON"),
    ("array", "[]", "expected an object, got array"),
    ("hint-string", '{"gpu":"x"}', "gpu: expected an object, got string"),
    (
        "bad-strategy",
        '{"gpu":{"allocateStrategy":"All"}}',
        'gpu.allocateStrategy: unknown value "All" (want ApplyForAll or RequestsAsCount)',
    ),
    (
        "bad-scope",
        '{"gpu":{"requiredTopologyScope":"Rack"}}',
        'gpu.requiredTopologyScope: unknown value "Rack" (want Device or PCIe or NUMANode or Node)',
    ),
    (
        "bad-policy",
        '{"gpu":{"exclusivePolicy":"Node"}}',
        'gpu.exclusivePolicy: unknown value "Node"',
    ),
    ("strategy-number", '{"gpu":{"allocateStrategy":1}}', "expected a string, got number"),
    (
        "bad-operator",
        '{"gpu":{"selector":{"matchExpressions":[{"key":"a","operator":"Gt","values":["1"]}]}}}',
        'gpu.selector.matchExpressions[0].operator: "Gt" is not a valid label selector operator',
    ),
    (
        "in-without-values",
        '{"gpu":{"selector":{"matchExpressions":[{"key":"a","operator":"In"}]}}}',
        "matchExpressions[0].values: for 'In', 'NotIn' operators, values set can't be empty",
    ),
    (
        "exists-with-values",
        '{"gpu":{"selector":{"matchExpressions":[{"key":"a","operator":"Exists","values":["x"]}]}}}',
        "gpu.selector.matchExpressions[0].values: values set must be empty",
    ),
    (
        "bad-key",
        '{"gpu":{"selector":{"matchExpressions":[{"key":"-a","operator":"Exists"}]}}}',
        'gpu.selector.matchExpressions[0].key: invalid label key "-a"',
    ),
    (
        "empty-key",
        '{"gpu":{"selector":{"matchExpressions":[{"operator":"Exists"}]}}}',
        'invalid label key ""',
    ),
    (
        "bad-prefix",
        '{"gpu":{"selector":{"matchLabels":{"Foo.com/a":"b"}}}}',
        'gpu.selector.matchLabels["Foo.com/a"]: invalid label key "Foo.com/a": prefix',
    ),
    (
        "bad-value",
        '{"gpu":{"selector":{"matchLabels":{"a":"b c"}}}}',
        'gpu.selector.matchLabels["a"]: invalid label value "b c"',
    ),
    (
        "long-value",
        '{"gpu":{"selector":{"matchExpressions":[{"key":"a","operator":"In","values":["'
        + "x" * 64
        + '"]}]}}}',
        "gpu.selector.matchExpressions[0].values[0]: invalid label value",
    ),
    (
        "label-value-number",
        '{"gpu":{"selector":{"matchLabels":{"a":1}}}}',
        'gpu.selector.matchLabels["a"]: expected a string, got number',
    ),
    (
        "expressions-object",
        '{"gpu":{"selector":{"matchExpressions":{}}}}',
        "gpu.selector.matchExpressions: expected an array, got object",
    ),
]


@pytest.mark.parametrize(
    ("text", "fragment"), [p[1:] for p in PARSE_ERRORS], ids=[p[0] for p in PARSE_ERRORS]
)
def test_parse_allocate_hints_errors(text: str, fragment: str) -> None:
    with pytest.raises(HintDecodeError) as info:
        parse_allocate_hints(text)
    assert str(info.value).startswith(f"invalid {ANNOTATION_DEVICE_ALLOCATE_HINT} annotation: ")
    assert fragment in str(info.value)


JOINT = [
    (
        "spec-example",
        '{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}',
        DeviceJointAllocate(("gpu", "rdma"), "SamePCIe"),
    ),
    ("empty", "{}", DeviceJointAllocate()),
    ("null", "null", DeviceJointAllocate()),
    ("types-only", '{"DeviceTypes":["gpu"]}', DeviceJointAllocate(("gpu",))),
]


@pytest.mark.parametrize(("text", "expect"), [j[1:] for j in JOINT], ids=[j[0] for j in JOINT])
def test_parse_joint_allocate(text: str, expect: DeviceJointAllocate) -> None:
    assert parse_joint_allocate(text) == expect


JOINT_ERRORS = [
    ("bad-scope", '{"requiredScope":"SameNUMA"}', 'requiredScope: unknown value "SameNUMA"'),
    ("types-string", '{"deviceTypes":"gpu"}', "deviceTypes: expected an array, got string"),
    ("type-number", '{"deviceTypes":[1]}', "deviceTypes[0]: expected a string, got number"),
    ("malformed", '{"deviceTypes":', "invalid JSON"),
]


@pytest.mark.parametrize(
    ("text", "fragment"), [j[1:] for j in JOINT_ERRORS], ids=[j[0] for j in JOINT_ERRORS]
)
def test_parse_joint_allocate_errors(text: str, fragment: str) -> None:
    with pytest.raises(HintDecodeError) as info:
        parse_joint_allocate(text)
    assert str(info.value).startswith(f"invalid {ANNOTATION_DEVICE_JOINT_ALLOCATE} annotation: ")
    assert fragment in str(info.value)


MATCH = [
    ("empty-matches-all", LabelSelector(), {"a": "1"}, True),
    ("empty-matches-unlabelled", LabelSelector(), {}, True),
    ("match-labels-hit", LabelSelector({"a": "1"}), {"a": "1", "b": "2"}, True),
    ("match-labels-miss", LabelSelector({"a": "1"}), {"a": "2"}, False),
    ("match-labels-absent", LabelSelector({"a": "1"}), {}, False),
    ("in-hit", LabelSelector(match_expressions=(Req("a", "In", ("1", "2")),)), {"a": "2"}, True),
    ("in-miss", LabelSelector(match_expressions=(Req("a", "In", ("1",)),)), {"a": "3"}, False),
    ("in-absent", LabelSelector(match_expressions=(Req("a", "In", ("1",)),)), {}, False),
    ("notin-hit", LabelSelector(match_expressions=(Req("a", "NotIn", ("1",)),)), {"a": "2"}, True),
    ("notin-miss", LabelSelector(match_expressions=(Req("a", "NotIn", ("1",)),)), {"a": "1"},
     False),
    ("notin-absent", LabelSelector(match_expressions=(Req("a", "NotIn", ("1",)),)), {}, True),
    ("exists-hit", LabelSelector(match_expressions=(Req("a", "Exists"),)), {"a": ""}, True),
    ("exists-miss", LabelSelector(match_expressions=(Req("a", "Exists"),)), {}, False),
    ("dne-hit", LabelSelector(match_expressions=(Req("a", "DoesNotExist"),)), {}, True),
    ("dne-miss", LabelSelector(match_expressions=(Req("a", "DoesNotExist"),)), {"a": "x"}, False),
    (
        "all-must-hold",
        LabelSelector({"m": "A100"}, (Req("z", "In", ("a",)), Req("bad", "DoesNotExist"))),
        {"m": "A100", "z": "a"},
        True,
    ),
    (
        "one-fails",
        LabelSelector({"m": "A100"}, (Req("z", "In", ("a",)), Req("bad", "DoesNotExist"))),
        {"m": "A100", "z": "a", "bad": "1"},
        False,
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("selector", "labels", "expect"), [m[1:] for m in MATCH], ids=[m[0] for m in MATCH]
)
def test_selector_matching(selector: LabelSelector, labels: dict[str, str], expect: bool) -> None:
    assert selector.matches(labels) is expect
    assert DeviceHint(selector=selector).matches(labels) is expect


def test_hint_without_selector_matches_everything() -> None:
    assert DeviceHint().matches({"anything": "x"})


def test_parsed_selector_matches() -> None:
    hints = parse_allocate_hints(
        '{"gpu":{"selector":{"matchExpressions":[{"key":"model","operator":"In","values":["A100"]}]}}}'
    )
    assert hints["gpu"].matches({"model": "A100"})
    assert not hints["gpu"].matches({"model": "T4"})


def test_topology_scope_levels() -> None:
    assert sorted(TOPOLOGY_SCOPE_LEVEL, key=TOPOLOGY_SCOPE_LEVEL.__getitem__) == [
        "Node",
        "NUMANode",
        "PCIe",
        "Device",
    ]
