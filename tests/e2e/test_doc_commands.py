"""Every shell command of README.md and docs/*.md runs as written, or says why it cannot here.

``doc_commands.py`` extracts the commands (fenced ``sh``/``bash``/``shell`` blocks, ``$ `` lines
of ``console`` blocks). Each one is in exactly one of two tables below:

- ``RUN``: run here, in the order of its document, in a copy of the repository (outputs stay
  there), ``HOME`` a fresh directory whose ``~/.kube/config`` points at a real kube-apiserver
  v1.20.2 (this module's own, with the Device CRD and the demo cluster's Nodes, Devices and
  Pods, and a pending ``ml/train-7``), ``~/.cache`` the user's (the cached tool downloads),
  ``PATH`` starting with the project's virtual environment's ``bin`` (as after
  ``source .venv/bin/activate``) and Debian's kubectl 1.20 (``hack/kubectl.sh``). The commands
  of one block share one shell's state (``cd``, variables). Each must exit 0; a ``Run`` can
  ask for more (``expect``: lines of the output; ``documented_output``: the console block's
  output, line by line; ``serves``: a long-running command must answer that URL, then stop
  with 0 on SIGTERM) or fill in a synopsis' placeholders (``fill``, each must be in the text);
- ``CANNOT_RUN``: the reason it cannot run here (root, a GPU, a container runtime, hours).

A command in neither table, or in both, or a table entry no document has any more, fails
``test_every_documented_command_is_run_or_excused`` with the one line to add or remove; so does
an untagged block that holds a command (tag it). Inline mentions in prose (``make lint``,
``koordlet run --fake-gpus``) are not run; ``test_inline_commands_name_real_targets_...``
checks that their Makefile target, subcommand and flags exist. The runnable set: about 75 s of
commands (``make demo`` 11 s) and 25 s of set-up, measured on 2 busy cores.
"""

# ruff: noqa: E501  (the tables keep one documented command per line, as written)
from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from apiserver import ApiServer
from doc_commands import ROOT, Command, commands, docs, inline_commands, untagged_commands
from prometheus import hack_values

HERE = "tests/e2e/test_doc_commands.py"
COMMAND_TIMEOUT_S = 180
SERVE_TIMEOUT_S = 60


@dataclass(frozen=True)
class Run:
    fill: tuple[tuple[str, str], ...] = ()  # (placeholder, value), applied in order
    expect: tuple[str, ...] = ()  # each a substring of some line of stdout
    documented_output: bool = False  # the console block's output lines appear in stdout in order
    serves: str | None = None  # long-running: this URL answers 200, then SIGTERM -> exit 0


KUBECTL_APPLY = Run(expect=("customresourcedefinition.apiextensions.k8s.io/devices.scheduling",))
IMAGE = "needs root, apt (debootstrap, podman), Debian's mirror and PyPI; tests/e2e/test_manifests_image.py builds it where it can"
REGISTRY = "needs the built image and a registry of the reader's (REGISTRY)"
CHAOS = "the chaos tier (its own API servers, fault proxies, a fault schedule of minutes); never beside another run"
B3_FULL = "replays the full openb trace once per seed and profile (60 replays, each ~9 s at --jobs 2 on 2 cores); B3 in docs/benchmarks.md"
WEBHOOK = "registers fail-closed admission webhooks for a webhook Deployment that cannot start here (no kubelet, no controller-manager), after which every pod write of the other commands would be refused; tests/e2e/test_webhook.py registers exactly these configurations against a running webhook"
DASK = "a Dask cluster across machines, or the B3 replays on it (minutes to hours); tests/integration/test_simulate_dask.py runs a real scheduler and two workers on loopback"
B3_VAR = "sets $T for the B3 runs of its block, which cannot run here"

# fmt: off
# Commands run here (see the module docstring). A NEW runnable command: one line,
#     ("docs/x.md", "the command, words separated by single spaces"): Run(),
RUN: dict[tuple[str, str], Run] = {
    ("README.md", "make demo"): Run(
        expect=("PLACEMENTS", "UNSCHEDULABLE", "GPU CARDS", "SUMMARY", "PREEMPTIONS")
    ),
    ("README.md", ".venv/bin/koord-scheduler simulate my-cluster.yaml [--config scheduler-config.yaml] [-o table|yaml|json] [--seed N]"): Run(
        fill=(
            ("my-cluster.yaml", "config/examples/demo-cluster.yaml"),
            ("[--config scheduler-config.yaml]", "--config config/scheduler-config.yaml"),
            ("[-o table|yaml|json]", "-o yaml"),
            ("[--seed N]", "--seed 7"),
        ),
        expect=("nodeName: gpu-", "scheduling.koordinator.sh/device-allocated"),
    ),
    ("README.md", "kubectl apply -k config/"): KUBECTL_APPLY,
    ("docs/fuzzing.md", "make fuzz TARGET=fairshare-request FUZZ_SECONDS=5"): Run(),
    ("README.md", ".venv/bin/koord-scheduler run --kubeconfig ~/.kube/config --config config/scheduler-config.yaml"): Run(
        serves="https://127.0.0.1:10259/readyz"
    ),
    ("README.md", ".venv/bin/koord-scheduler inspect [NODE] --kubeconfig ~/.kube/config"): Run(
        fill=(("[NODE]", "gpu-t4-0"),), expect=("gpu-t4-0",)
    ),
    ("README.md", ".venv/bin/koord-scheduler extender --kubeconfig ~/.kube/config --extender-port 39999"): Run(
        serves="http://127.0.0.1:39999/version"
    ),
    ("docs/gpushare.md", "kubectl inspect gpushare"): Run(
        expect=("IPADDRESS", "Allocated/Total GPU Memory In Cluster:")
    ),
    ("docs/gpushare.md", "kubectl inspect gpushare -d gpu-a"): Run(
        fill=(("gpu-a", "gpu-t4-0"),), expect=("Allocated/Total GPU Memory In Cluster:",)
    ),
    ("docs/operations.md", "kubectl apply -k config/"): KUBECTL_APPLY,
    ("docs/operations.md", "kubectl apply -k config/overlays/scheduler-only"): KUBECTL_APPLY,
    ("docs/operations.md", "kubectl apply -k config/overlays/agent"): KUBECTL_APPLY,
    ("docs/operations.md", "eval $(bash hack/prometheus.sh)"): Run(),
    ("docs/operations.md", "$PROMTOOL_BIN check rules config/prometheus/rules.yaml"): Run(
        expect=("SUCCESS",)
    ),
    ("docs/operations.md", "cd config/prometheus && $PROMTOOL_BIN test rules rules_test.yaml"): Run(
        expect=("SUCCESS",)
    ),
    ("docs/operations.md", "koord-scheduler explain ml/train-7"): Run(expect=("ml/train-7",)),
    ("docs/operations.md", "koord-scheduler explain ml/train-7 -o json"): Run(
        expect=('"ml/train-7"',)
    ),
    ("docs/operations.md", "koord-scheduler explain ml/train-7 --file scenario.yaml --file result.yaml"): Run(
        expect=("ml/train-7",)
    ),
    ("docs/operations.md", "koord-scheduler webhook certs --service koord-webhook --namespace koordinator-system --out certs/ > ca-bundle.txt"): Run(),
    ("docs/operations.md", "kubectl create namespace koordinator-system --dry-run=client -o yaml | kubectl apply -f -"): Run(),
    ("docs/operations.md", "kubectl -n koordinator-system create secret tls koord-webhook-tls --cert=certs/tls.crt --key=certs/tls.key"): Run(
        expect=("secret/koord-webhook-tls created",)
    ),
    ("docs/operations.md", "kubectl label namespace kube-system koordinator.sh/webhook=disabled"): Run(
        expect=("namespace/kube-system labeled",)
    ),
    ("docs/preemption.md", "koord-scheduler simulate config/examples/demo-preemption.yaml"): Run(
        documented_output=True
    ),
}

# Commands that cannot run here, with the reason. A NEW one: one line,
#     ("docs/x.md", "the command, words separated by single spaces"): "why not here",
CANNOT_RUN: dict[tuple[str, str], str] = {
    ("README.md", "make test"): "the whole test suite, this test included: it cannot run inside itself",
    ("README.md", ".venv/bin/koord-scheduler simulate --nodes ../shared/traces/alibaba-openb/openb_node_list_gpu_node.csv --pods ../shared/traces/alibaba-openb/openb_pod_list_default.csv --seeds 42-51 --inflate 1.3 --profiles random,bestfit,binpack,spread,fgd,fragmentation --out b3-results"): B3_FULL,
    ("README.md", "make image"): IMAGE,
    ("README.md", ".venv/bin/koordlet run --node-name NODE --kubeconfig ~/.kube/config [--fake-gpus FILE]"): "a node agent: as written it writes the runtime proxy's hook file under /etc/runtime/hookserver.d and its socket under /var/run/koordlet on this host; tests/e2e/test_koordlet_sync.py runs it with private directories",
    ("docs/benchmarks.md", ".venv/bin/koord-scheduler simulate --nodes ../shared/traces/alibaba-openb/openb_node_list_gpu_node.csv --pods ../shared/traces/alibaba-openb/openb_pod_list_default.csv --seeds 42-51 --inflate 1.3 --jobs 2 --out b3-results/default --profiles random,bestfit,binpack,spread,fgd,fragmentation"): B3_FULL,
    ("docs/benchmarks.md", "T=../shared/traces/alibaba-openb"): B3_VAR,
    ("docs/benchmarks.md", ".venv/bin/python bench/b3_fragmentation.py --trace-dir $T --traces default,gpushare20,gpushare40,gpushare60,gpushare80,gpushare100 --profiles fgd,fragmentation --seeds 52-61 --jobs 2 --out /work/runs/timed"): "B3's timed run: 120 replays, 13 min 51 s measured",
    ("docs/benchmarks.md", ".venv/bin/python bench/b3_fragmentation.py --trace-dir $T --traces default,gpushare20,gpushare40,gpushare60,gpushare80,gpushare100 --profiles random,dotprod,clustering,packing,bestfit,binpack,fgd,fragmentation --seeds 42-51 --jobs 2 --bound --out b3-results/in-sample"): "B3's in-sample matrix, about an hour (make bench-b3)",
    ("docs/benchmarks.md", ".venv/bin/python bench/b3_fragmentation.py --trace-dir $T ... --seeds 52-61 --out b3-results/held-out"): "elided (`...` stands for the options of the line above): B3's held-out matrix, about an hour",
    ("docs/benchmarks.md", ".venv/bin/python bench/b3_fragmentation.py --trace-dir $T --models 0,20,40,60,80 --profiles fgd,fragmentation --seeds 52-61 --jobs 2 --out b3-results/models"): "B3's constrained-model family, ~20 min (make bench-b3-models)",
    ("docs/benchmarks.md", ".venv/bin/koord-scheduler simulate --nodes $T/openb_node_list_gpu_node.csv --pods b3-results/models/traces/openb_pod_list_models60.csv --seeds 42-46 --profiles fgd,fragmentation,/tmp/fpin3.yaml --jobs 2 --no-plot --out b3-results/sweep"): "needs the traces of the models run above and a profile the reader writes (/tmp/fpin3.yaml)",
    ("docs/benchmarks.md", ".venv/bin/python bench/b4_fairshare.py --duration 60 --plot docs/img/b4-fairshare.png"): "benchmark B4: four 60-s scenarios, ~4 min of both cores (make bench-b4)",
    ("docs/benchmarks.md", ".venv/bin/python bench/b4_fairshare.py --duration 60 --only faults"): "benchmark B4's faults scenario: 60 s of both cores; its numbers are the doc's table",
    ("docs/failure-model.md", "make test"): "the whole test suite, this test included: it cannot run inside itself",
    ("docs/failure-model.md", "make chaos CHAOS_MINUTES=30"): CHAOS + "; 30 minutes",
    ("docs/fuzzing.md", "make fuzz FUZZ_SECONDS=600"): "every fuzz target for 10 minutes each (over 5 hours); the short pass of make test fuzzes them all",
    ("docs/fuzzing.md", ".venv/bin/python -m tests.fuzz.driver --target pod-group --replay .fuzz/crashes/pod-group/crash-FILE"): "replays a crash file the reader's own make fuzz run saved",
    ("docs/failure-model.md", "CHAOS_SEED=1234 make chaos"): CHAOS + "; 30 minutes",
    ("docs/failure-model.md", "CHAOS_FAULTS=recreate_inflight,stall_watches .venv/bin/pytest tests/e2e/chaos"): CHAOS,
    ("docs/failure-model.md", "make chaos-soak N=50"): CHAOS + "; 50 runs of it, hours",
    ("docs/failure-model.md", "make chaos-soak SEEDS=371751008,1397707095"): CHAOS + "; twice",
    ("docs/operations.md", "kubectl apply -k config/overlays/webhook"): WEBHOOK,
    ("docs/operations.md", 'kubectl kustomize config/overlays/webhook | sed s|caBundle: ""|caBundle: $(cat ca-bundle.txt)| | kubectl apply -f -'): WEBHOOK,
    ("docs/operations.md", "kubectl -n koordinator-system rollout status deploy/koord-webhook"): "waits for the webhook Deployment's pods, which need a kubelet and a controller-manager; this tier has neither",
    ('docs/benchmarks.md', 'pip install koord-py[dask]'): "installs from a package index into the reader's environment; `make test`'s own set-up installs the same extra",
    ('docs/benchmarks.md', 'dask scheduler --port 8786'): DASK,
    ('docs/benchmarks.md', 'dask worker tcp://SCHEDULER:8786 --nthreads 1 --nworkers=-1'): DASK,
    ('docs/benchmarks.md', 'koord-scheduler simulate --sweep config/examples/sweep-b3-held-out.yaml --executor dask://SCHEDULER:8786 --out b3-results/held-out'): DASK,
    ('docs/benchmarks.md', 'dask scheduler --host 127.0.0.1 --port 0 --scheduler-file sched.json --no-dashboard &'): DASK,
    ('docs/benchmarks.md', 'dask worker ADDRESS --nthreads 1 --no-nanny --no-dashboard &'): DASK,
    ('docs/benchmarks.md', 'koord-scheduler simulate --nodes $T/openb_node_list_gpu_node.csv --pods $T/openb_pod_list_default.csv --seeds 52-53 --profiles fgd,fragmentation --no-plot --no-progress --executor dask://ADDRESS --out one'): DASK,
    ("docs/gpushare.md", "kubectl inspect gpushare nope"): "exits 1 by design (a node that does not exist, as gpushare's original); tests/e2e/test_kubectl_inspect_gpushare.py checks its message and exit code against the original's recorded output",
    ("docs/gpushare.md", "koordlet run --gpushare-device-plugin --query-kubelet [--kubelet-address 127.0.0.1] [--kubelet-port 10250] [--kubelet-scheme https|http] [--kubelet-token-file /var/run/secrets/kubernetes.io/serviceaccount/token] [--kubelet-ca-file F]"): "a node agent serving the kubelet's device-plugin socket and asking a kubelet for its pods: needs a kubelet; tests/unit/koordlet/deviceplugin/test_kubelet_pods.py runs the kubelet path against a real HTTPS server on loopback",
    ("docs/operations.md", "make image"): IMAGE,
    ("docs/operations.md", "podman push koord-py:0.1.0 REGISTRY/koord-py:0.1.0"): REGISTRY,
}
# fmt: on


def _all_commands() -> list[Command]:
    return [c for path in docs() for c in commands(path)]


def _entry(key: tuple[str, str]) -> str:
    return f"    {key!r}: ...,"


def test_every_documented_command_is_run_or_excused() -> None:
    problems = [
        f"{where}: a command in an untagged code block: tag the block ```sh (```console for $ "
        "prompts with output) so that its commands are checked"
        for path in docs()
        for where in untagged_commands(path)
    ]
    found = _all_commands()
    for c in found:
        if c.key in RUN and c.key in CANNOT_RUN:
            problems.append(f"{c.where}: `{c.text}` is in both RUN and CANNOT_RUN of {HERE}")
        elif c.key not in RUN and c.key not in CANNOT_RUN:
            problems.append(
                f"{c.where}: `{c.text}` is neither run nor excused. Add ONE line to {HERE}: to "
                f"RUN if it runs here in seconds,\n    {c.key!r}: Run(),\nor to CANNOT_RUN with "
                f'the reason it cannot run here,\n    {c.key!r}: "why not here",'
            )
    keys = {c.key for c in found}
    for table, entries in (("RUN", RUN), ("CANNOT_RUN", CANNOT_RUN)):
        problems += [
            f"{HERE}: {table} has a command no document has (any more); remove its line:\n"
            + _entry(key)
            for key in entries
            if key not in keys
        ]
    assert not problems, "\n".join(problems)


def test_the_extraction_finds_the_commands_it_must() -> None:
    """The extractor itself: continuation lines, comments, console prompts and outputs."""
    by_key = {c.key: c for c in _all_commands()}
    demo = by_key[("README.md", "make demo")]
    assert demo.text.startswith("make demo") and "#" in demo.text  # comment kept for the shell
    replay = [c for c in by_key.values() if c.doc == "README.md" and "--nodes" in c.text]
    assert len(replay) == 1 and replay[0].text.count("\\\n") == 3
    preempt = by_key[("docs/preemption.md", RUN_PREEMPTION)]
    assert preempt.output[0].startswith("PLACEMENTS")
    assert "PREEMPTIONS" in "\n".join(preempt.output)
    assert "IPADDRESS:  192.168.0.11" in by_key[("docs/gpushare.md", "kubectl inspect gpushare -d gpu-a")].output


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_inline_commands_name_real_targets_subcommands_and_flags() -> None:
    """Inline mentions (`make lint`, `koordlet run --fake-gpus`) are not run, but what they name
    must exist: the Makefile target, the subcommand, every --flag of it."""
    from koordlet.cli import build_parser as koordlet_parser
    from scheduler.cli import build_parser as scheduler_parser

    targets = set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), re.M))
    parsers = {"koord-scheduler": scheduler_parser(), "koordlet": koordlet_parser()}
    problems = []
    for path in docs():
        for where, text in inline_commands(path):
            words = text.split()
            program = words[0].removeprefix(".venv/bin/")
            if program == "make":
                if words[1] not in targets and not words[1].startswith("-"):
                    problems.append(f"{where}: `{text}`: no target {words[1]!r} in the Makefile")
                continue
            parser, rest = parsers[program], words[1:]
            if rest and not rest[0].startswith("-"):
                subs = _subcommands(parser)
                if rest[0] not in subs:
                    problems.append(f"{where}: `{text}`: {program} has no command {rest[0]!r}")
                    continue
                parser, rest = subs[rest[0]], rest[1:]
            problems += [
                f"{where}: `{text}`: no flag {flag} (known: {sorted(parser._option_string_actions)})"
                for flag in (w.split("=", 1)[0] for w in rest if w.startswith("--"))
                if flag not in parser._option_string_actions
            ]
    assert not problems, "\n".join(problems)


RUN_PREEMPTION = "koord-scheduler simulate config/examples/demo-preemption.yaml"


# --- running them -------------------------------------------------------------------------


def _blocks_to_run() -> list[tuple[str, int]]:
    blocks: dict[tuple[str, int], None] = {}
    for c in _all_commands():
        if c.key in RUN:
            blocks[(c.doc, c.block)] = None
    return list(blocks)


TRAIN_7 = """\
apiVersion: v1
kind: Pod
metadata:
  name: train-7
  namespace: ml
spec:
  schedulerName: koord-scheduler
  containers:
  - name: main
    image: pytorch/pytorch
    resources:
      limits:
        nvidia.com/gpu: "16"
      requests:
        nvidia.com/gpu: "16"
"""


@dataclass
class Shell:
    """The environment the commands run in, and one block's shell state."""

    cwd: Path
    env: dict[str, str]
    scratch: Path
    log: list[str] = field(default_factory=list)

    def fork(self) -> Shell:
        return Shell(self.cwd, dict(self.env), self.scratch, self.log)


def _kubectl(kubectl: str, kubeconfig: str, *args: str, cwd: Path) -> str:
    proc = subprocess.run(
        [kubectl, "--kubeconfig", kubeconfig, *args],
        capture_output=True, text=True, cwd=cwd, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def shell(
    kube_binaries: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Shell]:
    kubectl = hack_values(ROOT / "hack" / "kubectl.sh", ("KUBECTL_BIN",), "kubectl")["KUBECTL_BIN"]
    venv_bin = Path(sys.executable).parent
    assert (venv_bin / "koord-scheduler").is_file(), (
        f"{venv_bin} has no koord-scheduler: run the tests with the project's virtual environment"
    )
    base = tmp_path_factory.mktemp("doc-commands")
    repo = base / "repo"
    shutil.copytree(
        ROOT, repo, symlinks=True,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "__pycache__", ".*_cache", ".hypothesis", "dist", "*.egg-info"
        ),
    )  # fmt: skip
    (repo / ".venv").mkdir()
    # The whole environment, not bin/ alone: `.venv/bin/python` finds its environment by the
    # pyvenv.cfg beside bin/ (without it, `make fuzz`'s python is the bare interpreter).
    for entry in venv_bin.parent.iterdir():
        if entry.name != ".installed-stamp":
            (repo / ".venv" / entry.name).symlink_to(entry)
    (repo / ".venv" / ".installed-stamp").touch()
    # Never let a documented `make` target reinstall the project into the shared environment.
    up_to_date = subprocess.run(["make", "-q", ".venv/.installed-stamp"], cwd=repo, timeout=60)
    assert up_to_date.returncode == 0, "the copy's .venv stamp is stale: make would run pip"
    home = base / "home"
    (home / ".kube").mkdir(parents=True)
    real_cache = Path.home() / ".cache"
    if real_cache.is_dir():
        (home / ".cache").symlink_to(real_cache)
    srv = ApiServer(*kube_binaries).start()
    try:
        kubeconfig = srv.kubeconfig_path()
        shutil.copy(kubeconfig, home / ".kube" / "config")
        # The cluster the commands look at: the Device CRD, the demo cluster, a pending pod.
        _kubectl(kubectl, kubeconfig, "apply", "-f", "config/crd/", cwd=repo)
        _kubectl(kubectl, kubeconfig, "wait", "--for", "condition=established", "--timeout",
                 "60s", "crd/devices.scheduling.koordinator.sh", cwd=repo)  # fmt: skip
        for ns in ("ml", "data", "web"):
            _kubectl(kubectl, kubeconfig, "create", "namespace", ns, cwd=repo)
        scenario = (repo / "config/examples/demo-cluster.yaml").read_text() + "---\n" + TRAIN_7
        (repo / "scenario.yaml").write_text(scenario)
        objects = [d for d in yaml.safe_load_all(scenario) if d]
        for pod in (d for d in objects if d["kind"] == "Pod" and "priority" in d["spec"]):
            del pod["spec"]["priority"]  # set by the API server's Priority admission only
        (base / "cluster.yaml").write_text(yaml.safe_dump_all(objects))
        _kubectl(kubectl, kubeconfig, "apply", "-f", str(base / "cluster.yaml"), cwd=repo)
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "VIRTUAL_ENV")}
        env.update(
            HOME=str(home),
            PATH=os.pathsep.join(
                [str(repo / ".venv" / "bin"), str(Path(kubectl).parent), os.environ["PATH"]]
            ),
            PYTHONPATH=str(repo),
            PYTHONUNBUFFERED="1",
        )
        result = subprocess.run(
            [str(venv_bin / "koord-scheduler"), "simulate", "scenario.yaml", "-o", "yaml"],
            capture_output=True, text=True, cwd=repo, env=env, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        (repo / "result.yaml").write_text(result.stdout)
        sh = Shell(repo, env, base)
        yield sh
        print("\n".join(sh.log))
    finally:
        srv.stop()


def _fill(c: Command, run: Run) -> str:
    text = c.text
    for placeholder, value in run.fill:
        assert placeholder in text, f"{c.where}: placeholder {placeholder!r} not in `{c.text}`"
        text = text.replace(placeholder, value, 1)
    return text


def _run(sh: Shell, c: Command, text: str) -> str:
    state = sh.scratch / "state"
    script = f'set -a\ntrap \'pwd >"{state}.pwd"; env -0 >"{state}.env"\' EXIT\n{text}\n'
    start = time.monotonic()
    proc = subprocess.run(
        ["bash", "-c", script],
        capture_output=True, text=True, cwd=sh.cwd, env=sh.env, timeout=COMMAND_TIMEOUT_S,
    )  # fmt: skip
    sh.log.append(f"{time.monotonic() - start:6.1f} s  {c.where}  {c.key[1][:80]}")
    assert proc.returncode == 0, (
        f"{c.where}: `{text}` exited {proc.returncode}\n"
        f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    )
    sh.cwd = Path(Path(f"{state}.pwd").read_text().strip())
    pairs = (kv.split("=", 1) for kv in Path(f"{state}.env").read_text().split("\0") if "=" in kv)
    sh.env = dict(pairs)
    return proc.stdout


def _answers(url: str) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def _serve(sh: Shell, c: Command, text: str, url: str) -> None:
    log = sh.scratch / f"serve-{c.line}.log"
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", f"exec {text}"],
            stdout=out, stderr=subprocess.STDOUT, cwd=sh.cwd, env=sh.env,
            start_new_session=True,
        )  # fmt: skip
        try:
            while not _answers(url):
                assert proc.poll() is None, (
                    f"{c.where}: `{text}` exited {proc.returncode}:\n{log.read_text()[-3000:]}"
                )
                assert time.monotonic() - start < SERVE_TIMEOUT_S, (
                    f"{c.where}: `{text}`: {url} did not answer 200 within {SERVE_TIMEOUT_S} s"
                    f":\n{log.read_text()[-3000:]}"
                )
                time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=30)
            assert rc == 0, (
                f"{c.where}: `{text}` exited {rc} on SIGTERM:\n{log.read_text()[-3000:]}"
            )
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    sh.log.append(f"{time.monotonic() - start:6.1f} s  {c.where}  {c.key[1][:80]} (served {url})")


def _in_order(wanted: tuple[str, ...], got: list[str]) -> list[str]:
    """The wanted non-blank lines that do not appear in ``got`` in order."""
    missing, i = [], 0
    for line in (w for w in wanted if w.strip()):
        j = next((k for k in range(i, len(got)) if got[k] == line), None)
        if j is None:
            missing.append(line)
        else:
            i = j + 1
    return missing


@pytest.mark.e2e
@pytest.mark.parametrize("block", _blocks_to_run(), ids=lambda b: f"{b[0]}:{b[1]}")
def test_documented_commands_run_as_written(shell: Shell, block: tuple[str, int]) -> None:
    sh = shell.fork()  # a block's cd and variables stay in the block
    for c in (c for c in _all_commands() if (c.doc, c.block) == block):
        if c.key not in RUN:
            continue  # in CANNOT_RUN: the coverage test above checks that
        run = RUN[c.key]
        text = _fill(c, run)
        if run.serves:
            _serve(sh, c, text, run.serves)
            continue
        out = _run(sh, c, text)
        lines = [ln.rstrip() for ln in out.splitlines()]
        for want in run.expect:
            if c.output:
                assert any(want in ln for ln in c.output), (
                    f"{c.where}: expected {want!r} is not in the documented output"
                )
            assert any(want in ln for ln in lines), f"{c.where}: `{text}`: no {want!r} in:\n{out}"
        if run.documented_output:
            assert c.output, f"{c.where}: no documented output to compare"
            missing = _in_order(c.output, lines)
            assert not missing, (
                f"{c.where}: the documented output differs from the real one; not found (in "
                f"order): {missing}\nreal output:\n{out}"
            )
