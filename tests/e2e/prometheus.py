"""A throw-away Prometheus server (Debian's package, via ``hack/prometheus.sh``) for the tests.

Library, not a test module. ``tools()`` returns (prometheus, promtool) or skips the caller with
one line (FAILS under ``CI``); ``Prometheus(binary, targets, workdir).start()`` runs a server on
127.0.0.1 (free port, its own TSDB dir under ``workdir``) scraping the given ``job -> [host:port]``
targets every ``interval``; ``query(promql)`` is the HTTP API's instant query (``/api/v1/query``),
``wait_query`` polls it. ``stop()`` ends the process; the children get ``PR_SET_PDEATHSIG``.

Nothing here imports the code under test: the server is a real Prometheus, talked to over HTTP.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "hack" / "prometheus.sh"


def unavailable(tier: str, reason: str) -> None:
    """Skip with one line, or fail under CI (the rule of every Debian-package tier)."""
    msg = f"{tier} tier unavailable: {reason}"
    if os.environ.get("CI"):
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


def hack_values(script: Path, keys: Sequence[str], tier: str) -> dict[str, str]:
    """Run a ``hack/`` provider script; its ``KEY=path`` lines, or skip/fail with its error."""
    try:
        proc = subprocess.run(
            ["bash", str(script)], capture_output=True, text=True, cwd=REPO_ROOT, timeout=900
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        unavailable(tier, f"cannot run {script.name}: {exc}")
        raise  # unreachable
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"{script.name} exited {proc.returncode}"]
        errors = [ln for ln in lines if "error:" in ln]
        unavailable(tier, (errors or lines)[-1])
    values = dict(ln.split("=", 1) for ln in proc.stdout.splitlines() if "=" in ln)
    missing = [k for k in keys if k not in values]
    if missing:
        unavailable(tier, f"{script.name} printed no {', '.join(missing)}")
    return values


def tools() -> tuple[str, str]:
    """(prometheus, promtool) paths from hack/prometheus.sh."""
    v = hack_values(SCRIPT, ("PROMETHEUS_BIN", "PROMTOOL_BIN"), "Prometheus")
    return v["PROMETHEUS_BIN"], v["PROMTOOL_BIN"]


class PrometheusError(AssertionError):
    pass


class Prometheus:
    """One Prometheus server scraping fixed targets (see the module docstring)."""

    def __init__(
        self,
        binary: str,
        targets: Mapping[str, Sequence[str]],
        workdir: Path,
        *,
        interval: str = "1s",
        rule_files: Sequence[Path] = (),
    ) -> None:
        self.binary = binary
        self.port = free_port()
        self.dir = workdir / "prometheus"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "prometheus.log"
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(addrs)}]}
                for job, addrs in targets.items()
            ],
        }
        self.config_path = self.dir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> Prometheus:
        log = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.config_path}",
                    f"--storage.tsdb.path={self.dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--web.enable-lifecycle",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_pdeathsig,
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PrometheusError(f"prometheus exited:\n{self.log_tail()}")
            if self._get("/-/ready")[0] == 200:
                return self
            time.sleep(0.3)
        raise PrometheusError(f"prometheus not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return "<no log>"

    def _get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError as exc:
            return 0, str(exc)

    def api(self, path: str, **params: str) -> dict[str, Any]:
        """GET ``/api/v1/<path>``; the decoded body (``status`` ``success`` or ``error``)."""
        code, body = self._get(f"/api/v1/{path}?{urllib.parse.urlencode(params)}")
        try:
            doc: dict[str, Any] = json.loads(body)
        except ValueError:
            raise PrometheusError(f"{path}: HTTP {code}: {body[:300]}") from None
        return doc

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query; the result vector (fails the test on a query error)."""
        doc = self.api("query", query=promql)
        if doc.get("status") != "success":
            raise PrometheusError(f"{promql!r}: {doc.get('errorType')}: {doc.get('error')}")
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    def wait_query(
        self,
        what: str,
        promql: str,
        accept: Callable[[list[dict[str, Any]]], bool],
        timeout: float = 60.0,
    ) -> list[dict[str, Any]]:
        """Poll ``promql`` until ``accept(result)``; fail with the last result on timeout."""
        deadline = time.monotonic() + timeout
        last: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            last = self.query(promql)
            if accept(last):
                return last
            time.sleep(0.5)
        raise PrometheusError(f"timed out waiting for {what}: {promql} -> {last!r}")

    def targets_up(self) -> dict[str, str]:
        """job -> health of its (single) target."""
        doc = self.api("targets")
        return {t["labels"]["job"]: t["health"] for t in doc["data"]["activeTargets"]}


def vector(result: list[dict[str, Any]], *keys: str) -> dict[tuple[str, ...], float]:
    """An instant vector as ``{(label values...): value}``."""
    return {tuple(r["metric"].get(k, "") for k in keys): float(r["value"][1]) for r in result}


def _pdeathsig() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
