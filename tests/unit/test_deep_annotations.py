"""Annotation decoders against JSON nested deeper than ``json.loads`` goes (issue 45, finding
1, the same flaw one level down): a tenant writes any annotation on its pods; a value nested
1,500 levels raised ``RecursionError`` out of the gang reader (the Coscheduling plugin's event
handler, hence the informer's delivery) and the gpushare display. Each is now its decoder's
own error (or "no allocation") like any malformed value."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from apis.gang import (
    ANNOTATION_GROUPS,
    ANNOTATION_MIN_AVAILABLE,
    ANNOTATION_NAME,
    ANNOTATION_NETWORK_TOPOLOGY_SPEC,
    GangSpecError,
    gang_of,
)
from apis.jsonload import MAX_DEPTH
from apis.topology import GPUTopology, TopologyDecodeError
from scheduler.observability.gpushare_display import ANNOTATION_ALLOCATION, allocation_of
from tests.builders import make_pod
from tests.deepjson import chain

DEEP = [chain(1_500), "[" * 1_500 + "]" * 1_500, chain(MAX_DEPTH + 1)]
IDS = ["object-1500", "list-1500", "beyond-max-depth"]


def gang_pod(annotation: str, value: str) -> Callable[[], object]:
    pod = (
        make_pod("p")
        .annotation(ANNOTATION_NAME, "g")
        .annotation(ANNOTATION_MIN_AVAILABLE, "2")
        .annotation(annotation, value)
        .build()
    )
    return lambda: gang_of(pod)


@pytest.mark.parametrize("value", DEEP, ids=IDS)
@pytest.mark.parametrize("annotation", [ANNOTATION_GROUPS, ANNOTATION_NETWORK_TOPOLOGY_SPEC])
def test_a_deep_gang_annotation_is_a_gang_spec_error(annotation: str, value: str) -> None:
    read = gang_pod(annotation, value)
    if annotation == ANNOTATION_NETWORK_TOPOLOGY_SPEC and value == DEEP[0]:
        # an object without gatherStrategy: valid, no same-node constraint (as Koordinator)
        spec = read()
        assert spec is not None and not spec.same_node  # type: ignore[attr-defined]
        return
    with pytest.raises(GangSpecError, match=annotation):
        read()


@pytest.mark.parametrize("value", DEEP, ids=IDS)
def test_a_deep_gpushare_allocation_is_no_allocation(value: str) -> None:
    assert allocation_of({ANNOTATION_ALLOCATION: value}) == {}


@pytest.mark.parametrize("value", DEEP, ids=IDS)
def test_a_deep_topology_annotation_is_a_topology_decode_error(value: str) -> None:
    with pytest.raises(TopologyDecodeError):
        GPUTopology.decode(value)
