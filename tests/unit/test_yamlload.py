"""apis.yamlload: scenarios, configurations and inspect files are parsed by libyaml's C loader
when PyYAML has it, with the pure loader's values and exactly its error messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from apis import yamlload
from scheduler.config import ConfigError, load_config
from scheduler.simulator.scenario import ScenarioError, parse_scenario

pytestmark = pytest.mark.skipif(not yamlload.HAVE_LIBYAML, reason="PyYAML without libyaml")

NODE = "apiVersion: v1\nkind: Node\nmetadata: {name: n%d}\n"
CFG = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"


@pytest.fixture
def c_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the C-parser loaders instantiated during the test."""
    seen: list[str] = []
    real = yaml.CSafeLoader.__init__

    def spy(self: Any, stream: Any) -> None:
        seen.append(type(self).__name__)
        real(self, stream)

    monkeypatch.setattr(yaml.CSafeLoader, "__init__", spy)
    return seen


def test_a_scenario_is_parsed_by_libyaml(c_parses: list[str]) -> None:
    scenario = parse_scenario("---\n".join(NODE % i for i in range(3)))
    assert [n["metadata"]["name"] for n in scenario.nodes] == ["n0", "n1", "n2"]
    assert c_parses == ["_CNoDuplicateKeys"]  # libyaml, refusing duplicate keys


def test_a_configuration_is_parsed_by_libyaml_and_still_strict(
    tmp_path: Path, c_parses: list[str]
) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CFG + "percentageOfNodesToScore: 10\n")
    assert load_config(cfg).percentage_of_nodes_to_score == 10
    assert c_parses == ["_CStrictLoader"]
    cfg.write_text(CFG + "leaderElection:\n  leaderElect: true\n  leaderElect: false\n")
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert str(err.value) == f'{cfg}: line 5, column 3: invalid YAML: duplicate key "leaderElect"'


@pytest.mark.parametrize(
    "text",
    [
        NODE % 1 + "---\nkind: [unclosed\n",
        NODE % 1 + "---\nmetadata:\n  name: a\n name: b\n",
        "a: 1\n\tb: 2\n",
        "key: @reserved\n",
        "- a\nb: c\n",
    ],
    ids=["unclosed", "indent", "tab", "reserved", "mixed"],
)
def test_scenario_errors_are_the_pure_loaders(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ScenarioError) as fast:
        parse_scenario(text, "s.yaml")
    monkeypatch.setattr(yamlload, "HAVE_LIBYAML", False)
    with pytest.raises(ScenarioError) as pure:
        parse_scenario(text, "s.yaml")
    assert str(fast.value) == str(pure.value)


def test_config_errors_are_the_pure_loaders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CFG + "profiles:\n- schedulerName: a\n  plugins: {\n")
    with pytest.raises(ConfigError) as fast:
        load_config(cfg)
    monkeypatch.setattr(yamlload, "HAVE_LIBYAML", False)
    with pytest.raises(ConfigError) as pure:
        load_config(cfg)
    assert str(fast.value) == str(pure.value)


def test_progress_counts_documents() -> None:
    calls: list[tuple[int, int]] = []
    docs = yamlload.load_all(
        "a: 1\n---\nb: 2\n---\nc: 3\n", progress=lambda d, t: calls.append((d, t))
    )
    assert docs == [{"a": 1}, {"b": 2}, {"c": 3}]
    assert calls == [(1, 3), (2, 3), (3, 3)]
