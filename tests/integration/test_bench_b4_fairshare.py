"""B4's scenarios, a few seconds each, through the real server, sockets and protocol.

Only correctness properties are checked (loose bounds, no timings): every request answered,
no protocol error, shares ordered like the requests, an idle pod's share handed to the others,
the capped pod within its limit plus one quota, every one of 16 pods served, and the greedy
pods keeping their share beside a connection flood, frees on other connections and an invalid
pod (the server at 256 file descriptors).
"""

from __future__ import annotations

import pytest

from bench.b4_fairshare import evaluate, run, scenarios


@pytest.mark.parametrize(
    "index", [0, 1, 2, 3, 4], ids=["fair", "idle", "limit", "latency", "faults"]
)
def test_b4_quick(index: int) -> None:
    sc = scenarios(3.0, quick=True)[index]
    traces, t0, latencies, errors = run(sc)
    rows = evaluate([(sc, traces, t0, latencies, errors)], quick=True)
    missed = [r for r in rows if r[3] is False]
    assert not missed, rows
    busy = {p.name for p in sc.pods if p.role == "busy"}
    assert all(t.asks and t.bursts for n, t in traces.items() if "idle" not in n and n in busy)
