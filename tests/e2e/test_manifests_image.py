"""The OCI image of ``make image`` (hack/image.sh: Debian debootstrap + the wheel + podman):
``koord-scheduler --version`` and ``koordlet report --once --fake-gpus`` run inside it, as the
image's non-root user.

Two ways in: ``podman run`` where this machine can run containers (else one skip line, under
CI too: a kernel or runtime that refuses containers — as on the 2-core CI machines, where crun is
refused ``setrlimit`` — is a property of the machine, not a missing install step, and the
content of the image is checked below all the same), and, always where the image builds, the
image's own filesystem exported with ``podman export`` and entered with ``chroot --userspec``
(same files, same user; no namespaces), so the content of the image is checked even where
containers cannot run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prometheus import hack_values, unavailable

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
FAKE_GPUS = REPO / "config" / "examples" / "fake-gpus.yaml"
USER = "65532:65532"


def _version() -> str:
    for line in (REPO / "pyproject.toml").read_text().splitlines():
        if line.startswith("version = "):
            return line.split('"')[1]
    raise AssertionError("no version in pyproject.toml")


@pytest.fixture(scope="module")
def image() -> str:
    if os.environ.get("KOORD_SKIP_IMAGE") == "1":
        pytest.skip("KOORD_SKIP_IMAGE=1: image tier disabled")
    return hack_values(REPO / "hack" / "image.sh", ("IMAGE", "ARCHIVE"), "image")["IMAGE"]


@pytest.fixture(scope="module")
def rootfs(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The image's filesystem (``podman create`` + ``podman export``)."""
    root = tmp_path_factory.mktemp("image") / "rootfs"
    root.mkdir()
    ctr = subprocess.run(
        ["podman", "create", image, "true"], capture_output=True, text=True, timeout=120
    )
    assert ctr.returncode == 0, ctr.stderr
    cid = ctr.stdout.strip()
    try:
        tar_path = root.parent / "rootfs.tar"
        subprocess.run(["podman", "export", "-o", str(tar_path), cid], check=True, timeout=300)
        with tarfile.open(tar_path) as tar:
            tar.extractall(root, filter="fully_trusted")
        tar_path.unlink()
    finally:
        subprocess.run(["podman", "rm", "-f", cid], capture_output=True, timeout=60)
    shutil.copy(FAKE_GPUS, root / "tmp" / "fake-gpus.yaml")
    yield root


COMMANDS = {
    "scheduler-version": (["koord-scheduler", "--version"], f"koord-scheduler {_version()} "),
    "koordlet-version": (["koordlet", "--version"], f"koordlet {_version()} "),
    "koordlet-report": (
        ["koordlet", "report", "--once", "--fake-gpus", "/tmp/fake-gpus.yaml", "--node-name",
         "n1", "--sysfs-root", "/nonexistent", "--kubelet-root", "/nonexistent"],
        "kind: Device",
    ),
}  # fmt: skip


def _check(proc: subprocess.CompletedProcess[str], expect: str) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert expect in proc.stdout, proc.stdout


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_image_filesystem_runs_both_commands_as_non_root(rootfs: Path, name: str) -> None:
    chroot = shutil.which("chroot") or shutil.which("chroot", path="/usr/sbin:/sbin")
    if os.geteuid() != 0 or chroot is None:
        unavailable("image", "chroot (coreutils) as root is needed to enter the image's files")
    argv, expect = COMMANDS[name]
    env = {"PATH": "/opt/koord-py/bin:/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"}
    proc = subprocess.run(
        [str(chroot), f"--userspec={USER}", str(rootfs), *argv],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    _check(proc, expect)
    if name == "koordlet-report":
        device = yaml.safe_load(proc.stdout)
        assert [d["minor"] for d in device["spec"]["devices"]] == [0, 1, 2, 3]


def test_image_runs_in_podman(image: str) -> None:
    inspect = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Config.User}}", image],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert inspect.stdout.strip() == USER, inspect.stdout + inspect.stderr
    mount = f"{FAKE_GPUS}:/tmp/fake-gpus.yaml:ro"
    results = {}
    for name, (argv, expect) in COMMANDS.items():
        proc = subprocess.run(
            ["podman", "run", "--rm", "--network=none", "-v", mount, image, *argv],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        if proc.returncode != 0 and "OCI" in proc.stderr:  # the runtime, not our image
            reason = proc.stderr.strip().splitlines()[-1]
            pytest.skip(f"podman: this machine cannot run containers: {reason}")
        results[name] = (proc, expect)
    for proc, expect in results.values():
        _check(proc, expect)
