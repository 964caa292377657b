"""config/prometheus/rules.yaml: ``promtool check rules`` and ``promtool test rules`` (Debian's
promtool via hack/prometheus.sh; skipped with one line outside CI when it cannot be had), plus
the conventions promtool does not check: every alert has a severity, a summary, a description
and a runbook anchor that exists in docs/operations.md, and every metric a rule reads is
documented in docs/metrics.md."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "config" / "prometheus" / "rules.yaml"
RULES_TEST = REPO / "config" / "prometheus" / "rules_test.yaml"
SCRIPT = REPO / "hack" / "prometheus.sh"
# Metrics of other issues' work that the rules already watch (documented when they land).
PENDING_METRICS: set[str] = set()
SEVERITIES = {"critical", "warning", "info"}


@pytest.fixture(scope="module")
def promtool() -> str:
    def unavailable(reason: str) -> None:
        msg = f"Prometheus tier unavailable: {reason}"
        if os.environ.get("CI"):
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)

    try:
        proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        unavailable(str(exc))
    if proc.returncode != 0:
        unavailable((proc.stderr.strip().splitlines() or ["prometheus.sh failed"])[-1])
    values = dict(ln.split("=", 1) for ln in proc.stdout.splitlines() if "=" in ln)
    if "PROMTOOL_BIN" not in values:
        unavailable("prometheus.sh printed no PROMTOOL_BIN")
    return values["PROMTOOL_BIN"]


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _alerts() -> list[dict[str, Any]]:
    return [r for r in _rules() if "alert" in r]


@pytest.mark.parametrize(
    "args",
    [("check", "rules", str(RULES)), ("test", "rules", str(RULES_TEST))],
    ids=["check-rules", "test-rules"],
)
def test_promtool(promtool: str, args: tuple[str, ...]) -> None:
    proc = subprocess.run(
        [promtool, *args], capture_output=True, text=True, timeout=120, cwd=RULES.parent
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_is_unit_tested() -> None:
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULES_TEST.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert {a["alert"] for a in _alerts()} == tested


@pytest.mark.parametrize("alert", _alerts(), ids=lambda a: str(a["alert"]))
def test_alert_conventions(alert: dict[str, Any]) -> None:
    assert alert["labels"]["severity"] in SEVERITIES
    notes = alert["annotations"]
    assert notes["summary"] and notes["description"]
    anchor = notes["runbook"].removeprefix("docs/operations.md#")
    headings = re.findall(r"^#+ (.+)$", (REPO / "docs" / "operations.md").read_text(), re.M)
    slugs = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}
    assert anchor in slugs, f"docs/operations.md has no heading for #{anchor}"


def test_every_metric_a_rule_reads_is_documented() -> None:
    documented = (REPO / "docs" / "metrics.md").read_text()
    names = set()
    for rule in _rules():
        for name in re.findall(r"\b([a-z_]+(?:_total|_count|_bucket|_[a-z]+))\{", rule["expr"]):
            names.add(name)
    names -= PENDING_METRICS
    assert names, "no metric names found in the rules"
    for name in sorted(names):
        base = re.sub(r"_(count|bucket)$", "", name)
        if name == "up":
            continue
        assert f"`{base}`" in documented or f"`{name}`" in documented, name
