"""The constrained-model family: which tasks get a GPU-model spec, which models, and the file."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.simulator.gpuspec import constrain, model_groups, write_pods
from scheduler.simulator.trace import TraceNode, TracePod, read_pods

NODES = [
    TraceNode("t4-a", 64_000, 262_144, 2, "T4"),
    TraceNode("t4-b", 64_000, 262_144, 2, "T4"),
    TraceNode("g2", 96_000, 786_432, 8, "G2"),
    TraceNode("v16", 96_000, 786_432, 4, "V100M16"),
    TraceNode("v32", 96_000, 786_432, 4, "V100M32"),
    TraceNode("cpu", 64_000, 262_144, 0, ""),
]
PODS = [
    *(TracePod(f"s{i}", 4000, 8192, 1, 500) for i in range(40)),
    *(TracePod(f"w{i}", 8000, 8192, 1, 1000) for i in range(40)),
    *(TracePod(f"c{i}", 2000, 4096, 0, 0) for i in range(20)),
    TracePod("eight", 64_000, 65_536, 8, 1000),
    TracePod("pinned", 4000, 8192, 1, 1000, ("T4",)),
]


def test_model_groups_join_the_v100s_and_count_gpus() -> None:
    assert model_groups(NODES) == {("G2",): 8, ("T4",): 4, ("V100M16", "V100M32"): 8}


@pytest.mark.parametrize(
    ("share", "constrained"),
    [
        pytest.param(0.0, 0, id="none"),
        pytest.param(0.2, 16, id="a-fifth"),
        pytest.param(0.5, 40, id="half"),
        pytest.param(1.0, 81, id="every-gpu-task"),
    ],
)
def test_share_of_gpu_tasks_constrained(share: float, constrained: int) -> None:
    out = constrain(PODS, NODES, share, seed=1)
    added = [p for p, q in zip(PODS, out, strict=True) if p.gpu_spec != q.gpu_spec]
    assert len(added) == constrained
    assert all(p.num_gpu > 0 and not p.gpu_spec for p in added)


def test_only_models_that_can_hold_the_task() -> None:
    out = constrain(PODS, NODES, 1.0, seed=3)
    by_name = {p.name: p for p in out}
    # Only the G2 node has 8 cards.
    assert by_name["eight"].gpu_spec == ("G2",)
    assert by_name["pinned"].gpu_spec == ("T4",)  # a spec already there is kept
    assert all(not p.gpu_spec for p in out if p.num_gpu == 0)


def test_models_drawn_in_proportion_to_their_gpus() -> None:
    many = [TracePod(f"p{i}", 1000, 1024, 1, 500) for i in range(4000)]
    counts = Counter(p.gpu_spec for p in constrain(many, NODES, 1.0, seed=7))
    # GPUs: G2 8, T4 4, V100 8 of 20.
    assert counts[("G2",)] / 4000 == pytest.approx(0.4, abs=0.03)
    assert counts[("T4",)] / 4000 == pytest.approx(0.2, abs=0.03)
    assert counts[("V100M16", "V100M32")] / 4000 == pytest.approx(0.4, abs=0.03)


def test_a_seed_gives_one_variant() -> None:
    assert constrain(PODS, NODES, 0.4, seed=5) == constrain(PODS, NODES, 0.4, seed=5)
    assert constrain(PODS, NODES, 0.4, seed=5) != constrain(PODS, NODES, 0.4, seed=6)


@pytest.mark.parametrize("share", [-0.1, 1.5], ids=["negative", "over-one"])
def test_share_out_of_range(share: float) -> None:
    with pytest.raises(ValueError, match="share must be in"):
        constrain(PODS, NODES, share, seed=1)


@settings(max_examples=30, deadline=None)
@given(share=st.floats(0, 1), seed=st.integers(0, 2**16))
def test_every_constrained_task_fits_a_node_of_its_models(share: float, seed: int) -> None:
    for pod in constrain(PODS, NODES, share, seed):
        if pod.gpu_spec:
            assert any(
                n.model in pod.gpu_spec and n.gpus >= pod.num_gpu and n.cpu_milli >= pod.cpu_milli
                for n in NODES
            )


def test_written_file_reads_back(tmp_path: Path) -> None:
    out = constrain(PODS, NODES, 0.5, seed=2)
    path = tmp_path / "openb_pod_list_models50.csv"
    write_pods(path, out)
    assert read_pods(path) == out
