"""``kubectl inspect gpushare`` prints what gpushare's own plugin prints.

The goldens (``fixtures/gpushare-inspect/golden.json``) are **recorded**, not derived: gpushare's
``cmd/inspect`` built from github.com/AliyunContainerService/gpushare-device-plugin at commit
45fb8b88692250cff2d53cb64b0a41864a5fcaf3 (its vendor/ directory, go1.19.8) and run 40 times per
argument list against a real kube-apiserver v1.20.2 holding each state of ``<state>.yaml``
(``hack/gpushare-inspect-golden/gen.sh``). The original walks Go maps, so one argument list may
print several row orders; ours must print one of them, byte for byte, with the same exit code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.commands.kubectl_gpushare import main
from scheduler.observability.tabwriter import tabwrite

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gpushare-inspect"
GOLDEN: dict[str, Any] = json.loads((FIXTURES / "golden.json").read_text())
CASES = [
    pytest.param(state, run, id=f"{state}:{' '.join(run['args']) or '-'}")
    for state, runs in GOLDEN["states"].items()
    for run in runs
]


@pytest.mark.parametrize(("state", "run"), CASES)
def test_output_is_the_originals(
    state: str, run: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main([*run["args"], "--file", str(FIXTURES / f"{state}.yaml")])
    out = capsys.readouterr().out
    # the original ends "Failed due to ..." without a newline (the shell prompt follows on the
    # same line); ours ends it with one
    expected = [o if o.endswith("\n") else o + "\n" for o in run["outputs"]]
    assert (rc, out) in [(run["rc"], o) for o in expected]


def test_goldens_cover_the_originals_columns() -> None:
    """The recorded states exercise what issue 27 named: PENDING, 0/0 and unknown cells, the
    -d layout, a positional NODE, an unknown node, MiB and no GPU node at all."""
    text = json.dumps(GOLDEN)
    for needle in (
        "PENDING(Allocated)",
        "Pending(Allocated)",
        " 0/0 ",
        "unknown",
        "GPU Memory(MiB)",
        "GPU Memory()",
        'Failed due to nodes \\"nope\\" not found',
    ):
        assert needle in text, needle  # fmt: skip


@pytest.mark.parametrize(
    ("text", "go"),
    [  # outputs of Go 1.19's tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
        ("a\tbb\tc\naaaa\tb\nx\tyyyyyy\tz\n", "a     bb  c\naaaa  b\nx     yyyyyy  z\n"),
        ("h1\th2\t\nlong-cell\t\t\n\nq\tw\n", "h1         h2  \nlong-cell      \n\nq  w\n"),
        ("x\ty\tz", "x  y  z"),
        ("\tx\nxxxxx\na\tx\t\t", "  x\nxxxxx\na  x  "),
    ],
)
def test_tabwriter_is_gos(text: str, go: str) -> None:
    assert tabwrite(text) == go


def test_tabwriter_on_200_random_texts_recorded_from_go() -> None:
    """hack/gpushare-inspect-golden/tabwriter.py: Go 1.19's tabwriter on random cells, tabs
    and newlines (ragged lines, empty cells, unterminated last lines)."""
    cases = json.loads((FIXTURES / "tabwriter.json").read_text())
    assert len(cases) == 200
    assert [tabwrite(text) for text, _ in cases] == [go for _, go in cases]


def test_positional_node_and_d_in_either_order(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(FIXTURES / "basic.yaml")
    assert main(["gpu-a", "-d", "--file", path]) == 0
    after = capsys.readouterr().out
    assert main(["-d", "gpu-a", "--file", path]) == 0
    assert capsys.readouterr().out == after and "NAME:       gpu-a" in after


def test_unit_without_koord_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--unit", "MiB"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("--unit applies to --koord only (gpushare's own units are shown as "
                            "they are)")  # fmt: skip


def test_hostile_values_are_read_as_the_original_reads_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An index Go's Atoi rejects (out of int64 range) is pending; an allocation annotation
    that is not ``{int: {int: int}}`` is ignored (Go's Unmarshal fails); no traceback."""
    docs = [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "h"},
         "status": {"allocatable": {"aliyun.com/gpu-mem": "8", "aliyun.com/gpu-count": "2"}}},
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "p1", "namespace": "d", "uid": "1", "annotations": {
             "ALIYUN_COM_GPU_MEM_IDX": "9223372036854775808",
             "scheduler.framework.gpushare.allocation": "[1]"}},
         "spec": {"nodeName": "h", "containers": [
             {"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": "3"}}}]}},
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "p2", "namespace": "d", "uid": "2", "annotations": {
             "ALIYUN_COM_GPU_MEM_IDX": "1",
             "scheduler.framework.gpushare.allocation": '{"0": {"1": 1.5}}'}},
         "spec": {"nodeName": "h", "containers": [
             {"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": "2"}}}]}},
    ]  # fmt: skip
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    assert main(["--file", str(path)]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[1].split() == ["h", "unknown", "0/4", "2/4", "3", "5/8"]


def test_an_unbelievable_card_count_is_a_warning_not_a_hang(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``aliyun.com/gpu-count: 1e9`` would make the original allocate a billion cards and print
    as many columns; the node is shown with no cards and one warning line, the others intact."""
    gpu = {"aliyun.com/gpu-mem": "8", "aliyun.com/gpu-count": "1"}
    docs = [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "huge"},
         "status": {"allocatable": {"aliyun.com/gpu-mem": "8", "aliyun.com/gpu-count": "1e9"}}},
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "ok"},
         "status": {"allocatable": gpu}},
    ]  # fmt: skip
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    assert main(["--file", str(path)]) == 0
    out, err = capsys.readouterr()
    assert [ln.split() for ln in out.splitlines()[1:3]] == [
        ["huge", "unknown", "0/0", "0/8"],
        ["ok", "unknown", "0/8", "0/8"],
    ]
    assert err == (
        "kubectl-inspect-gpushare: warning: node huge: aliyun.com/gpu-count 1000000000 is "
        "over 1024: shown with no cards\n"
    )
