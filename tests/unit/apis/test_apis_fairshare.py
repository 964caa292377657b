"""A pod's Gemini shares from its labels and annotations (apis.fairshare)."""

from __future__ import annotations

import pytest

from apis.fairshare import (
    DefaultLimit,
    FairShareInputError,
    FairShareSpec,
    fairshare_spec,
    opted_in,
)

ALLOC = "scheduling.koordinator.sh/device-allocated"
PROVIDER = "koordinator.sh/gpu-isolation-provider"
LIMIT = "koordinator.sh/gpu-core-limit"
ONE = (
    '{"gpu":[{"minor":2,"resources":{"koordinator.sh/gpu-core":"30",'
    '"koordinator.sh/gpu-memory":"8Gi","koordinator.sh/gpu-memory-ratio":"10"},"id":"GPU-x"}]}'
)
MEMORY_ONLY = '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory":"1Gi"}}]}'
WHOLE = '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100"}}]}'
TWO = (
    '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"50"}},'
    '{"minor":1,"resources":{"koordinator.sh/gpu-core":"50"}}]}'
)
GEMINI = {PROVIDER: "Gemini"}

SPECS = [
    pytest.param(
        GEMINI,
        {ALLOC: ONE},
        DefaultLimit.FULL,
        FairShareSpec(2, 0.3, 1.0, 8 * 2**30, "GPU-x"),
        id="default-full",
    ),
    pytest.param(
        GEMINI,
        {ALLOC: ONE},
        DefaultLimit.REQUEST,
        FairShareSpec(2, 0.3, 0.3, 8 * 2**30, "GPU-x"),
        id="default-request",
    ),
    pytest.param(
        GEMINI,
        {ALLOC: ONE, LIMIT: " 60 "},
        DefaultLimit.REQUEST,
        FairShareSpec(2, 0.3, 0.6, 8 * 2**30, "GPU-x"),
        id="annotated-limit",
    ),
    pytest.param(
        {},
        {ALLOC: ONE, **GEMINI},
        DefaultLimit.FULL,
        FairShareSpec(2, 0.3, 1.0, 8 * 2**30, "GPU-x"),
        id="opt-in-by-annotation",
    ),
    pytest.param(
        GEMINI,
        {ALLOC: MEMORY_ONLY},
        DefaultLimit.REQUEST,
        FairShareSpec(0, 0.0, 1.0, 2**30, ""),
        id="memory-only-best-effort",
    ),
    pytest.param({PROVIDER: "HAMi-core"}, {ALLOC: ONE}, DefaultLimit.FULL, None, id="hami-core"),
    pytest.param(
        {PROVIDER: "HAMi-core"}, {ALLOC: ONE, **GEMINI}, DefaultLimit.FULL, None, id="label-wins"
    ),
    pytest.param({}, {ALLOC: ONE}, DefaultLimit.FULL, None, id="not-opted-in"),
    pytest.param(GEMINI, {}, DefaultLimit.FULL, None, id="no-allocation"),
    pytest.param(GEMINI, {ALLOC: '{"rdma":[]}'}, DefaultLimit.FULL, None, id="no-gpu"),
    pytest.param(GEMINI, {ALLOC: WHOLE}, DefaultLimit.FULL, None, id="whole-card"),
]


@pytest.mark.parametrize(("labels", "annotations", "default", "expected"), SPECS)
def test_fairshare_spec(
    labels: dict[str, str],
    annotations: dict[str, str],
    default: DefaultLimit,
    expected: FairShareSpec | None,
) -> None:
    assert fairshare_spec(labels, annotations, default) == expected


BAD = [
    pytest.param(
        {ALLOC: ONE, LIMIT: "20"}, "between the pod's gpu-core \\(30\\) and 100", id="below"
    ),
    pytest.param({ALLOC: ONE, LIMIT: "101"}, "between", id="above"),
    pytest.param({ALLOC: ONE, LIMIT: "0.5"}, "not a whole percent", id="fraction"),
    pytest.param({ALLOC: MEMORY_ONLY, LIMIT: "0"}, "above 0", id="zero"),
    pytest.param({ALLOC: TWO}, "spread over 2", id="two-cards"),
    pytest.param({ALLOC: "{"}, "invalid JSON", id="malformed-allocation"),
    pytest.param(
        {ALLOC: '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"-50"}}]}'},
        "gpu-core -50 is negative",
        id="negative-core",
    ),
    pytest.param(
        {
            ALLOC: '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"30",'
            '"koordinator.sh/gpu-memory":"-1Gi"}}]}'
        },
        "gpu-memory -1073741824 is negative",
        id="negative-memory",
    ),
]


@pytest.mark.parametrize(("annotations", "message"), BAD)
def test_bad_input_is_one_clear_error(annotations: dict[str, str], message: str) -> None:
    with pytest.raises(FairShareInputError, match=message):
        fairshare_spec(GEMINI, annotations)


def test_opted_in() -> None:
    assert opted_in(GEMINI, {}) and opted_in({}, GEMINI) and not opted_in({}, {})
