"""Benchmark B5: koord-webhook under load on loopback.

The real command (``python -m scheduler.cli webhook serve``, its own process, a certificate
from ``webhook certs``) answers AdmissionReviews from ``--clients`` threads, each on its own
kept-alive HTTPS connection (the API server keeps its connections to a webhook alive). The
reviews cycle through what the API server sends: a GPU pod to /mutate (patched), a non-GPU pod
to /mutate (allowed), a valid and an invalid pod to /validate (allowed, denied), a label edit
and a forged device-allocated annotation to /guard (allowed, denied). Every answer is checked:
HTTP 200, the request's uid echoed, the expected verdict; anything else is an error.

Prints throughput (reviews/s over the wall time of the whole run), client-side latency p50,
p99 and max, the errors, and the server's own count from /metrics.

Usage (from the repository root):

    python bench/b5_webhook.py [--reviews 2000] [--clients 16]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ALLOCATED = "scheduling.koordinator.sh/device-allocated"


def _pod(name: str, limits: dict[str, str], annotations: dict[str, str] | None = None) -> Any:
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "labels": {"app": "bench"}}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": limits}},
                {"name": "side", "image": "busybox", "resources": {"limits": {"cpu": "100m"}}},
            ],
        },
    }


def _review(uid: str, obj: Any, operation: str = "CREATE", old: Any = None) -> bytes:
    request = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": operation,
        "namespace": "team-a",
        "name": obj["metadata"]["name"],
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": obj,
        "oldObject": old,
    }
    doc = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return json.dumps(doc).encode()


GPU = {"nvidia.com/gpu": "1", "cpu": "1"}
SHARED = {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}
CASES: list[tuple[str, Any, str]] = [
    ("/mutate", lambda u: _review(u, _pod("gpu", GPU)), "patched"),
    ("/mutate", lambda u: _review(u, _pod("web", {"cpu": "1"})), "allowed"),
    ("/validate", lambda u: _review(u, _pod("ok", SHARED)), "allowed"),
    ("/validate", lambda u: _review(u, _pod("bad", {"koordinator.sh/gpu-core": "30"})), "denied"),
    (
        "/guard",
        lambda u: _review(u, _pod("edit", SHARED), "UPDATE", _pod("edit", SHARED)),
        "allowed",
    ),
    ("/guard", lambda u: _review(u, _pod("forged", GPU, {ALLOCATED: "{}"})), "denied"),
]


def _verdict(resp: dict[str, Any]) -> str:
    if not resp.get("allowed"):
        return "denied"
    return "patched" if "patch" in resp else "allowed"


def _client(
    port: int, ctx: ssl.SSLContext, jobs: list[int], out: list[float], errors: list[str]
) -> None:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
    for n in jobs:
        path, build, want = CASES[n % len(CASES)]
        uid = f"r-{n}"
        body = build(uid)
        start = time.perf_counter()
        try:
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
        except (OSError, http.client.HTTPException) as exc:
            errors.append(f"{uid}: {type(exc).__name__}: {exc}")
            conn.close()
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
            continue
        out.append(time.perf_counter() - start)
        try:
            resp = json.loads(data)["response"]
            ok = r.status == 200 and resp["uid"] == uid and _verdict(resp) == want
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            errors.append(f"{uid} {path}: HTTP {r.status}: {data[:200]!r}")
    conn.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reviews", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=16)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="b5-"))
    cmd = [sys.executable, "-m", "scheduler.cli", "webhook"]
    subprocess.run([*cmd, "certs", f"--out={tmp}", "--host=127.0.0.1"], cwd=ROOT,
                   check=True, capture_output=True)  # fmt: skip
    log = open(tmp / "log", "wb")  # noqa: SIM115 - the server's for its lifetime
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server = subprocess.Popen(
        [*cmd, "serve", "--bind-address=127.0.0.1", f"--port={port}",
         f"--tls-cert-file={tmp / 'tls.crt'}", f"--tls-private-key-file={tmp / 'tls.key'}"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    ctx = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
    try:
        _wait_ready(server, port, ctx, tmp / "log")
        jobs = [list(range(c, args.reviews, args.clients)) for c in range(args.clients)]
        latencies: list[list[float]] = [[] for _ in jobs]
        errors: list[str] = []
        threads = [
            threading.Thread(target=_client, args=(port, ctx, j, lat, errors))
            for j, lat in zip(jobs, latencies, strict=True)
        ]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx) as r:
            metrics = r.read().decode()
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(30)
        log.close()
    lat = sorted(x for part in latencies for x in part)
    counted = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("koord_webhook_requests_total{")
    )
    print(f"machine: {platform.node()} {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"reviews: {args.reviews} from {args.clients} clients, one connection each")
    print(f"wall: {wall:.2f} s, throughput: {len(lat) / wall:.0f} reviews/s")
    if lat:
        p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000  # noqa: E731
        print(f"latency ms: p50 {p(0.50):.2f}  p99 {p(0.99):.2f}  max {lat[-1] * 1000:.2f}")
    print(f"server counted: {counted:.0f}; errors: {len(errors)}; server exit: {code}")
    for e in errors[:10]:
        print("  ", e)
    return 0 if not errors and counted == args.reviews and code == 0 else 1


def _wait_ready(server: subprocess.Popen[bytes], port: int, ctx: ssl.SSLContext, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"webhook exited: {log.read_text()[-2000:]}")
        try:
            url = f"https://127.0.0.1:{port}/readyz"
            with urllib.request.urlopen(url, context=ctx, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("webhook did not start")


if __name__ == "__main__":
    sys.exit(main())
