"""``rowfit.row_feasible`` (one row in Python ints) == ``rows_feasible``'s numpy pass over
that row (``card_fits``), on random ledgers — unhealthy, partly allocated and over-committed
cards, NICs, cards the operator marked unhealthy, and on every GPU a holding that takes core,
memory and ratio in any proportion — for every request shape the row cache serves."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from apis.resources import GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO
from scheduler.devices.allocator import rows_feasible
from scheduler.devices.ledger import NodeDeviceLedger
from scheduler.devices.request import CardUse
from scheduler.devices.rowfit import FEW_ROWS, row_feasible
from tests.unit.devices.helpers import ledgers
from tests.unit.devices.test_rowcache import REQUESTS, _request

GIB = 1 << 30

take = st.tuples(
    st.integers(0, 120),  # gpu-core
    st.integers(0, 120),  # gpu-memory-ratio
    st.integers(0, 90),  # gpu-memory, GiB: independent of the ratio
)


@settings(max_examples=300, deadline=None)
@given(ledgers(max_nodes=3), st.data(), st.integers(0, len(REQUESTS) - 1))
def test_one_row_in_ints_equals_the_numpy_pass(
    ledger: NodeDeviceLedger, data: st.DataObject, i: int
) -> None:
    for row in range(ledger.n_rows):
        name = ledger.node_name(row)
        # The operator's unhealthy cards (GPUs and NICs alike, by minor).
        ledger.set_unhealthy(name, data.draw(st.frozensets(st.integers(0, 3), max_size=2)))
        for minor in ledger.minors(name, "gpu"):
            core, ratio, memory = data.draw(take)
            resources = {GPU_CORE: core, GPU_MEMORY_RATIO: ratio, GPU_MEMORY: memory * GIB}
            ledger.reserve(f"t{row}-{minor}", name, [CardUse.of("gpu", minor, resources)])
    request = _request(i)
    n = ledger.n_rows
    numpy_pass = rows_feasible(ledger, request, slice(0, n)).tolist()
    assert [row_feasible(ledger, request, r) for r in range(n)] == numpy_pass
    # The few-rows path of rows_feasible is this same test, row by row.
    few = np.arange(min(n, FEW_ROWS), dtype=np.int64)
    assert rows_feasible(ledger, request, few).tolist() == numpy_pass[: len(few)]
