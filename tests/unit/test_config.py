"""Tests for scheduler.config: decoding, defaults, validation messages, merge and sampling rules."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.config import (
    ConfigError,
    LeaderElection,
    PluginConfig,
    PluginRef,
    Plugins,
    PluginSet,
    Profile,
    SchedulerConfiguration,
    default_config,
    load_config,
    merge_plugin_set,
    merge_plugins,
    num_feasible_nodes_to_find,
    parse_config,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
HEADER = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"


def doc(body: str = "") -> Any:
    """A configuration document: the v1 header followed by ``body`` (YAML)."""
    return yaml.safe_load(HEADER + body)


def refs(spec: str) -> tuple[PluginRef, ...]:
    """``"A B=2"`` -> (PluginRef("A"), PluginRef("B", 2))."""
    out = []
    for word in spec.split():
        name, _, weight = word.partition("=")
        out.append(PluginRef(name, int(weight or 0)))
    return tuple(out)


def pset(enabled: str = "", disabled: str = "") -> PluginSet:
    return PluginSet(enabled=refs(enabled), disabled=refs(disabled))


# --------------------------------------------------------------------------------------------
# Valid configurations

FULL = """
clientConnection: {kubeconfig: /etc/kubeconfig, qps: 50, burst: 100}
enableProfiling: true
enableContentionProfiling: false
delayCacheUntilActive: true
healthzBindAddress: 0.0.0.0:10251
metricsBindAddress: 0.0.0.0:10251
extenders: []
parallelism: 8
percentageOfNodesToScore: 30
podInitialBackoffSeconds: 2
podMaxBackoffSeconds: 20
leaderElection:
  leaderElect: true
  leaseDuration: 30s
  renewDeadline: 20s
  retryPeriod: 5s
  resourceLock: leases
  resourceName: my-lock
  resourceNamespace: koordinator-system
profiles:
  - schedulerName: gpu
    percentageOfNodesToScore: 100
    plugins:
      queueSort: {enabled: [{name: PrioritySort}]}
      preFilter: {enabled: [{name: DeviceShare}]}
      filter: {enabled: [{name: DeviceShare}], disabled: [{name: NodeName}]}
      postFilter: {disabled: [{name: "*"}]}
      preScore: {enabled: [{name: DeviceShare}]}
      score: {enabled: [{name: DeviceShare, weight: 5}, {name: NodeResourcesFit, weight: 0}]}
      reserve: {enabled: [{name: DeviceShare}]}
      permit: {enabled: []}
      preBind: {enabled: [{name: DeviceShare}]}
      bind: {enabled: [{name: DefaultBinder}]}
      postBind: {disabled: [{name: Foo, weight: 3}]}
    pluginConfig:
      - name: DeviceShare
        args:
          apiVersion: kubescheduler.config.k8s.io/v1
          kind: DeviceShareArgs
          scoringStrategy:
            type: MostAllocated
            resources: [{name: koordinator.sh/gpu-memory, weight: 2}]
      - name: NodeResourcesFit
"""

FULL_EXPECTED = SchedulerConfiguration(
    profiles=(
        Profile(
            scheduler_name="gpu",
            percentage_of_nodes_to_score=100,
            plugins=Plugins(
                queue_sort=pset("PrioritySort"),
                pre_filter=pset("DeviceShare"),
                filter=pset("DeviceShare", "NodeName"),
                post_filter=pset(disabled="*"),
                pre_score=pset("DeviceShare"),
                score=pset("DeviceShare=5 NodeResourcesFit"),
                reserve=pset("DeviceShare"),
                permit=pset(),
                pre_bind=pset("DeviceShare"),
                bind=pset("DefaultBinder"),
                post_bind=pset(disabled="Foo=3"),
            ),
            plugin_config=(
                PluginConfig(
                    "DeviceShare",
                    {
                        "scoringStrategy": {
                            "type": "MostAllocated",
                            "resources": [{"name": "koordinator.sh/gpu-memory", "weight": 2}],
                        }
                    },
                ),
                PluginConfig("NodeResourcesFit", {}),
            ),
        ),
    ),
    percentage_of_nodes_to_score=30,
    pod_initial_backoff_seconds=2.0,
    pod_max_backoff_seconds=20.0,
    leader_election=LeaderElection(
        leader_elect=True,
        lease_duration=30.0,
        renew_deadline=20.0,
        retry_period=5.0,
        resource_lock="leases",
        resource_name="my-lock",
        resource_namespace="koordinator-system",
    ),
    parallelism=8,
)

VALID: list[tuple[str, str, Callable[[SchedulerConfiguration], Any], Any]] = [
    ("minimal", "", lambda c: c, default_config()),
    ("full", FULL, lambda c: c, FULL_EXPECTED),
    ("empty-profiles-list", "profiles: []\n", lambda c: c, default_config()),
    ("null-sections", "profiles:\nleaderElection:\nextenders:\n", lambda c: c, default_config()),
    (
        "profile-without-name",
        "profiles: [{plugins: {score: {enabled: [{name: A}]}}}]\n",
        lambda c: c.profiles[0].scheduler_name,
        "koord-scheduler",
    ),
    (
        "profile-name-null-is-default",
        "profiles: [{schedulerName: null}]\n",
        lambda c: c.profiles[0].scheduler_name,
        "koord-scheduler",
    ),
    (
        "multiple-profiles",
        "profiles:\n- schedulerName: a\n- schedulerName: b\n  percentageOfNodesToScore: 0\n",
        lambda c: [(p.scheduler_name, p.percentage_of_nodes_to_score) for p in c.profiles],
        [("a", None), ("b", 0)],
    ),
    (
        "multi-point",
        "profiles:\n- plugins:\n    multiPoint:\n      enabled: [{name: DeviceShare, weight: 3}]\n"
        "      disabled: [{name: '*'}]\n",
        lambda c: c.profiles[0].plugins.multi_point,
        pset("DeviceShare=3", "*"),
    ),
    (
        "null-plugin-set-and-lists",
        "profiles:\n- plugins:\n    filter:\n    score: {enabled: , disabled: }\n",
        lambda c: c.profiles[0].plugins,
        Plugins(),
    ),
    (
        "duplicate-disabled-names-allowed",
        "profiles:\n- plugins: {filter: {disabled: [{name: A}, {name: A}]}}\n",
        lambda c: c.profiles[0].plugins.filter,
        pset(disabled="A A"),
    ),
    (
        "args-apiversion-kind-dropped",
        "profiles:\n- pluginConfig:\n  - name: X\n    args: {apiVersion: v1, kind: XArgs, a: 1}\n",
        lambda c: dict(c.profiles[0].args_for("X")),
        {"a": 1},
    ),
    (
        "args-null",
        "profiles:\n- pluginConfig: [{name: X, args: null}]\n",
        lambda c: dict(c.profiles[0].args_for("X")),
        {},
    ),
    (
        "durations-go-syntax",
        "leaderElection: {leaseDuration: 1m30s, renewDeadline: 1m0.5s, retryPeriod: 500ms}\n",
        lambda c: c.leader_election,
        LeaderElection(lease_duration=90.0, renew_deadline=60.5, retry_period=0.5),
    ),
    (
        "leader-elect-false-skips-ordering",
        "leaderElection: {leaderElect: false, leaseDuration: 1s, renewDeadline: 5s, "
        "retryPeriod: 0s, resourceName: ''}\n",
        lambda c: c.leader_election,
        LeaderElection(
            leader_elect=False,
            lease_duration=1.0,
            renew_deadline=5.0,
            retry_period=0.0,
            resource_name="",
        ),
    ),
    (
        "backoff-equal",
        "podInitialBackoffSeconds: 5\npodMaxBackoffSeconds: 5\n",
        lambda c: (c.pod_initial_backoff_seconds, c.pod_max_backoff_seconds),
        (5.0, 5.0),
    ),
    (
        "percentage-100",
        "percentageOfNodesToScore: 100\n",
        lambda c: c.percentage_of_nodes_to_score,
        100,
    ),
]


@pytest.mark.parametrize(
    ("body", "get", "expected"), [v[1:] for v in VALID], ids=[v[0] for v in VALID]
)
def test_valid_configs(
    body: str, get: Callable[[SchedulerConfiguration], Any], expected: Any
) -> None:
    assert get(parse_config(doc(body), "config.yaml")) == expected


DURATIONS = [
    ("0", 0.0),
    ("15s", 15.0),
    ("1m30s", 90.0),
    ("500ms", 0.5),
    ("1h", 3600.0),
    ("1.5s", 1.5),
    (".5s", 0.5),
    ("2us", 2e-6),
    ("2\u00b5s", 2e-6),
    ("100ns", 1e-7),
    ("+3s", 3.0),
    ("-3s", -3.0),
    ("1h2m3s4ms", 3723.004),
]


@pytest.mark.parametrize(("text", "seconds"), DURATIONS, ids=[d[0] for d in DURATIONS])
def test_go_durations(text: str, seconds: float) -> None:
    data = doc()
    data["leaderElection"] = {"leaderElect": False, "leaseDuration": text}
    got = parse_config(data).leader_election.lease_duration
    assert got == pytest.approx(seconds, abs=1e-12)


# --------------------------------------------------------------------------------------------
# Validation errors: exact one-line messages

TOP_FIELDS = (
    "apiVersion, clientConnection, delayCacheUntilActive, enableContentionProfiling, "
    "enableProfiling, extenders, healthzBindAddress, kind, leaderElection, metricsBindAddress, "
    "parallelism, percentageOfNodesToScore, podInitialBackoffSeconds, podMaxBackoffSeconds, "
    "profiles"
)
LE_FIELDS = (
    "leaderElect, leaseDuration, renewDeadline, resourceLock, resourceName, "
    "resourceNamespace, retryPeriod"
)
PROFILE_FIELDS = "percentageOfNodesToScore, pluginConfig, plugins, schedulerName"
POINTS = (
    "bind, filter, multiPoint, permit, postBind, postFilter, preBind, preFilter, preScore, "
    "queueSort, reserve, score"
)
V1 = '"kubescheduler.config.k8s.io/v1"'
P0 = "profiles[0]"
SCORE = f"{P0}.plugins.score"


def prof(body: str) -> str:
    """A one-profile document body whose profile is ``body`` (a YAML flow mapping)."""
    return f"profiles:\n- {body}\n"


ERRORS: list[tuple[str, Any, str]] = [
    # document and type meta
    ("root-not-mapping", [1], "must be a KubeSchedulerConfiguration mapping, got a list"),
    ("root-null", None, "must be a KubeSchedulerConfiguration mapping, got null"),
    (
        "apiversion-missing",
        {"kind": "KubeSchedulerConfiguration"},
        f"apiVersion: missing; must be {V1}",
    ),
    (
        "apiversion-v1beta3",
        {"apiVersion": "kubescheduler.config.k8s.io/v1beta3", "kind": "KubeSchedulerConfiguration"},
        f'apiVersion: must be {V1}, got "kubescheduler.config.k8s.io/v1beta3"',
    ),
    (
        "kind-missing",
        {"apiVersion": "kubescheduler.config.k8s.io/v1"},
        'kind: missing; must be "KubeSchedulerConfiguration"',
    ),
    (
        "kind-wrong",
        {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "Pod"},
        'kind: must be "KubeSchedulerConfiguration", got "Pod"',
    ),
    # top level
    (
        "unknown-top-level",
        "schedulerName: x\n",
        f"schedulerName: unknown field (known: {TOP_FIELDS})",
    ),
    (
        "client-connection-unknown",
        "clientConnection: {timeout: 5}\n",
        "clientConnection.timeout: unknown field "
        "(known: acceptContentTypes, burst, contentType, kubeconfig, qps)",
    ),
    (
        "client-connection-list",
        "clientConnection: []\n",
        "clientConnection: must be a mapping, got a list",
    ),
    (
        "profiling-not-bool",
        "enableProfiling: 'yes'\n",
        'enableProfiling: must be true or false, got "yes"',
    ),
    (
        "healthz-not-string",
        "healthzBindAddress: 10251\n",
        "healthzBindAddress: must be a string, got 10251",
    ),
    (
        "extenders-non-empty",
        "extenders: [{urlPrefix: http://x}]\n",
        "extenders: not supported by koord-scheduler; remove the extenders",
    ),
    ("extenders-not-list", "extenders: {}\n", "extenders: must be a list, got a mapping"),
    ("parallelism-zero", "parallelism: 0\n", "parallelism: must be a positive integer, got 0"),
    (
        "parallelism-bool",
        "parallelism: true\n",
        "parallelism: must be a positive integer, got true",
    ),
    (
        "percentage-101",
        "percentageOfNodesToScore: 101\n",
        "percentageOfNodesToScore: must be an integer between 0 and 100, got 101",
    ),
    (
        "percentage-negative",
        "percentageOfNodesToScore: -1\n",
        "percentageOfNodesToScore: must be an integer between 0 and 100, got -1",
    ),
    (
        "percentage-string",
        "percentageOfNodesToScore: '50'\n",
        'percentageOfNodesToScore: must be an integer between 0 and 100, got "50"',
    ),
    (
        "percentage-float",
        "percentageOfNodesToScore: 50.5\n",
        "percentageOfNodesToScore: must be an integer between 0 and 100, got 50.5",
    ),
    (
        "percentage-bool",
        "percentageOfNodesToScore: false\n",
        "percentageOfNodesToScore: must be an integer between 0 and 100, got false",
    ),
    # backoff
    (
        "initial-backoff-zero",
        "podInitialBackoffSeconds: 0\n",
        "podInitialBackoffSeconds: must be a positive integer (seconds), got 0",
    ),
    (
        "initial-backoff-float",
        "podInitialBackoffSeconds: 1.5\n",
        "podInitialBackoffSeconds: must be a positive integer (seconds), got 1.5",
    ),
    (
        "max-backoff-negative",
        "podMaxBackoffSeconds: -10\n",
        "podMaxBackoffSeconds: must be a positive integer (seconds), got -10",
    ),
    (
        "max-below-initial",
        "podInitialBackoffSeconds: 5\npodMaxBackoffSeconds: 2\n",
        "podMaxBackoffSeconds: must be greater than or equal to podInitialBackoffSeconds (5), "
        "got 2",
    ),
    (
        "initial-above-default-max",
        "podInitialBackoffSeconds: 20\n",
        "podMaxBackoffSeconds: must be greater than or equal to podInitialBackoffSeconds (20), "
        "got 10",
    ),
    # leader election
    ("le-not-mapping", "leaderElection: true\n", "leaderElection: must be a mapping, got true"),
    (
        "le-unknown-field",
        "leaderElection: {lockName: x}\n",
        f"leaderElection.lockName: unknown field (known: {LE_FIELDS})",
    ),
    (
        "le-leader-elect-string",
        "leaderElection: {leaderElect: 'true'}\n",
        'leaderElection.leaderElect: must be true or false, got "true"',
    ),
    (
        "le-duration-integer",
        "leaderElection: {leaseDuration: 15}\n",
        'leaderElection.leaseDuration: must be a duration such as "15s" or "1m30s", got 15',
    ),
    (
        "le-duration-no-unit",
        "leaderElection: {renewDeadline: '10'}\n",
        'leaderElection.renewDeadline: must be a duration such as "15s" or "1m30s", got "10"',
    ),
    (
        "le-duration-bad-unit",
        "leaderElection: {retryPeriod: 2d}\n",
        'leaderElection.retryPeriod: must be a duration such as "15s" or "1m30s", got "2d"',
    ),
    (
        "le-duration-empty",
        "leaderElection: {retryPeriod: ''}\n",
        'leaderElection.retryPeriod: must be a duration such as "15s" or "1m30s", got ""',
    ),
    (
        "le-retry-zero",
        "leaderElection: {retryPeriod: 0s}\n",
        "leaderElection.retryPeriod: must be greater than 0, got 0s",
    ),
    (
        "le-retry-negative",
        "leaderElection: {retryPeriod: -1s}\n",
        "leaderElection.retryPeriod: must be greater than 0, got -1s",
    ),
    (
        "le-renew-not-above-retry",
        "leaderElection: {renewDeadline: 2s}\n",
        "leaderElection.renewDeadline: must be greater than retryPeriod (2s), got 2s",
    ),
    (
        "le-lease-not-above-renew",
        "leaderElection: {leaseDuration: 10s}\n",
        "leaderElection.leaseDuration: must be greater than renewDeadline (10s), got 10s",
    ),
    (
        "le-lease-below-renew-ms",
        "leaderElection: {leaseDuration: 1500ms, renewDeadline: 2s, retryPeriod: 500ms}\n",
        "leaderElection.leaseDuration: must be greater than renewDeadline (2s), got 1.5s",
    ),
    (
        "le-resource-lock",
        "leaderElection: {resourceLock: endpointsleases}\n",
        'leaderElection.resourceLock: only "leases" is supported, got "endpointsleases"',
    ),
    (
        "le-resource-name-empty",
        "leaderElection: {resourceName: ''}\n",
        "leaderElection.resourceName: must not be empty when leaderElect is true",
    ),
    (
        "le-resource-namespace-empty",
        "leaderElection: {resourceNamespace: ''}\n",
        "leaderElection.resourceNamespace: must not be empty when leaderElect is true",
    ),
    # profiles
    (
        "profiles-not-list",
        "profiles: {schedulerName: a}\n",
        "profiles: must be a list, got a mapping",
    ),
    ("profile-null", "profiles: [null]\n", f"{P0}: must be a mapping, got null"),
    ("profile-string", "profiles: [koord]\n", f'{P0}: must be a mapping, got "koord"'),
    (
        "profile-unknown-field",
        prof("{schedulerName: a, nodeSelector: {}}"),
        f"{P0}.nodeSelector: unknown field (known: {PROFILE_FIELDS})",
    ),
    (
        "scheduler-name-empty",
        prof("{schedulerName: ''}"),
        f'{P0}.schedulerName: must be a non-empty string, got ""',
    ),
    (
        "scheduler-name-number",
        prof("{schedulerName: 5}"),
        f"{P0}.schedulerName: must be a non-empty string, got 5",
    ),
    (
        "scheduler-name-duplicate",
        "profiles: [{schedulerName: a}, {schedulerName: b}, {schedulerName: a}]\n",
        'profiles[2].schedulerName: duplicate schedulerName "a" (also profiles[0])',
    ),
    (
        "scheduler-name-duplicate-default",
        "profiles: [{}, {}]\n",
        'profiles[1].schedulerName: duplicate schedulerName "koord-scheduler" (also profiles[0])',
    ),
    (
        "profile-percentage",
        prof("{percentageOfNodesToScore: 101}"),
        f"{P0}.percentageOfNodesToScore: must be an integer between 0 and 100, got 101",
    ),
    # plugins
    ("plugins-list", prof("{plugins: []}"), f"{P0}.plugins: must be a mapping, got a list"),
    (
        "plugins-unknown-point",
        prof("{plugins: {normalizeScore: {}}}"),
        f"{P0}.plugins.normalizeScore: unknown field (known: {POINTS})",
    ),
    (
        "plugins-pre-enqueue",
        prof("{plugins: {preEnqueue: {}}}"),
        f"{P0}.plugins.preEnqueue: not supported "
        "(koord-scheduler has no PreEnqueue extension point)",
    ),
    (
        "plugin-set-unknown-key",
        prof("{plugins: {score: {enable: []}}}"),
        f"{SCORE}.enable: unknown field (known: disabled, enabled)",
    ),
    (
        "plugin-set-not-mapping",
        prof("{plugins: {score: [DeviceShare]}}"),
        f"{SCORE}: must be a mapping, got a list",
    ),
    (
        "enabled-not-list",
        prof("{plugins: {score: {enabled: {name: A}}}}"),
        f"{SCORE}.enabled: must be a list, got a mapping",
    ),
    (
        "plugin-entry-string",
        prof("{plugins: {score: {enabled: [DeviceShare]}}}"),
        f'{SCORE}.enabled[0]: must be a mapping, got "DeviceShare"',
    ),
    (
        "plugin-entry-null",
        prof("{plugins: {score: {disabled: [null]}}}"),
        f"{SCORE}.disabled[0]: must be a mapping, got null",
    ),
    (
        "plugin-entry-unknown-field",
        prof("{plugins: {score: {enabled: [{name: A, args: {}}]}}}"),
        f"{SCORE}.enabled[0].args: unknown field (known: name, weight)",
    ),
    (
        "plugin-name-missing",
        prof("{plugins: {score: {enabled: [{weight: 1}]}}}"),
        f"{SCORE}.enabled[0].name: missing; every plugin needs a name",
    ),
    (
        "plugin-name-empty",
        prof("{plugins: {score: {disabled: [{name: ''}]}}}"),
        f'{SCORE}.disabled[0].name: must be a non-empty string, got ""',
    ),
    (
        "plugin-name-star-enabled",
        prof("{plugins: {score: {enabled: [{name: '*'}]}}}"),
        f'{SCORE}.enabled[0].name: "*" is only allowed in a disabled list',
    ),
    (
        "plugin-weight-negative",
        prof("{plugins: {score: {enabled: [{name: A}, {name: B, weight: -1}]}}}"),
        f"{SCORE}.enabled[1].weight: must be a non-negative integer, got -1",
    ),
    (
        "plugin-weight-bool",
        prof("{plugins: {score: {enabled: [{name: A, weight: true}]}}}"),
        f"{SCORE}.enabled[0].weight: must be a non-negative integer, got true",
    ),
    (
        "plugin-weight-float",
        prof("{plugins: {score: {enabled: [{name: A, weight: 1.5}]}}}"),
        f"{SCORE}.enabled[0].weight: must be a non-negative integer, got 1.5",
    ),
    (
        "plugin-weight-over-int32",
        prof("{plugins: {score: {enabled: [{name: A, weight: 2147483648}]}}}"),
        f"{SCORE}.enabled[0].weight: must be a non-negative integer, got 2147483648",
    ),
    (
        "plugin-duplicate-enabled",
        prof("{plugins: {filter: {enabled: [{name: A}, {name: B}, {name: A}]}}}"),
        f'{P0}.plugins.filter.enabled[2].name: duplicate plugin "A" (also '
        f"{P0}.plugins.filter.enabled[0])",
    ),
    # pluginConfig
    (
        "plugin-config-not-list",
        prof("{pluginConfig: {name: A}}"),
        f"{P0}.pluginConfig: must be a list, got a mapping",
    ),
    (
        "plugin-config-unknown-field",
        prof("{pluginConfig: [{name: A, weight: 1}]}"),
        f"{P0}.pluginConfig[0].weight: unknown field (known: args, name)",
    ),
    (
        "plugin-config-name-missing",
        prof("{pluginConfig: [{args: {}}]}"),
        f"{P0}.pluginConfig[0].name: missing; every pluginConfig entry needs a plugin name",
    ),
    (
        "plugin-config-name-empty",
        prof("{pluginConfig: [{name: ''}]}"),
        f'{P0}.pluginConfig[0].name: must be a non-empty string, got ""',
    ),
    (
        "plugin-config-duplicate",
        prof("{pluginConfig: [{name: A}, {name: B}, {name: A, args: {x: 1}}]}"),
        f'{P0}.pluginConfig[2].name: duplicate pluginConfig for plugin "A" '
        f"(also {P0}.pluginConfig[0])",
    ),
    (
        "plugin-config-args-list",
        prof("{pluginConfig: [{name: A, args: [1]}]}"),
        f"{P0}.pluginConfig[0].args: must be a mapping, got a list",
    ),
    (
        "plugin-config-args-string",
        prof("{pluginConfig: [{name: A, args: x}]}"),
        f'{P0}.pluginConfig[0].args: must be a mapping, got "x"',
    ),
    (
        "plugin-config-args-int-key",
        prof("{pluginConfig: [{name: A, args: {1: x}}]}"),
        f"{P0}.pluginConfig[0].args: keys must be strings, got 1",
    ),
]


@pytest.mark.parametrize(("data", "message"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_validation_errors(data: Any, message: str) -> None:
    if isinstance(data, str):
        data = doc(data)
    with pytest.raises(ConfigError) as info:
        parse_config(data, "config.yaml")
    assert str(info.value) == f"config.yaml: {message}"
    assert "\n" not in str(info.value)


def test_error_fields_and_default_source() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(doc("parallelism: -2\n"))
    err = info.value
    assert isinstance(err, ValueError)
    assert (err.source, err.path, err.problem) == (
        "<config>",
        "parallelism",
        "must be a positive integer, got -2",
    )
    assert str(err) == "<config>: parallelism: must be a positive integer, got -2"


# --------------------------------------------------------------------------------------------
# Files

FILE_ERRORS: list[tuple[str, bytes | None, str]] = [
    (
        "malformed-yaml",
        HEADER.encode() + b"profiles:\n  - a: [\n",
        "line 5, column 1: invalid YAML: expected the node content, but found '<stream end>'",
    ),
    (
        "bad-indentation",
        b"apiVersion: x\n  kind: y\n",
        "line 2, column 7: invalid YAML: mapping values are not allowed here",
    ),
    (
        "duplicate-key",
        HEADER.encode() + b"parallelism: 1\nparallelism: 2\n",
        'line 4, column 1: invalid YAML: duplicate key "parallelism"',
    ),
    (
        "duplicate-nested-key",
        HEADER.encode() + b"leaderElection:\n  leaderElect: true\n  leaderElect: false\n",
        'line 5, column 3: invalid YAML: duplicate key "leaderElect"',
    ),
    (
        "two-documents",
        HEADER.encode() + b"---\n" + HEADER.encode(),
        "line 3, column 1: invalid YAML: expected a single document in the stream, "
        "but found another document",
    ),
    ("empty-file", b"", "file is empty; expected a KubeSchedulerConfiguration"),
    ("comments-only", b"# nothing\n", "file is empty; expected a KubeSchedulerConfiguration"),
    ("not-utf8", HEADER.encode() + b"x: \xff\n", "not valid UTF-8 text: invalid start byte"),
    ("missing-file", None, "cannot read file: No such file or directory"),
    ("wrong-kind", b"apiVersion: v1\nkind: Pod\n", f'apiVersion: must be {V1}, got "v1"'),
]


@pytest.mark.parametrize(
    ("content", "message"), [f[1:] for f in FILE_ERRORS], ids=[f[0] for f in FILE_ERRORS]
)
def test_load_config_errors(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "scheduler.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert text == f"{path}: {message}"
    assert type(info.value) is ConfigError


def test_load_config_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r": cannot read file: Is a directory$"):
        load_config(tmp_path)


def test_load_config_reads_yaml(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(HEADER + "profiles: [{schedulerName: a}]\n", encoding="utf-8")
    assert load_config(str(path)) == SchedulerConfiguration(profiles=(Profile("a"),))


def test_shipped_config_loads() -> None:
    cfg = load_config(REPO_ROOT / "config" / "scheduler-config.yaml")
    assert cfg.leader_election == LeaderElection(
        leader_elect=True, resource_name="koord-scheduler", resource_namespace="kube-system"
    )
    assert cfg.percentage_of_nodes_to_score == 0
    profile = cfg.profile("koord-scheduler")
    assert [p.scheduler_name for p in cfg.profiles] == ["koord-scheduler"]
    # DeviceShare is among the registry's default plugins; the file only sets its args.
    assert profile.plugins == Plugins()
    resources = [
        "koordinator.sh/gpu-memory-ratio",
        "koordinator.sh/gpu-memory",
        "koordinator.sh/rdma",
        "koordinator.sh/fpga",
    ]
    assert profile.args_for("DeviceShare") == {
        "scoringStrategy": {
            "type": "LeastAllocated",
            "resources": [{"name": name, "weight": 1} for name in resources],
        }
    }


# --------------------------------------------------------------------------------------------
# The model


def test_default_config() -> None:
    cfg = default_config()
    assert cfg.profiles == (Profile(),)
    assert cfg.profiles[0].scheduler_name == "koord-scheduler"
    assert all(getattr(cfg.profiles[0].plugins, n) == PluginSet() for n in Plugins.EXTENSION_POINTS)
    assert (cfg.percentage_of_nodes_to_score, cfg.parallelism) == (0, 16)
    assert (cfg.pod_initial_backoff_seconds, cfg.pod_max_backoff_seconds) == (1.0, 10.0)
    assert cfg.leader_election == LeaderElection()


def test_extension_points_are_the_fields_in_order() -> None:
    names = [f.name for f in dataclasses.fields(Plugins)]
    assert list(Plugins.EXTENSION_POINTS) == [n for n in names if n != "multi_point"]


def test_profile_lookup_and_args_for() -> None:
    cfg = parse_config(doc(prof("{schedulerName: a, pluginConfig: [{name: X, args: {k: v}}]}")))
    assert cfg.profile("a").args_for("X") == {"k": "v"}
    assert cfg.profile("a").args_for("Y") == {}
    with pytest.raises(KeyError, match="no profile with schedulerName 'b'"):
        cfg.profile("b")


def test_args_are_a_read_only_private_copy() -> None:
    data = doc(prof("{pluginConfig: [{name: X, args: {list: [1], nested: {a: 1}}}]}"))
    args = parse_config(data).profiles[0].args_for("X")
    data["profiles"][0]["pluginConfig"][0]["args"]["nested"]["a"] = 2
    data["profiles"][0]["pluginConfig"][0]["args"]["list"].append(2)
    assert args == {"list": [1], "nested": {"a": 1}}
    with pytest.raises(TypeError):
        args["new"] = 1  # type: ignore[index]


def test_dataclasses_are_frozen_and_hashable() -> None:
    cfg = load_config(REPO_ROOT / "config" / "scheduler-config.yaml")
    with pytest.raises(AttributeError):
        cfg.parallelism = 1  # type: ignore[misc]
    assert hash(cfg) == hash(load_config(REPO_ROOT / "config" / "scheduler-config.yaml"))
    assert PluginConfig("X", {"a": 1}) == PluginConfig("X", {"a": 1})


# --------------------------------------------------------------------------------------------
# merge_plugin_set / merge_plugins: kube-scheduler's TestMergePlugins cases (v1)

MERGE_SET: list[tuple[str, PluginSet, PluginSet, PluginSet]] = [
    (
        "AppendCustomPlugin",
        pset("DefaultPlugin1 DefaultPlugin2"),
        pset("CustomPlugin"),
        pset("DefaultPlugin1 DefaultPlugin2 CustomPlugin"),
    ),
    (
        "InsertAfterDefaultPlugins2",
        pset("DefaultPlugin1 DefaultPlugin2"),
        pset("CustomPlugin DefaultPlugin2", "DefaultPlugin2"),
        pset("DefaultPlugin1 CustomPlugin DefaultPlugin2", "DefaultPlugin2"),
    ),
    (
        "InsertBeforeAllPlugins",
        pset("DefaultPlugin1 DefaultPlugin2"),
        pset("CustomPlugin DefaultPlugin1 DefaultPlugin2", "*"),
        pset("CustomPlugin DefaultPlugin1 DefaultPlugin2", "*"),
    ),
    (
        "ReorderDefaultPlugins",
        pset("DefaultPlugin1 DefaultPlugin2"),
        pset("DefaultPlugin2 DefaultPlugin1", "*"),
        pset("DefaultPlugin2 DefaultPlugin1", "*"),
    ),
    (
        "ApplyEmptyCustomPlugin",
        pset("DefaultPlugin1 DefaultPlugin2"),
        pset(),
        pset("DefaultPlugin1 DefaultPlugin2"),
    ),
    (
        "CustomPluginOverrideDefaultPlugin",
        pset("Plugin1 Plugin2 Plugin3"),
        pset("Plugin1=2 Plugin3=3"),
        pset("Plugin1=2 Plugin2 Plugin3=3"),
    ),
    (
        "OrderPreserveAfterOverride",
        pset("Plugin1 Plugin2 Plugin3"),
        pset("Plugin2=2 Plugin1=1"),
        pset("Plugin1=1 Plugin2=2 Plugin3"),
    ),
    (
        "RepeatedCustomPlugin",
        pset("Plugin1 Plugin2 Plugin3"),
        pset("Plugin1 Plugin2=2 Plugin3 Plugin2=4"),
        pset("Plugin1 Plugin2=4 Plugin3 Plugin2=2"),
    ),
    (
        "DisabledInDefaultSet",
        pset("DefaultPlugin", "DefaultPlugin2"),
        pset("CustomPlugin"),
        pset("DefaultPlugin CustomPlugin", "DefaultPlugin2"),
    ),
    (
        "OnlyDisabledGetsMerged",
        pset("DefaultPlugin"),
        pset(disabled="DefaultPlugin"),
        pset(disabled="DefaultPlugin"),
    ),
    (
        "DisabledCustomThenDefaultWeightsDropped",
        pset("A B C", "Z=4"),
        pset(disabled="B=7 Y"),
        pset("A C", "B Y Z"),
    ),
    (
        "StarInDefaultDisabled",
        pset("A B", "*"),
        pset("C"),
        pset("C", "*"),
    ),
]


@pytest.mark.parametrize(
    ("default", "custom", "expected"), [m[1:] for m in MERGE_SET], ids=[m[0] for m in MERGE_SET]
)
def test_merge_plugin_set(default: PluginSet, custom: PluginSet, expected: PluginSet) -> None:
    assert merge_plugin_set(default, custom) == expected


MERGE_PLUGINS: list[tuple[str, Plugins, Plugins, Plugins]] = [
    (
        "Append custom MultiPoint plugin",
        Plugins(multi_point=pset("DefaultPlugin1 DefaultPlugin2")),
        Plugins(multi_point=pset("CustomPlugin")),
        Plugins(multi_point=pset("DefaultPlugin1 DefaultPlugin2 CustomPlugin")),
    ),
    (
        "Append disabled Multipoint plugins",
        Plugins(multi_point=pset("DefaultPlugin1 DefaultPlugin2")),
        Plugins(
            multi_point=pset("CustomPlugin CustomPlugin2", "DefaultPlugin2"),
            score=pset(disabled="CustomPlugin2"),
        ),
        Plugins(
            multi_point=pset("DefaultPlugin1 CustomPlugin CustomPlugin2", "DefaultPlugin2"),
            score=pset(disabled="CustomPlugin2"),
        ),
    ),
    (
        "override default MultiPoint plugins with custom value",
        Plugins(multi_point=pset("DefaultPlugin")),
        Plugins(multi_point=pset("DefaultPlugin=5")),
        Plugins(multi_point=pset("DefaultPlugin=5")),
    ),
    (
        "disabled MultiPoint plugin in default set for specific extension point",
        Plugins(multi_point=pset("DefaultPlugin"), score=pset(disabled="DefaultPlugin2")),
        Plugins(multi_point=pset("CustomPlugin")),
        Plugins(
            multi_point=pset("DefaultPlugin CustomPlugin"), score=pset(disabled="DefaultPlugin2")
        ),
    ),
    (
        "every extension point",
        Plugins(**{n: pset("Core") for n in Plugins.EXTENSION_POINTS}),
        Plugins(
            filter=pset("DeviceShare"), score=pset("DeviceShare=2", "Core"), bind=pset("B", "*")
        ),
        Plugins(
            **{n: pset("Core") for n in Plugins.EXTENSION_POINTS}
            | {
                "filter": pset("Core DeviceShare"),
                "score": pset("DeviceShare=2", "Core"),
                "bind": pset("B", "*"),
            }
        ),
    ),
]


@pytest.mark.parametrize(
    ("default", "custom", "expected"),
    [m[1:] for m in MERGE_PLUGINS],
    ids=[m[0] for m in MERGE_PLUGINS],
)
def test_merge_plugins(default: Plugins, custom: Plugins, expected: Plugins) -> None:
    assert merge_plugins(default, custom) == expected


# --------------------------------------------------------------------------------------------
# num_feasible_nodes_to_find: kube-scheduler's adaptive sampling

FEASIBLE: list[tuple[str, int, int, int]] = [
    ("empty-cluster", 0, 0, 0),
    ("50-nodes-all", 0, 50, 50),
    ("99-nodes-pct-10-all", 10, 99, 99),
    ("100-nodes-adaptive", 0, 100, 100),
    ("500-nodes-adaptive-46pct", 0, 500, 230),
    ("1000-nodes-adaptive-42pct", 0, 1000, 420),
    ("5000-nodes-adaptive-10pct", 0, 5000, 500),
    ("6000-nodes-adaptive-floor-5pct", 0, 6000, 300),
    ("10000-nodes-adaptive-floor-5pct", 0, 10000, 500),
    ("200-nodes-pct-10-floor-100", 10, 200, 100),
    ("1000-nodes-pct-30", 30, 1000, 300),
    ("1000-nodes-pct-1-floor-100", 1, 1000, 100),
    ("1000-nodes-pct-100-all", 100, 1000, 1000),
    ("1001-nodes-pct-50-truncates", 50, 1001, 500),
]


@pytest.mark.parametrize(
    ("percentage", "nodes", "expected"), [f[1:] for f in FEASIBLE], ids=[f[0] for f in FEASIBLE]
)
def test_num_feasible_nodes_to_find(percentage: int, nodes: int, expected: int) -> None:
    assert num_feasible_nodes_to_find(percentage, nodes) == expected


def test_multi_point_disabled_turns_a_default_plugin_off_everywhere() -> None:
    """kube-scheduler v1: ``multiPoint: {disabled: [X]}`` removes the default plugin X from
    every extension point; a plugin enabled explicitly at one point stays there."""
    from scheduler.framework.interfaces import Handle
    from scheduler.framework.runtime import Framework
    from scheduler.framework.types import Snapshot
    from scheduler.plugins.registry import default_plugins, in_tree_registry

    def profile(plugins: dict[str, Any]) -> Framework:
        config = parse_config(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "profiles": [{"schedulerName": "koord-scheduler", "plugins": plugins}],
            }
        )
        return Framework(
            config.profiles[0],
            in_tree_registry(),
            Handle(Snapshot(), None, None),
            default_plugins(),
        )

    off = profile({"multiPoint": {"disabled": [{"name": "DeviceShare"}]}})
    for ep in ("pre_filter", "filter", "pre_score", "score", "reserve", "pre_bind"):
        assert "DeviceShare" not in off.plugins_at(ep), ep
    assert "NodeResourcesFit" in off.plugins_at("filter")
    back = profile(
        {
            "multiPoint": {"disabled": [{"name": "DeviceShare"}]},
            "filter": {"enabled": [{"name": "DeviceShare"}]},
        }
    )
    assert "DeviceShare" in back.plugins_at("filter")
    assert "DeviceShare" not in back.plugins_at("score")
    everything = profile(
        {
            "multiPoint": {"disabled": [{"name": "*"}]},
            "queueSort": {"enabled": [{"name": "PrioritySort"}]},
            "bind": {"enabled": [{"name": "DefaultBinder"}]},
        }
    )
    assert everything.plugins_at("filter") == []


@pytest.mark.parametrize(
    "source",
    [
        None,
        "config/scheduler-config.yaml",
        "config/examples/demo-topology-config.yaml",
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "percentageOfNodesToScore": 30,
            "podMaxBackoffSeconds": 20,
            "leaderElection": {"leaseDuration": "1m30s", "renewDeadline": "45.5s"},
            "profiles": [
                {
                    "schedulerName": "a",
                    "plugins": {
                        "multiPoint": {"disabled": [{"name": "DeviceShare"}]},
                        "score": {"enabled": [{"name": "NodeResourcesFit", "weight": 7}]},
                    },
                },
                {"schedulerName": "b", "percentageOfNodesToScore": 5},
            ],
        },
    ],
    ids=["defaults", "shipped-file", "topology-demo", "custom"],
)
def test_the_written_effective_configuration_loads_back_the_same(source: Any) -> None:
    """``--write-config-to``: the document, loaded again, runs exactly the same profiles."""
    from pathlib import Path

    from scheduler.config.encode import effective_config_document
    from scheduler.framework.interfaces import Handle
    from scheduler.framework.runtime import Framework
    from scheduler.framework.types import Snapshot
    from scheduler.plugins.registry import default_plugins, in_tree_registry

    root = Path(__file__).resolve().parents[2]
    if source is None:
        config = parse_config(
            {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}
        )
    elif isinstance(source, str):
        config = load_config(root / source)
    else:
        config = parse_config(source)
    written = yaml.safe_load(yaml.safe_dump(effective_config_document(config, default_plugins())))
    again = parse_config(written)

    def shape(cfg: Any) -> Any:
        out = []
        for profile in cfg.profiles:
            fwk = Framework(
                profile, in_tree_registry(), Handle(Snapshot(), None, None), default_plugins()
            )
            points = {ep: fwk.plugins_at(ep) for ep in Plugins.EXTENSION_POINTS}
            out.append(
                (
                    profile.scheduler_name,
                    profile.percentage_of_nodes_to_score,
                    points,
                    dict(fwk.score_weights),
                    [(c.name, dict(c.args)) for c in profile.plugin_config],
                )
            )
        return (
            out,
            cfg.leader_election,
            cfg.percentage_of_nodes_to_score,
            (cfg.pod_initial_backoff_seconds, cfg.pod_max_backoff_seconds, cfg.parallelism),
        )

    assert shape(again) == shape(config)
