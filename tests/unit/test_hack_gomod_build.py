"""The build-once contract of ``hack/kube-1.37.sh`` and ``hack/helm.sh`` (hack/lib/gomod-build.sh).

The real builds take most of an hour, so these tests give the scripts a fake ``go`` (env ``GO``)
that logs each ``go build`` and links a tiny shell script answering ``--version`` from the
``-X`` version stamps it was given, and inject the faults: a failing build that leaves a
partial output, a build killed mid-way, a binary that reports the wrong version, a stamp
naming another recipe, two callers at once. What must hold: stdout carries only the
``KEY=/abs/path`` lines; a failure ends with one ``<script>: error: ...`` line; the cache never
holds a half-written binary or a stamp for binaries that were not all built; a cache hit builds
nothing; concurrent callers build once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
KUBE = REPO_ROOT / "hack" / "kube-1.37.sh"
HELM = REPO_ROOT / "hack" / "helm.sh"
KUBE_BINS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd")
KUBE_KEYS = ("KUBE_APISERVER_BIN", "KUBE_CONTROLLER_MANAGER_BIN", "KUBE_SCHEDULER_BIN", "ETCD_BIN")

# FAKE_GO_FAIL=<substring of a package>: that build writes a partial output and fails.
# FAKE_GO_SLEEP=<s>: every build sleeps first. FAKE_GO_NOSTAMP=1: ignore the -X stamps.
FAKE_GO = textwrap.dedent(
    r"""
    #!/usr/bin/env bash
    set -euo pipefail
    if [[ "$1" == env && "$2" == GOVERSION ]]; then echo go1.26.8; exit 0; fi
    [[ "$1" == build ]] || { echo "fake go: unexpected $*" >&2; exit 2; }
    shift
    out="" ldflags="" pkg=""
    while [[ $# -gt 0 ]]; do
      case "$1" in
        -o) out="$2"; shift 2 ;;
        -ldflags=*) ldflags="${1#-ldflags=}"; shift ;;
        -*) shift ;;
        *) pkg="$1"; shift ;;
      esac
    done
    echo "build $pkg mod=$(basename "$PWD") cgo=$CGO_ENABLED flags=$GOFLAGS" >>"$FAKE_GO_LOG"
    if [[ -n "${FAKE_GO_SLEEP:-}" ]]; then sleep "$FAKE_GO_SLEEP"; fi
    if [[ -n "${FAKE_GO_FAIL:-}" && "$pkg" == *"$FAKE_GO_FAIL"* ]]; then
      printf '\177ELF half' >"$out"; chmod +x "$out"; echo "fake go: compile error" >&2; exit 1
    fi
    stamp() { sed -n "s|.*-X $1=\([^ ]*\).*|\1|p" <<<"$ldflags"; }
    case "$pkg" in
      k8s.io/kubernetes/cmd/*) v="$(stamp k8s.io/component-base/version.gitVersion)"
         answer="Kubernetes ${v:-v0.0.0-master+\$Format:%H\$}" ;;
      go.etcd.io/etcd/server/v3) answer="etcd Version: 3.7.3" ;;
      helm.sh/helm/v3/cmd/helm) v="$(stamp helm.sh/helm/v3/internal/version.version)"
         answer="${v:-v3.22}+gunknown" ;;
      *) echo "fake go: unknown package $pkg" >&2; exit 1 ;;
    esac
    if [[ -n "${FAKE_GO_NOSTAMP:-}" ]]; then answer="Kubernetes v0.0.0-master"; fi
    printf '#!/bin/sh\necho "%s"\n' "$answer" >"$out"
    chmod +x "$out"
    """
).lstrip()


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    fake = tmp_path / "fake-go"
    fake.write_text(FAKE_GO)
    fake.chmod(0o755)
    e = dict(os.environ)
    e.update(
        GO=str(fake),
        FAKE_GO_LOG=str(tmp_path / "go.log"),
        KOORD_CACHE_DIR=str(tmp_path / "cache"),
    )
    for k in ("FAKE_GO_FAIL", "FAKE_GO_SLEEP", "FAKE_GO_NOSTAMP"):
        e.pop(k, None)
    return e


def run(script: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script), *args], capture_output=True, text=True, env=env, timeout=60
    )


def builds(env: dict[str, str]) -> list[str]:
    log = Path(env["FAKE_GO_LOG"])
    return log.read_text().splitlines() if log.exists() else []


def cache(env: dict[str, str]) -> Path:
    return Path(env["KOORD_CACHE_DIR"]) / "kube-v1.37.2"


def files(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()} if d.exists() else set()


def last_error(proc: subprocess.CompletedProcess[str], prog: str = "kube-1.37.sh") -> str:
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"{prog}: error: "), proc.stderr
    return line


def test_builds_each_binary_once_then_serves_the_cache(env: dict[str, str]) -> None:
    first = run(KUBE, env)
    assert first.returncode == 0, first.stderr
    d = cache(env)
    assert first.stdout.splitlines() == [
        f"{k}={d / b}" for k, b in zip(KUBE_KEYS, KUBE_BINS, strict=True)
    ]
    assert [b.split()[1] for b in builds(env)] == [
        "k8s.io/kubernetes/cmd/kube-apiserver",
        "k8s.io/kubernetes/cmd/kube-controller-manager",
        "k8s.io/kubernetes/cmd/kube-scheduler",
        "go.etcd.io/etcd/server/v3",
    ]
    # Each through its own wrapper, CGO-free, never editing the wrapper's go.mod/go.sum.
    assert all("cgo=0 flags=-mod=readonly -buildvcs=false" in b for b in builds(env))
    assert [b.split()[2] for b in builds(env)] == ["mod=kube-1.37"] * 3 + ["mod=etcd-3.7"]
    out = subprocess.run([str(d / "kube-apiserver"), "--version"], capture_output=True, text=True)
    assert out.stdout.strip() == "Kubernetes v1.37.2"
    assert files(d) == {*KUBE_BINS, "stamp", ".lock"}

    again = run(KUBE, env)
    assert again.returncode == 0 and again.stdout == first.stdout
    assert len(builds(env)) == 4  # a cache hit builds nothing
    cached = run(KUBE, env, "--cached-only")
    assert cached.returncode == 0 and cached.stdout == first.stdout


def test_cached_only_on_an_empty_cache_is_one_error_line(env: dict[str, str]) -> None:
    proc = run(KUBE, env, "--cached-only")
    assert proc.returncode == 1 and proc.stdout == ""
    assert "not built" in last_error(proc) and "make kube-1.37" in last_error(proc)
    assert builds(env) == [] and not cache(env).exists()


def test_a_failed_build_leaves_no_half_binary_and_no_stamp(env: dict[str, str]) -> None:
    proc = run(KUBE, {**env, "FAKE_GO_FAIL": "cmd/kube-scheduler"})
    assert proc.returncode == 1 and proc.stdout == ""
    assert "go build k8s.io/kubernetes/cmd/kube-scheduler failed" in last_error(proc)
    # The two binaries already built stay (Go's cache makes them cheap anyway), the half one
    # does not, and without a stamp nobody takes the set for a finished one.
    assert files(cache(env)) == {"kube-apiserver", "kube-controller-manager", ".lock"}
    assert run(KUBE, env, "--cached-only").returncode == 1

    retry = run(KUBE, env)
    assert retry.returncode == 0, retry.stderr
    assert files(cache(env)) == {*KUBE_BINS, "stamp", ".lock"}


def test_a_killed_build_leaves_no_half_binary_and_the_next_caller_cleans_up(
    env: dict[str, str],
) -> None:
    slow = {**env, "FAKE_GO_SLEEP": "30"}
    proc = subprocess.Popen(
        ["bash", str(KUBE)],
        env=slow,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not builds(env) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert builds(env), "the build never started"
        os.killpg(proc.pid, signal.SIGKILL)  # no trap runs: the worst case
    finally:
        proc.wait(timeout=10)
    left = files(cache(env))
    assert "kube-apiserver" not in left and "stamp" not in left
    assert any(n.startswith(".kube-apiserver.tmp.") for n in left), left  # killed mid-build

    assert run(KUBE, env, "--cached-only").returncode == 1
    retry = run(KUBE, env)
    assert retry.returncode == 0, retry.stderr
    assert files(cache(env)) == {*KUBE_BINS, "stamp", ".lock"}


def test_a_terminated_build_removes_its_temp_file(env: dict[str, str]) -> None:
    proc = subprocess.Popen(
        ["bash", str(KUBE)],
        env={**env, "FAKE_GO_SLEEP": "30"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while not builds(env) and time.monotonic() < deadline:
        time.sleep(0.05)
    # To the whole group, as Ctrl-C or a job runner's stop does: go dies, the script's trap runs.
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert files(cache(env)) == {".lock"}


def test_a_binary_without_the_version_stamp_is_refused(env: dict[str, str]) -> None:
    proc = run(KUBE, {**env, "FAKE_GO_NOSTAMP": "1"})
    assert proc.returncode == 1
    assert "built kube-apiserver does not report v1.37.2" in last_error(proc)
    assert files(cache(env)) == {".lock"}


def test_a_stamp_of_another_recipe_means_rebuild(env: dict[str, str]) -> None:
    assert run(KUBE, env).returncode == 0
    stamp = cache(env) / "stamp"
    stamp.write_text(stamp.read_text().replace("recipe=", "recipe=0ld", 1))
    assert run(KUBE, env, "--cached-only").returncode == 1
    assert run(KUBE, env).returncode == 0
    assert len(builds(env)) == 8


def test_a_failed_rebuild_drops_the_old_stamp(env: dict[str, str]) -> None:
    assert run(KUBE, env).returncode == 0
    stamp = cache(env) / "stamp"
    stamp.write_text(stamp.read_text().replace("recipe=", "recipe=0ld", 1))  # go.mod moved on
    assert run(KUBE, {**env, "FAKE_GO_FAIL": "cmd/kube-scheduler"}).returncode == 1
    # The set now mixes new and old binaries: no stamp may vouch for it, not even the old one.
    assert not stamp.exists()


def test_concurrent_callers_build_once(env: dict[str, str]) -> None:
    slow = {**env, "FAKE_GO_SLEEP": "0.3"}
    procs = [
        subprocess.Popen(
            ["bash", str(KUBE)], env=slow, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [e for _, e in outs]
    assert len({o for o, _ in outs}) == 1
    assert len(builds(env)) == 4


def test_a_toolchain_older_than_the_wrapper_is_one_error_line(env: dict[str, str]) -> None:
    old = Path(env["GO"]).with_name("old-go")
    old.write_text("#!/bin/sh\necho go1.19.8\n")
    old.chmod(0o755)
    proc = run(KUBE, {**env, "GO": str(old)})
    assert proc.returncode == 1
    assert "needs Go >= 1.26.0" in last_error(proc) and "go1.19.8" in last_error(proc)


def test_an_unknown_argument_is_one_error_line(env: dict[str, str]) -> None:
    proc = run(KUBE, env, "--fast")
    assert proc.returncode == 1 and "unknown argument '--fast'" in last_error(proc)


def test_helm_is_built_once_and_stamped(env: dict[str, str]) -> None:
    first = run(HELM, env)
    assert first.returncode == 0, first.stderr
    d = Path(env["KOORD_CACHE_DIR"]) / "helm-v3.22.0"
    assert first.stdout == f"HELM_BIN={d / 'helm'}\n"
    assert [b.split()[1:3] for b in builds(env)] == [["helm.sh/helm/v3/cmd/helm", "mod=helm-3"]]
    assert run(HELM, env).stdout == first.stdout and len(builds(env)) == 1
    assert "v3.22.0" in (d / "stamp").read_text()


def test_helm_without_the_version_stamp_is_refused(env: dict[str, str]) -> None:
    proc = run(HELM, {**env, "FAKE_GO_NOSTAMP": "1"})
    assert proc.returncode == 1
    assert "not v3.22.0" in last_error(proc, "helm.sh")
    assert not (Path(env["KOORD_CACHE_DIR"]) / "helm-v3.22.0" / "helm").exists()
