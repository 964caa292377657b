"""Micro-benchmark of ``apis.jsonload.loads`` on the LIST hot path and on deep objects.

A pod list page as kube-apiserver serves it (each pod ~4 KiB: metadata with two managers'
managedFields, defaulted spec, status with conditions and a container status), decoded by
``json.loads`` (before) and by ``apis.jsonload.loads`` (after): the hot path must cost the
same. Then the fallback: one pod whose ``metadata.managedFields[0].fieldsV1`` nests 1,500 or
~10,000 levels, alone and among the pods of a page. Prints the best of ``--repeat`` runs
(CPU milliseconds per decode).

Usage (from the repository root):

    python -m bench.jsonload [--pods 500,5000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from apis.jsonload import GO_MAX_DEPTH, loads, nesting_depth


def served_pod(i: int) -> dict[str, Any]:
    """A bound GPU pod as the API server serves it (defaults and status filled in)."""
    name = f"p-{i:05d}"
    managed = {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}, "f:spec": {"f:containers": {}}}
    return {
        "metadata": {
            "name": name,
            "namespace": "bench",
            "uid": f"6b1f7c2e-{i:04x}-4c1e-9d7a-0242ac120002",
            "resourceVersion": str(100000 + i),
            "creationTimestamp": "2026-11-29T07:00:00Z",
            "labels": {"app": "train", "pod-template-hash": "5d8f9c7b4"},
            "annotations": {
                "scheduling.koordinator.sh/device-allocated": (
                    '{"gpu":[{"minor":3,"resources":{"koordinator.sh/gpu-core":"100",'
                    '"koordinator.sh/gpu-memory":"85899345920",'
                    '"koordinator.sh/gpu-memory-ratio":"100"}}]}'
                )
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "train-5d8f9c7b4",
                    "uid": "0d3b2f4a-1c5e-4f6a-8b7c-9d0e1f2a3b4c",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-29T07:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": managed,
                },
                {
                    "manager": "koord-scheduler",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-29T07:00:01Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:annotations": {".": {}}}},
                },
            ],
        },
        "spec": {
            "volumes": [
                {
                    "name": "default-token-x7k2p",
                    "secret": {"secretName": "default-token-x7k2p", "defaultMode": 420},
                }
            ],
            "containers": [
                {
                    "name": "c",
                    "image": "registry.example/train:1.4",
                    "resources": {
                        "limits": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": "1"},
                        "requests": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": "1"},
                    },
                    "volumeMounts": [
                        {
                            "name": "default-token-x7k2p",
                            "readOnly": True,
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        }
                    ],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "nodeName": f"node-{i % 200:04d}",
            "securityContext": {},
            "schedulerName": "koord-scheduler",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {
                    "type": t,
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": "2026-11-29T07:00:02Z",
                }
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "hostIP": "10.0.0.7",
            "podIP": f"10.244.{i // 250 % 250}.{i % 250}",
            "podIPs": [{"ip": f"10.244.{i // 250 % 250}.{i % 250}"}],
            "startTime": "2026-11-29T07:00:01Z",
            "containerStatuses": [
                {
                    "name": "c",
                    "state": {"running": {"startedAt": "2026-11-29T07:00:02Z"}},
                    "lastState": {},
                    "ready": True,
                    "restartCount": 0,
                    "image": "registry.example/train:1.4",
                    "imageID": "docker-pullable://registry.example/train@sha256:" + "ab" * 32,
                    "containerID": "containerd://" + f"{i:064x}",
                    "started": True,
                }
            ],
            "qosClass": "Guaranteed",
        },
    }


def deep_fields(levels: int) -> dict[str, Any]:
    """``fieldsV1`` nesting ``levels`` objects (built without recursion)."""
    node: dict[str, Any] = {}
    for _ in range(levels - 1):
        node = {"f:a": node}
    return node


def deep_pod(levels: int) -> dict[str, Any]:
    pod = served_pod(99999)
    pod["metadata"]["managedFields"][0]["fieldsV1"] = deep_fields(levels)
    return pod


def page(pods: list[str]) -> bytes:
    """A PodList page from pods already serialised (json.dumps of a deep pod recurses)."""
    head = '{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"200000"},"items":['
    return (head + ",".join(pods) + "]}").encode()


def serialised_deep(levels: int) -> str:
    """A deep pod's JSON, written without recursion."""
    marker = '"__deep__"'
    pod = deep_pod(1)
    pod["metadata"]["managedFields"][0]["fieldsV1"] = "__deep__"
    text = json.dumps(pod, separators=(",", ":"))
    return text.replace(marker, '{"f:a":' * (levels - 1) + "{}" + "}" * (levels - 1))


def best_ms(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()  # CPU time: the 2-vCPU VM is shared
        fn()
        best = min(best, time.process_time() - started)
    return best * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", default="500,5000", help="pods per page, comma-separated")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.pods.split(",")]
    print(
        f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.machine()}, best of {args.repeat}"
    )
    print(f"{'case':<52} {'bytes':>10} {'json.loads ms':>14} {'jsonload ms':>12}")

    def row(case: str, data: bytes, plain: bool) -> None:
        after = best_ms(lambda: loads(data), args.repeat)
        before = best_ms(lambda: json.loads(data), args.repeat) if plain else float("nan")
        print(f"{case:<52} {len(data):>10,} {before:>14.2f} {after:>12.2f}")

    pods = [json.dumps(served_pod(i), separators=(",", ":")) for i in range(max(sizes))]
    for n in sizes:
        row(f"page of {n:,} pods", page(pods[:n]), plain=True)
    for levels in (1_500, GO_MAX_DEPTH - 10):
        deep = serialised_deep(levels)
        assert nesting_depth(loads(deep)) == levels + 4  # pod, metadata, managedFields, [0]
        row(f"one pod, fieldsV1 {levels:,} deep", deep.encode(), plain=False)
        for n in sizes:
            mixed = [*pods[: n // 2], deep, *pods[n // 2 : n - 1]]
            row(f"page of {n:,} pods, one {levels:,} deep", page(mixed), plain=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
