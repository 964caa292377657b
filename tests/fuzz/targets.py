"""The fuzz targets: every decoder of input a tenant, a node or a file can supply.

Role: one registry (``TARGETS``) that the coverage-guided driver (``tests/fuzz/driver.py``,
``make fuzz``) and the short pass of ``make test`` (``tests/fuzz/test_fuzz.py``) both read.
A target takes raw bytes, as an attacker would hand them over (an annotation value, a request
body, a watch-event line, a protobuf message, an 80-byte frame, a file), and runs the
decoder's real entry point on them.

Invariants, the property every target is held to:

- ``run(data)`` returns, or raises one of the target's ``errors`` (the decoder's declared
  error type); anything else is a crash. A target whose decoder "never raises" declares none.
- A target that feeds state (the informer's store, the node's GPU admission ledger, the
  runtime hook's denial path) checks inside ``run`` that a refused input changed nothing and
  raises ``StateChanged`` when it did.
- Bounded time and memory are the caller's to enforce (a forked child with an address-space
  limit in the short pass; libFuzzer's ``-timeout`` and ``-rss_limit_mb`` in the driver).
- Seeds are small valid inputs built the way the tests build them (``tests.builders``,
  ``tests/unit/devices/helpers.py``'s card shape, the repository's example files).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["TARGETS", "StateChanged", "Target", "by_name"]

ROOT = Path(__file__).resolve().parents[2]


class StateChanged(AssertionError):
    """A refused input changed the state its decoder feeds."""


@dataclass(frozen=True)
class Target:
    name: str
    form: str
    """The input's shape, which picks the short pass's strategies: ``json`` (a JSON text),
    ``yaml``, ``csv``, ``proto`` (a protobuf message), ``frame`` (a fixed-size binary frame),
    ``text`` (a short annotation string)."""
    run: Callable[[bytes], object]
    errors: tuple[type[BaseException], ...]
    seeds: Callable[[], list[bytes]]
    doc: str


# -- helpers ------------------------------------------------------------------------------------


def _annotations(data: bytes) -> dict[str, str] | None:
    """A JSON object of the harness's own making as a map of annotation values (strings as
    they are, anything else as its JSON text); None when ``data`` is not one."""
    try:
        fields = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(fields, dict):
        return None
    try:
        return {k: v if isinstance(v, str) else json.dumps(v) for k, v in fields.items()}
    except (ValueError, RecursionError):
        return None


def _text(data: bytes) -> str:
    """Bytes as an annotation or a header value reaches us: the API server and gRPC only carry
    valid UTF-8 strings, so undecodable bytes are replaced (the decoder never sees bytes)."""
    return data.decode("utf-8", "replace")


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _object(data: bytes) -> Mapping[str, Any] | None:
    """``data`` decoded the way the API-server client decodes an object (``rest``'s JSON), or
    None when that client would have refused it before any decoder ran."""
    from scheduler.kube.errors import TransportError
    from scheduler.kube.rest import _event

    try:
        _, obj = _event(b'{"type":"ADDED","object":' + data + b"}")
    except TransportError:
        return None
    return obj


@cache
def _scratch() -> Path:
    """A folder of this process for file-reading targets (one file per target, rewritten),
    removed when the process exits (a forked child leaves through ``os._exit``: not by it)."""
    path = Path(tempfile.mkdtemp(prefix="koord-fuzz-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def _file(name: str, data: bytes) -> str:
    path = _scratch() / name
    path.write_bytes(data)
    return str(path)


# -- annotation codecs (apis) -------------------------------------------------------------------


def _allocation_seeds() -> list[bytes]:
    from apis.allocation import DeviceAllocation, encode_allocations

    one = DeviceAllocation.from_ints(0, {"koordinator.sh/gpu-core": 50,
                                         "koordinator.sh/gpu-memory-ratio": 50,
                                         "koordinator.sh/gpu-memory": 40 << 30})  # fmt: skip
    two = [DeviceAllocation.from_ints(m, {"koordinator.sh/gpu-core": 100}) for m in (0, 1)]
    return [
        encode_allocations({"gpu": [one]}).encode(),
        encode_allocations({"gpu": two}).encode(),
        b'{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100"},'
        b'"extension":{"vfs":[{"minor":1,"busID":"0000:1f:00.2"}]}}],"rdma":[{"minor":1,'
        b'"resources":{"koordinator.sh/rdma":"1"}}]}',
    ]


def _allocation(data: bytes) -> object:
    from apis.allocation import decode_allocations

    return decode_allocations(_text(data))


def _allocation_reading(data: bytes) -> object:
    from apis.allocation import held_amounts, read_allocations

    cards = [("gpu", m, {"koordinator.sh/gpu-core": 100, "koordinator.sh/gpu-memory-ratio": 100,
                         "koordinator.sh/gpu-memory": 80 << 30}) for m in range(2)]  # fmt: skip
    return held_amounts(read_allocations(_text(data)), cards)


def _hints(data: bytes) -> object:
    from apis.hints import parse_allocate_hints

    return parse_allocate_hints(_text(data))


def _joint(data: bytes) -> object:
    from apis.hints import parse_joint_allocate

    return parse_joint_allocate(_text(data))


def _topology(data: bytes) -> object:
    from apis.topology import GPUTopology

    return GPUTopology.decode(_text(data))


def _partition_table(data: bytes) -> object:
    from apis.partition import PartitionTable

    return PartitionTable.decode(_text(data))


def _partition_spec(data: bytes) -> object:
    from apis.partition import PartitionSpec

    return PartitionSpec.decode(_text(data))


def _topology_seeds() -> list[bytes]:
    return [
        b'{"links":[{"minors":[0,1],"gpuLinkType":"NVLink","nvlinks":12,"nvswitch":false,'
        b'"bandwidth":"300G"},{"minors":[0,2],"gpuLinkType":"PCIe","commonAncestor":"pci0"}]}',
        b'{"links":[]}',
    ]


def _partition_seeds() -> list[bytes]:
    return [
        b'{"1":[{"minors":[0]},{"minors":[1]}],"2":[{"minors":[0,1],"gpuLinkType":"NVLink",'
        b'"ringBusBandwidth":"300G","allocationScore":1}]}',
        b"{}",
    ]


def _partition_spec_seeds() -> list[bytes]:
    return [b'{"allocatePolicy":"Restricted","ringBusBandwidth":"200G"}', b"{}"]


def _gang(data: bytes) -> object:
    from apis.gang import gang_of
    from tests.builders import make_pod

    annotations = _annotations(data)
    if annotations is None:
        return None
    pod = make_pod("p").build()
    return gang_of(pod.__class__(**{**_pod_fields(pod), "annotations": annotations}))


def _pod_fields(pod: Any) -> dict[str, Any]:
    return {f: getattr(pod, f) for f in pod.__dataclass_fields__}


def _gang_seeds() -> list[bytes]:
    p = "gang.scheduling.koordinator.sh"
    return [
        _json({f"{p}/name": "g", f"{p}/min-available": "2", f"{p}/mode": "Strict",
               f"{p}/waiting-time": "30s", f"{p}/groups": '["g","other/h"]',
               f"{p}/network-topology-spec":
                   '{"gatherStrategy":[{"layer":"NodeTopologyLayer","strategy":"MustGather"}]}'}),
    ]  # fmt: skip


def _gpushare(data: bytes) -> object:
    from apis.gpushare import placement_of

    annotations = _annotations(data)
    return None if annotations is None else placement_of(annotations)


# -- API objects (the informer's decode) --------------------------------------------------------


def _decoder(decode: Callable[[Mapping[str, Any]], object]) -> Callable[[bytes], object]:
    def run(data: bytes) -> object:
        obj = _object(data)
        return None if obj is None else decode(obj)

    return run


def _device_cr_seeds() -> list[bytes]:
    card = {"type": "gpu", "id": "GPU-0", "minor": 0, "health": True,
            "resources": {"koordinator.sh/gpu-core": "100",
                          "koordinator.sh/gpu-memory": "80Gi",
                          "koordinator.sh/gpu-memory-ratio": "100"},
            "topology": {"socketID": 0, "nodeID": 0, "pcieID": "pci0000:00"},
            "labels": {"node.koordinator.sh/gpu-model": "A100"}}  # fmt: skip
    rdma = {"type": "rdma", "id": "0000:1f:00.0", "minor": 1, "health": True,
            "resources": {"koordinator.sh/rdma": "100"},
            "vfGroups": [{"labels": {"type": "general"},
                          "vfs": [{"minor": 0, "busID": "0000:1f:00.2"}]}]}  # fmt: skip
    return [
        _json({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
               "metadata": {"name": "n1", "resourceVersion": "7",
                            "annotations": {"k": "v"}},
               "spec": {"devices": [card, rdma]},
               "status": {}}),
    ]  # fmt: skip


def _pod_seeds() -> list[bytes]:
    from tests.builders import make_pod

    full = (
        make_pod("p")
        .req(cpu="1", memory="1Gi")
        .req({"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"})
        .annotation("scheduling.koordinator.sh/device-allocated", _allocation_seeds()[0].decode())
        .label("app", "a")
        .toleration("k", "v")
        .node_affinity_in("zone", ["a"])
        .priority(10)
        .node("n1")
        .phase("Running")
        .obj()
    )
    # What 1.37 keeps on a pod: gates, a native sidecar, pod-level requests, a resize's status.
    current = make_pod("r").req(cpu="1").obj()
    current["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    current["spec"]["resources"] = {"requests": {"cpu": "2", "hugepages-2Mi": "4Mi"}}
    current["spec"]["initContainers"] = [
        {"name": "s", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}}
    ]
    current["status"] = {
        "conditions": [{"type": "PodResizePending", "reason": "Infeasible"}],
        "containerStatuses": [
            {
                "name": "main",
                "allocatedResources": {"cpu": "3"},
                "resources": {"requests": {"cpu": "2"}},
            }
        ],
        "allocatedResources": {"cpu": "4"},
        "resources": {"requests": {"cpu": "4"}},
    }
    return [_json(full), _json(make_pod("q", "ns").obj()), _json(current)]


def _node_seeds() -> list[bytes]:
    from tests.builders import make_node

    node = (
        make_node("n1").cpu("64").memory("512Gi").gpu_resources(8, "80Gi").label("zone", "a")
        .taint("k", "v").obj()
    )  # fmt: skip
    return [_json(node)]


def _pdb_seeds() -> list[bytes]:
    return [
        _json({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
               "metadata": {"name": "b", "namespace": "ns", "uid": "u", "resourceVersion": "3"},
               "spec": {"selector": {"matchLabels": {"app": "a"},
                                     "matchExpressions": [{"key": "t", "operator": "In",
                                                           "values": ["x"]}]}},
               "status": {"disruptionsAllowed": 1,
                          "disruptedPods": {"p": "2024-01-01T00:00:00Z"}}}),
    ]  # fmt: skip


def _pod_group_seeds() -> list[bytes]:
    return [
        _json({"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "PodGroup",
               "metadata": {"name": "g", "namespace": "ns", "resourceVersion": "5"},
               "spec": {"minMember": 2, "scheduleTimeoutSeconds": 30}}),
    ]  # fmt: skip


def _unhealthy_seeds() -> list[bytes]:
    return [
        _json({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "unhealthy-gpu-n1", "namespace": "kube-system",
                            "resourceVersion": "9"},
               "data": {"gpus": "0, 2"}}),
    ]  # fmt: skip


def _informer(data: bytes) -> object:
    """A watch-event line through ``rest``'s event decode into a real informer's store, for
    every resource the scheduler watches. A refused object may remove its own key (the
    object as the server now has it is unusable, so the stale record goes) and nothing else."""
    from scheduler.kube.cluster import (
        device_spec,
        node_spec,
        pdb_spec,
        pod_group_spec,
        pod_spec,
        unhealthy_gpus_spec,
    )
    from scheduler.kube.errors import ApiError, TransportError
    from scheduler.kube.informer import Informer, _Gone
    from scheduler.kube.rest import _event

    try:
        etype, obj = _event(data)
    except TransportError:
        return None
    seeds = {
        "Node": _node_seeds, "Pod": _pod_seeds, "Device": _device_cr_seeds,
        "PodDisruptionBudget": _pdb_seeds, "PodGroup": _pod_group_seeds,
        "UnhealthyGPUs": _unhealthy_seeds,
    }  # fmt: skip
    for spec in (node_spec(), pod_spec(), device_spec(), pdb_spec(), pod_group_spec(),
                 unhealthy_gpus_spec()):  # fmt: skip
        informer = Informer(None, spec)  # type: ignore[arg-type]  # never lists or watches
        for seed in seeds.get(spec.kind, list)():
            informer._handle("ADDED", json.loads(seed))
        before = dict(informer._store)
        errors = informer.decode_errors
        try:
            informer._handle(etype, _copy(obj))
        except (ApiError, _Gone):
            if etype != "ERROR":
                raise
            if informer._store != before:
                raise StateChanged(f"{spec.kind}: an ERROR event changed the store") from None
            continue
        if informer.decode_errors > errors:
            after = dict(informer._store)
            gone = set(before) - set(after)
            changed = {k for k in after if k not in before or after[k] is not before[k]}
            if changed or len(gone) > 1:
                raise StateChanged(
                    f"{spec.kind}: a refused object changed the store: added or replaced "
                    f"{sorted(changed)[:3]}, removed {sorted(gone)[:3]}"
                )
    return None


def _copy(obj: Any) -> Any:
    """The informer pops ``managedFields`` from what it is given; each spec gets its own copy
    (iterative: the object may be nested deeper than the recursion limit)."""
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(obj, root, 0)]
    while stack:
        src, parent, key = stack.pop()
        if isinstance(src, dict):
            new: Any = {}
            parent[key] = new
            stack.extend((v, new, k) for k, v in src.items())
        elif isinstance(src, list):
            new = [None] * len(src)
            parent[key] = new
            stack.extend((v, new, i) for i, v in enumerate(src))
        else:
            parent[key] = src
    return root[0]


def _informer_seeds() -> list[bytes]:
    out = []
    for seed in (*_pod_seeds(), *_node_seeds(), *_device_cr_seeds(), *_pdb_seeds(),
                 *_pod_group_seeds(), *_unhealthy_seeds()):  # fmt: skip
        out.append(b'{"type":"MODIFIED","object":' + seed + b"}")
    out.append(b'{"type":"DELETED","object":{"metadata":{"name":"p","namespace":"default"}}}')
    out.append(b'{"type":"ERROR","object":{"code":410,"reason":"Expired"}}')
    out.append(b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"12"}}}')
    return out


# -- node-side input ----------------------------------------------------------------------------


def _checkpoint(data: bytes) -> object:
    from apis.checkpoint import parse_kubelet_checkpoint

    return parse_kubelet_checkpoint(data)


def _checkpoint_seeds() -> list[bytes]:
    folder = ROOT / "tests/unit/apis/fixtures/kubelet-checkpoint"
    return [p.read_bytes() for p in sorted(folder.glob("*.json"))] + [
        (ROOT / "tests/unit/koordlet/fixtures/checkpoint-device-plugin-ids.json").read_bytes()
    ]


def _devices_checkpoints(data: bytes) -> object:
    from apis.checkpoint import decode_devices_checkpoints

    return decode_devices_checkpoints(_text(data))


def _admission(data: bytes) -> object:
    """The node's device admission ledger (two GPUs, an RDMA NIC with two VFs): one admitted
    pod, then the fuzzed annotation; a refused pod must leave the admitted set and its amounts
    as they were."""
    from koordlet.admission import ADMITTED, NodeAdmission, NodeDevice

    devices = [NodeDevice("gpu", m, {"koordinator.sh/gpu-core": 100,
                                     "koordinator.sh/gpu-memory-ratio": 100,
                                     "koordinator.sh/gpu-memory": 80 << 30}) for m in range(2)]
    devices.append(NodeDevice("rdma", 3, {"koordinator.sh/rdma": 100},
                              frozenset({"0000:5e:00.2", "0000:5e:00.3"})))  # fmt: skip
    ledger = NodeAdmission(lambda: devices, device_types=("gpu", "rdma"), ready_wait_s=0)
    ledger.observe([], 0.0)
    first = _allocation_seeds()[0].decode()
    assert ledger.decide("u0", "ns", "p0", first).outcome == ADMITTED
    before = {uid: (e.reading) for uid, e in ledger._admitted.items()}
    verdict = ledger.decide("u1", "ns", "p1", _text(data))
    after = {uid: (e.reading) for uid, e in ledger._admitted.items()}
    if verdict.outcome != ADMITTED and after != before:
        raise StateChanged(f"a refused allocation changed the admitted pods: {verdict}")
    return verdict


def _hook_request_seeds() -> list[bytes]:
    from runtimehooks.api import api_pb2

    req = api_pb2.ContainerResourceHookRequest(
        pod_meta=api_pb2.PodSandboxMetadata(name="p", uid="u", namespace="ns"),
        container_meta=api_pb2.ContainerMetadata(name="main", id="c1"),
        pod_annotations={
            "scheduling.koordinator.sh/device-allocated": _allocation_seeds()[0].decode()
        },
        pod_labels={"app": "a"},
        container_envs={"A": "1"},
        container_resources=api_pb2.LinuxContainerResources(cpu_shares=1024, unified={"a": "b"}),
    )
    return [req.SerializeToString()]


def _hook_container(data: bytes) -> object:
    """A PreCreateContainer request as gRPC hands it over: protobuf bytes, parsed, decoded to
    our context, run through the GPU hook. A bad annotation is a denial (the container gets
    no card); a denial for an internal error is a bug, a crash here."""
    from google.protobuf.message import DecodeError

    from runtimehooks import protocol
    from runtimehooks.api import api_pb2
    from runtimehooks.hooks.gpu import (
        ENV_NVIDIA_VISIBLE_DEVICES,
        NO_GPU,
        REASON_INTERNAL_ERROR,
        GPUHook,
    )

    req = api_pb2.ContainerResourceHookRequest()
    try:
        req.ParseFromString(data)
    except DecodeError:
        return None
    ctx = protocol.container_context(req)
    denials: list[Any] = []

    class Sink:
        def denied(self, denial: Any) -> None:
            denials.append(denial)

    out = GPUHook(denials=Sink())(ctx)
    for d in denials:
        if d.reason == REASON_INTERNAL_ERROR:
            raise AssertionError(f"gpu hook internal error: {d.message}")
        # fail closed: the request's environment, and no card
        if out.container_envs != {**ctx.container_envs, ENV_NVIDIA_VISIBLE_DEVICES: NO_GPU}:
            raise StateChanged(f"a denied container's environment: {out.container_envs}")
    protocol.container_response(out).SerializeToString()
    return out


def _hook_sandbox(data: bytes) -> object:
    from google.protobuf.message import DecodeError

    from runtimehooks import protocol
    from runtimehooks.api import api_pb2

    req = api_pb2.PodSandboxHookRequest()
    try:
        req.ParseFromString(data)
    except DecodeError:
        return None
    ctx = protocol.sandbox_context(req)
    return protocol.sandbox_response(ctx).SerializeToString()


def _sandbox_seeds() -> list[bytes]:
    from runtimehooks.api import api_pb2

    req = api_pb2.PodSandboxHookRequest(
        pod_meta=api_pb2.PodSandboxMetadata(name="p", uid="u", namespace="ns"),
        labels={"a": "b"}, annotations={"c": "d"}, cgroup_parent="/kubepods",
        resources=api_pb2.LinuxContainerResources(cpu_quota=1000),
    )  # fmt: skip
    return [req.SerializeToString()]


def _frame(data: bytes) -> object:
    from koordlet.fairshare.protocol import decode_request

    return decode_request(data)


def _frame_seeds() -> list[bytes]:
    from koordlet.fairshare.protocol import (
        MemLimitRequest,
        MemUpdateRequest,
        QuotaRequest,
        encode_request,
    )

    return [
        encode_request(QuotaRequest("pod-a", 1, 10.0, 5.0)),
        encode_request(MemLimitRequest("pod-a", 2)),
        encode_request(MemUpdateRequest("pod-a", 3, 1 << 20, True)),
    ]


def _fairshare_server(data: bytes) -> object:
    """Bytes sent to a real fair-share server's relay port (loopback) while the pod holds
    memory on another connection. When the first frame is refused the connection is closed
    and nothing may change: the pod's memory, its clients, the other connection's answers."""
    import socket

    from apis.fairshare import FairShareSpec
    from koordlet.fairshare.client import GeminiClient
    from koordlet.fairshare.protocol import REQUEST_SIZE, ProtocolError, decode_request
    from koordlet.fairshare.server import FairShareConfig, FairShareServer
    from koordlet.fairshare.tokens import SchedulerConfig
    from koordlet.pods.fairshare import FairSharePod

    try:
        decode_request(data[:REQUEST_SIZE])
        refused = False
    except ProtocolError:
        refused = len(data) >= REQUEST_SIZE
    fast = SchedulerConfig(window_ms=2_000, base_quota_ms=50, min_quota_ms=20)
    server = FairShareServer(FairShareConfig(scheduler=fast, grace_s=60.0))
    server.start()
    try:
        pod = FairSharePod("u", "ns", "p", FairShareSpec(0, 0.5, 1.0, 1 << 30))
        ep = server.ensure(pod)
        with GeminiClient(ep.manager_ip, ep.manager_port, "relay", timeout_s=30) as holder:
            assert holder.mem_update(100 << 20, True)

            def state() -> object:
                stats = [(c.uid, c.share, c.limit) for c in server.stats()]
                return holder.mem_limit(), stats

            before, errors = state(), server.protocol_errors
            with socket.create_connection((ep.manager_ip, ep.manager_port), timeout=30) as s:
                try:
                    s.sendall(data)
                    s.shutdown(socket.SHUT_WR)
                    while s.recv(1 << 16):
                        pass
                except OSError:  # the server closed the connection first: its refusal
                    pass
            if refused:
                if server.protocol_errors != errors + 1:
                    raise StateChanged("a malformed frame was not counted")
                if state() != before:
                    raise StateChanged(f"a refused frame changed the server: {before} -> {state()}")
    finally:
        server.stop()
    return None


def _response_frame(data: bytes) -> object:
    from koordlet.fairshare.protocol import RequestType, decode_response

    return [decode_response(data, kind) for kind in RequestType]


def _response_frame_seeds() -> list[bytes]:
    from koordlet.fairshare.protocol import QuotaResponse, encode_response

    return [encode_response(QuotaResponse(1, 10.0))]


def _fake_gpus(data: bytes) -> object:
    from koordlet.devices.fake import load_fake_spec

    return load_fake_spec(_file("fake-gpus.yaml", data))


def _fake_gpu_seeds() -> list[bytes]:
    return [p.read_bytes() for p in sorted((ROOT / "config/examples").glob("fake-gpus*.yaml"))]


def _toolkit_config(data: bytes) -> object:
    """The NVIDIA container toolkit's config.toml as koordlet judges it: ``check()`` never
    raises and always gives one of the verdicts."""
    from koordlet.devices.toolkit import STATES, ToolkitCheck

    verdict = ToolkitCheck(_file("config.toml", data), "cdi").check()
    if verdict.state not in STATES:
        raise AssertionError(f"not a verdict: {verdict}")
    return verdict


def _toolkit_seeds() -> list[bytes]:
    key = b"accept-nvidia-visible-devices-envvar-when-unprivileged"
    return [
        key + b" = false\naccept-nvidia-visible-devices-as-volume-mounts = true\n",
        b'disable-require = false\n[nvidia-container-runtime]\nmode = "auto"\n'
        b'runtimes = ["docker-runc", "runc"]\n'
        b'[nvidia-container-cli]\nldconfig = "@/sbin/ldconfig"\n',
        key + b' = true\nswarm-resource = "DOCKER_RESOURCE_GPU"\nx = {a = [1, 2], b = "c"}\n',
    ]


# -- the scheduler's HTTP bodies ----------------------------------------------------------------


def _extender(data: bytes) -> object:
    from scheduler.extender.protocol import (
        ExtenderRequestError,
        decode_binding_args,
        decode_extender_args,
        decode_preemption_args,
    )

    out = []
    for decode in (decode_extender_args, decode_binding_args, decode_preemption_args):
        with contextlib.suppress(ExtenderRequestError):
            out.append(decode(data))
    return out


def _extender_seeds() -> list[bytes]:
    pod = json.loads(_pod_seeds()[1])
    node = json.loads(_node_seeds()[0])
    return [
        _json({"pod": pod, "nodenames": ["n1", "n2"]}),
        _json({"pod": pod, "nodes": {"items": [node]}}),
        _json({"podName": "p", "podNamespace": "ns", "podUID": "u", "node": "n1"}),
        _json({"pod": pod, "nodeNameToVictims": {"n1": {"pods": [{"metadata": {"uid": "v"}}],
                                                         "numPDBViolations": 0}}}),
        _json({"pod": pod, "nodeNameToMetaVictims": {"n1": {"pods": [{"uid": "v"}],
                                                             "numPDBViolations": 1}}}),
    ]  # fmt: skip


def _webhook(data: bytes) -> object:
    from scheduler.webhook.review import decode_review

    return decode_review(data)


def _webhook_seeds() -> list[bytes]:
    pod = json.loads(_pod_seeds()[0])
    return [
        _json({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
               "request": {"uid": "r1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                           "resource": {"group": "", "version": "v1", "resource": "pods"},
                           "namespace": "ns", "operation": "CREATE", "object": pod,
                           "userInfo": {"username": "u", "groups": ["g"]}}}),
    ]  # fmt: skip


# -- the simulator's files ----------------------------------------------------------------------

def _trace_nodes(data: bytes) -> object:
    from scheduler.simulator.trace import read_nodes

    return read_nodes(_file("nodes.csv", data))


def _trace_pods(data: bytes) -> object:
    from scheduler.simulator.trace import read_pods

    return read_pods(_file("pods.csv", data))


def _trace_node_seeds() -> list[bytes]:
    return [b"sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,32000,1024,0,\n"]


def _trace_pod_seeds() -> list[bytes]:
    return [
        b"name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        b"p0,1000,1024,1,500,\np1,2000,2048,2,1000,V100M16|V100M32\n"
    ]


def _sweep(data: bytes) -> object:
    from scheduler.plugins.registry import default_plugins, in_tree_registry
    from scheduler.simulator.sweep import load_sweep

    _file("n.csv", _trace_node_seeds()[0])
    _file("p.csv", _trace_pod_seeds()[0])
    return load_sweep(_file("sweep.yaml", data), in_tree_registry(), default_plugins())


def _sweep_seeds() -> list[bytes]:
    return [
        b"nodes: n.csv\ntraces: [p.csv]\nprofiles: [fgd, fragmentation]\nseeds: 42-43\n"
        b"inflate: 1.3\ntargetWorkload: trace\n"
        b"variants: {strand2: {GPUFragmentation: {gradient: {strandedWeight: 2}}}}\n",
        b"nodes: n.csv\ntraces:\n  - p.csv\nprofiles: random\nseeds: [1, 2]\n",
    ]


def _scenario(data: bytes) -> object:
    from scheduler.simulator.scenario import load_scenario

    return load_scenario(_file("scenario.yaml", data))


def _scenario_seeds() -> list[bytes]:
    return [(ROOT / "config/examples/demo-cluster.yaml").read_bytes()]


def _config(data: bytes) -> object:
    from scheduler.config import load_config

    return load_config(_file("config.yaml", data))


def _config_seeds() -> list[bytes]:
    return [(ROOT / "config/examples/demo-topology-config.yaml").read_bytes()]


# -- the registry -------------------------------------------------------------------------------


def _errors(*names: str) -> tuple[type[BaseException], ...]:
    import importlib

    out = []
    for name in names:
        module, _, attr = name.rpartition(".")
        out.append(getattr(importlib.import_module(module), attr))
    return tuple(out)


@cache
def _registry() -> dict[str, Target]:
    from apis.core import decode_node, decode_pod
    from apis.device import Device
    from apis.disruption import decode_pdb
    from apis.gang import decode_pod_group
    from apis.gpushare import decode_unhealthy
    from scheduler.kube.cluster import decode_cached_pod

    t = [
        Target("allocation", "json", _allocation, _errors("apis.allocation.AllocationDecodeError"),
               _allocation_seeds, "the device-allocated annotation (decode_allocations)"),
        Target("allocation-reading", "json", _allocation_reading, (), _allocation_seeds,
               "the ledger's reading of any bound pod's annotation (read_allocations; never "
               "raises)"),
        Target("hints", "json", _hints, _errors("apis.hints.HintDecodeError"),
               lambda: [b'{"gpu":{"selector":{"matchLabels":{"a":"b"}},"allocateStrategy":'
                        b'"ApplyForAll","requiredTopologyScope":"PCIe"}}'],
               "the device-allocate-hint annotation"),
        Target("joint-allocate", "json", _joint, _errors("apis.hints.HintDecodeError"),
               lambda: [b'{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}'],
               "the device-joint-allocate annotation"),
        Target("topology", "json", _topology, _errors("apis.topology.TopologyDecodeError"),
               _topology_seeds, "the Device CR's GPU topology annotation"),
        Target("partition-table", "json", _partition_table,
               _errors("apis.partition.PartitionDecodeError"), _partition_seeds,
               "the Device CR's GPU partition table annotation"),
        Target("partition-spec", "json", _partition_spec,
               _errors("apis.partition.PartitionDecodeError"), _partition_spec_seeds,
               "a pod's gpu-partition-spec annotation"),
        Target("gang", "json", _gang, _errors("apis.gang.GangSpecError"), _gang_seeds,
               "a pod's gang annotations (gang_of; input: a JSON map of annotations)"),
        Target("gpushare-placement", "json", _gpushare,
               _errors("apis.gpushare.GPUShareDecodeError"),
               lambda: [b'{"ALIYUN_COM_GPU_MEM_IDX":"1","ALIYUN_COM_GPU_MEM_POD":"4"}'],
               "gpushare's placement annotations (placement_of)"),
        Target("device-cr", "json", _decoder(Device.from_dict),
               _errors("apis.device.DeviceDecodeError"), _device_cr_seeds, "a Device CR"),
        Target("pod", "json", _decoder(decode_pod), _errors("apis.core.DecodeError"),
               _pod_seeds, "a v1 Pod (decode_pod)"),
        Target("cached-pod", "json", _decoder(decode_cached_pod),
               _errors("apis.core.DecodeError"), _pod_seeds, "a Pod as the informer keeps it"),
        Target("node", "json", _decoder(decode_node), _errors("apis.core.DecodeError"),
               _node_seeds, "a v1 Node"),
        Target("pdb", "json", _decoder(decode_pdb), _errors("apis.core.DecodeError"),
               _pdb_seeds, "a PodDisruptionBudget"),
        Target("pod-group", "json", _decoder(decode_pod_group), _errors("apis.gang.GangSpecError"),
               _pod_group_seeds, "a PodGroup"),
        Target("unhealthy-gpus", "json", _decoder(decode_unhealthy),
               _errors("apis.gpushare.GPUShareDecodeError"), _unhealthy_seeds,
               "gpushare's unhealthy-gpu ConfigMap"),
        Target("informer", "json", _informer, (), _informer_seeds,
               "a watch-event line into every informer's store (state: a refused object "
               "removes at most its own key)"),
        Target("kubelet-checkpoint", "json", _checkpoint,
               _errors("apis.checkpoint.CheckpointError"), _checkpoint_seeds,
               "the kubelet's device-manager checkpoint file"),
        Target("devices-checkpoints", "json", _devices_checkpoints,
               _errors("apis.checkpoint.CheckpointError"),
               lambda: [b'[{"PodUID":"u","ContainerName":"c","ResourceName":"nvidia.com/gpu",'
                        b'"DeviceIDs":["GPU-0"],"AllocResp":""}]'],
               "the devices-checkpoints node annotation"),
        Target("admission", "json", _admission, (), _allocation_seeds,
               "the node's GPU admission ledger (state: a refused pod admits nothing)"),
        Target("hook-container", "proto", _hook_container, (), _hook_request_seeds,
               "a ContainerResourceHookRequest (protobuf) through the GPU hook (state: a "
               "denied container gets the request's environment and no card)"),
        Target("hook-sandbox", "proto", _hook_sandbox, (), _sandbox_seeds,
               "a PodSandboxHookRequest (protobuf) to our context and back"),
        Target("fairshare-request", "frame", _frame,
               _errors("koordlet.fairshare.protocol.ProtocolError"), _frame_seeds,
               "a fair-share client's 80-byte request frame"),
        Target("fairshare-server", "frame", _fairshare_server, (), _frame_seeds,
               "bytes on a real fair-share server's relay port (state: a refused first frame "
               "changes nothing)"),
        Target("fairshare-response", "frame", _response_frame,
               _errors("koordlet.fairshare.protocol.ProtocolError"), _response_frame_seeds,
               "a fair-share server's 40-byte response frame (the client side)"),
        Target("fake-gpus", "yaml", _fake_gpus, _errors("koordlet.devices.fake.FakeSpecError"),
               _fake_gpu_seeds, "a fake-GPU YAML file"),
        Target("toolkit-config", "toml", _toolkit_config, (), _toolkit_seeds,
               "the NVIDIA container toolkit's config.toml (koordlet's isolation verdict; "
               "never raises)"),
        Target("extender", "json", _extender, (), _extender_seeds,
               "the extender's filter/prioritize, bind and preempt bodies (each decoder "
               "raises only ExtenderRequestError; the target catches it per decoder)"),
        Target("webhook", "json", _webhook, _errors("scheduler.webhook.review.ReviewError"),
               _webhook_seeds, "the webhook's AdmissionReview body"),
        Target("trace-nodes", "csv", _trace_nodes,
               _errors("scheduler.simulator.trace.TraceError"), _trace_node_seeds,
               "an openb node-list CSV"),
        Target("trace-pods", "csv", _trace_pods, _errors("scheduler.simulator.trace.TraceError"),
               _trace_pod_seeds, "an openb pod-list CSV"),
        Target("sweep", "yaml", _sweep,
               _errors("scheduler.simulator.replay_job.ReplayUsageError"), _sweep_seeds,
               "a simulate --sweep file"),
        Target("scenario", "yaml", _scenario,
               _errors("scheduler.simulator.scenario.ScenarioError"), _scenario_seeds,
               "a simulate/explain scenario file"),
        Target("config", "yaml", _config, _errors("scheduler.config.ConfigError"),
               _config_seeds, "a scheduler configuration file"),
    ]
    return {x.name: x for x in t}


def TARGETS() -> dict[str, Target]:
    return _registry()


def by_name(name: str) -> Target:
    try:
        return _registry()[name]
    except KeyError:
        raise KeyError(f"no fuzz target {name!r} (known: {', '.join(_registry())})") from None

