"""CDI delivery of the RDMA hook's devices: the spec writer (runtimehooks/cdi.py) and the hook
with it, on a fake sysfs tree and a temporary CDI directory; hostile allocations refused with
one log line and nothing written; and a property: over random pod/container/sandbox histories,
no container's CDI annotation ever resolves to a device node not allocated to its own pod."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from apis.allocation import (
    ANNOTATION_DEVICE_ALLOCATED,
    AllocatedVF,
    AllocationExtension,
    DeviceAllocation,
    encode_allocations,
)
from runtimehooks.cdi import (
    ANNOTATION_KEY,
    ANNOTATION_PREFIX,
    KIND,
    MAX_DEVICE_NODES,
    REFUSED_DEVICE,
    CDIError,
    CDISpecs,
    qualified_name,
    spec_json,
)
from runtimehooks.context import (
    ContainerContext,
    ContainerMeta,
    LinuxDevice,
    PodMeta,
    PodSandboxContext,
)
from runtimehooks.hooks import new_default_registry
from runtimehooks.hooks.rdma import REASON_RDMA_UNAVAILABLE, RDMAHook
from runtimehooks.ports import Denial
from runtimehooks.registry import Stage
from tests.fake_sysfs import RDMA_CM, UVERBS_MAJOR, FakeSysfs

NIC_A, NIC_B = "0000:18:00.0", "0000:5e:00.0"
VFS_A = ("0000:18:00.2", "0000:18:00.3", "0000:18:00.4")  # uverbs1..3
VFS_B = ("0000:5e:00.2", "0000:5e:00.3", "0000:5e:00.4")  # uverbs5..7
UVERBS = {NIC_A: 0, **{b: 1 + i for i, b in enumerate(VFS_A)},
          NIC_B: 4, **{b: 5 + i for i, b in enumerate(VFS_B)}}


def _build(root: Path) -> Path:
    fs = FakeSysfs(root)
    fs.nic(NIC_A, 0, vfs=3)
    fs.nic(NIC_B, 1, vfs=3)
    return root


@pytest.fixture(scope="module")
def sysfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("sysfs"))


def _node(bus: str) -> tuple[str, int, int]:
    n = UVERBS[bus]
    return (f"/dev/infiniband/uverbs{n}", UVERBS_MAJOR, 192 + n)


CM_NODE = ("/dev/infiniband/rdma_cm", *RDMA_CM)


def _annotation(*entries: tuple[str, tuple[str, ...]]) -> str:
    return encode_allocations({"rdma": [
        DeviceAllocation.from_ints(i, {"koordinator.sh/rdma": 1}, pf, AllocationExtension(
            vfs=tuple(AllocatedVF(-1, b) for b in vfs)) if vfs else None)
        for i, (pf, vfs) in enumerate(entries)
    ]})


def _ctx(alloc: str | None, uid: str = "uid-a", container: str = "main",
         annotations: dict[str, str] | None = None) -> ContainerContext:
    return ContainerContext(
        pod_meta=PodMeta("p", uid, "ns"), container_meta=ContainerMeta(container),
        pod_annotations={ANNOTATION_DEVICE_ALLOCATED: alloc} if alloc is not None else {},
        container_annotations=annotations or {"io.kubernetes.container.hash": "1"})


def _resolve(cdi_dir: Path) -> dict[str, list[tuple[str, int, int]]]:
    """What a CDI runtime sees in the directory: qualified name -> device nodes (a name
    defined twice fails, as CDI's cache reports a conflict)."""
    out: dict[str, list[tuple[str, int, int]]] = {}
    for f in sorted(cdi_dir.glob("*.json")) if cdi_dir.is_dir() else []:
        spec = json.loads(f.read_text())
        assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == KIND
        for dev in spec["devices"]:
            name = f"{spec['kind']}={dev['name']}"
            assert name not in out, f"{name} defined twice"
            out[name] = [(n["path"], n["major"], n["minor"])
                         for n in dev["containerEdits"]["deviceNodes"]]
    return out


def _named(annotations: Mapping[str, str]) -> list[str]:
    """Every device name the CDI annotations request."""
    return [n for k, v in annotations.items() if k.startswith(ANNOTATION_PREFIX)
            for n in v.split(",")]


class Sink:
    def __init__(self) -> None:
        self.denials: list[Denial] = []

    def denied(self, denial: Denial) -> None:
        self.denials.append(denial)


# -- the writer ----------------------------------------------------------------------------------


def test_spec_file_format_mode_and_atomic_write(tmp_path: Path) -> None:
    cdi = CDISpecs(tmp_path / "cdi")
    name = cdi.write("0a1b-c2", "main", [LinuxDevice("/dev/infiniband/rdma_cm", 10, 58),
                                         LinuxDevice("/dev/infiniband/uverbs1", 231, 193)])
    assert name == "koordinator.sh/rdma=0a1b-c2_main" == qualified_name("0a1b-c2", "main")
    files = os.listdir(tmp_path / "cdi")
    assert files == ["koordinator.sh-rdma_0a1b-c2_main.json"]  # no temporary file left
    path = tmp_path / "cdi" / files[0]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert json.loads(path.read_text()) == {
        "cdiVersion": "0.5.0",
        "kind": "koordinator.sh/rdma",
        "devices": [{"name": "0a1b-c2_main", "containerEdits": {"deviceNodes": [
            {"path": "/dev/infiniband/rdma_cm", "type": "c", "major": 10, "minor": 58,
             "fileMode": 0o666, "permissions": "rw"},
            {"path": "/dev/infiniband/uverbs1", "type": "c", "major": 231, "minor": 193,
             "fileMode": 0o666, "permissions": "rw"},
        ]}}],
    }


@pytest.mark.parametrize(("uid", "container"), [
    ("../etc", "main"), ("uid", "../../x"), ("a/b", "main"), ("uid", "Main"), ("", "main"),
    ("uid_x", "main"), ("uid", "a_b"), ("uid", "a.b"), ("x" * 64, "main"),
], ids=lambda v: repr(v)[:12])
def test_names_that_do_not_qualify_are_refused(tmp_path: Path, uid: str, container: str) -> None:
    cdi = CDISpecs(tmp_path / "cdi")
    with pytest.raises(CDIError):
        cdi.write(uid, container, [LinuxDevice("/dev/infiniband/rdma_cm", 10, 58)])
    assert sorted(p.name for p in tmp_path.rglob("*")) in ([], ["cdi"])


@pytest.mark.parametrize("dev", [
    LinuxDevice("/etc/passwd", 10, 58), LinuxDevice("/dev/../etc/shadow", 10, 58),
    LinuxDevice("/dev/x", 0, 1), LinuxDevice("/dev/x", 10, 1, type="p"),
])
def test_devices_that_are_not_device_nodes_are_refused(dev: LinuxDevice) -> None:
    with pytest.raises(CDIError):
        spec_json("uid", "main", [dev])


def test_too_many_nodes_and_none_are_refused() -> None:
    dev = LinuxDevice("/dev/infiniband/uverbs0", 231, 192)
    with pytest.raises(CDIError):
        spec_json("uid", "main", [dev] * (MAX_DEVICE_NODES + 1))
    with pytest.raises(CDIError):
        spec_json("uid", "main", [])


def test_a_failed_write_leaves_no_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cdi").write_text("a file, not a directory")
    with pytest.raises(CDIError):
        CDISpecs(tmp_path / "cdi").write("uid", "main", [LinuxDevice("/dev/x", 10, 1)])
    cdi_dir = tmp_path / "specs"
    cdi = CDISpecs(cdi_dir)
    cdi.write("uid", "main", [LinuxDevice("/dev/x", 10, 1)])

    def disk_full(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    # The rename fails (as a full or read-only disk fails it, root or not): the new content
    # never lands, the earlier spec of that name is gone, no temporary file is left.
    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(CDIError):
        cdi.write("uid", "main", [LinuxDevice("/dev/x", 10, 2)])
    assert os.listdir(cdi_dir) == []


def test_remove_pod_and_retain(tmp_path: Path) -> None:
    now = [100.0]
    cdi = CDISpecs(tmp_path, monotonic=lambda: now[0])
    dev = [LinuxDevice("/dev/x", 10, 1)]
    cdi.write("uid-a", "main", dev)
    cdi.write("uid-a", "side", dev)
    cdi.write("uid-b", "main", dev)
    (tmp_path / "nvidia.json").write_text("{}")  # another vendor's spec: never touched
    assert cdi.remove_pod("uid-a") == 2
    assert cdi.remove_pod("uid-a") == 0
    now[0] = 200.0
    cdi.write("uid-c", "main", dev)  # written after the list below started
    assert cdi.retain(frozenset({"uid-x"}), listed_at=150.0) == 1  # uid-b goes, uid-c stays
    assert sorted(os.listdir(tmp_path)) == ["koordinator.sh-rdma_uid-c_main.json",
                                            "nvidia.json"]
    assert cdi.retain(frozenset(), listed_at=250.0) == 1
    assert os.listdir(tmp_path) == ["nvidia.json"]


def test_specs_left_by_a_previous_agent_go_with_the_first_list(tmp_path: Path) -> None:
    CDISpecs(tmp_path).write("uid-old", "main", [LinuxDevice("/dev/x", 10, 1)])
    assert CDISpecs(tmp_path).retain(frozenset({"uid-new"}), listed_at=0.0) == 1
    assert os.listdir(tmp_path) == []


# -- the hook with CDI ---------------------------------------------------------------------------


def test_each_container_gets_its_own_entry_naming_exactly_its_devices(
    sysfs: Path, tmp_path: Path
) -> None:
    hook = RDMAHook(sysfs, cdi=CDISpecs(tmp_path))
    a = _annotation((NIC_A, (VFS_A[1],)))
    b = _annotation((NIC_A, (VFS_A[0],)), (NIC_B, ()))
    outs = {(uid, c): hook(_ctx(alloc, uid, c)) for uid, alloc, c in
            [("uid-a", a, "main"), ("uid-a", a, "side"), ("uid-b", b, "main")]}
    specs = _resolve(tmp_path)
    assert specs == {
        "koordinator.sh/rdma=uid-a_main": [CM_NODE, _node(VFS_A[1])],
        "koordinator.sh/rdma=uid-a_side": [CM_NODE, _node(VFS_A[1])],
        "koordinator.sh/rdma=uid-b_main": [CM_NODE, _node(VFS_A[0]), _node(NIC_B)],
    }
    for (uid, c), out in outs.items():
        assert dict(out.container_annotations) == {
            "io.kubernetes.container.hash": "1", ANNOTATION_KEY: f"{KIND}={uid}_{c}"}
        assert [(d.path, d.major, d.minor) for d in out.devices] == specs[f"{KIND}={uid}_{c}"]


def test_sandbox_stop_removes_the_pods_entries_only(sysfs: Path, tmp_path: Path) -> None:
    hook = RDMAHook(sysfs, cdi=CDISpecs(tmp_path))
    a = _annotation((NIC_A, (VFS_A[1],)))
    hook(_ctx(a, "uid-a", "main"))
    hook(_ctx(a, "uid-b", "main"))
    registry = new_default_registry(rdma=hook)
    assert [h.name for h in registry.hooks(Stage.POST_STOP_POD_SANDBOX)] == ["rdma cdi cleanup"]
    sandbox = PodSandboxContext(pod_meta=PodMeta("p", "uid-a", "ns"))
    assert registry.run_sandbox(Stage.POST_STOP_POD_SANDBOX, sandbox) == sandbox
    assert list(_resolve(tmp_path)) == ["koordinator.sh/rdma=uid-b_main"]
    assert Stage.POST_STOP_POD_SANDBOX in registry.stages()
    assert Stage.POST_STOP_POD_SANDBOX not in new_default_registry(rdma=RDMAHook(sysfs)).stages()


HOSTILE = [
    pytest.param(_annotation((NIC_A, ("0000:99:00.2",))), id="vf-not-on-this-node"),
    pytest.param(_annotation((NIC_A, (VFS_B[0],))), id="vf-of-another-nic"),
    pytest.param(_annotation((NIC_A, (NIC_B,))), id="a-pf-as-vf"),
    pytest.param(_annotation(("../../../etc", ())), id="path-as-bus-id"),
    pytest.param(_annotation((NIC_A, ("0000:18:00.2/../../..",))), id="path-in-vf"),
    pytest.param(_annotation((NIC_A, ("0000:18:00.2",) * 200)), id="huge-allocation"),
    pytest.param('{"rdma":[{"minor":"../x"}]}', id="undecodable-minor"),
]


@pytest.mark.parametrize("alloc", HOSTILE)
def test_hostile_allocations_are_refused_with_one_line_and_nothing_written(
    sysfs: Path, tmp_path: Path, alloc: str
) -> None:
    sink = Sink()
    cdi_dir = tmp_path / "cdi"
    before = sorted(p for p in sysfs.rglob("*"))
    hook = RDMAHook(sysfs, denials=sink, cdi=CDISpecs(cdi_dir))
    with capture_logs() as logs:
        out = hook(_ctx(alloc))
    assert out.devices == ()
    assert ANNOTATION_KEY not in out.container_annotations
    # An annotation that does not decode is the GPU hook's to report (invalid-allocation).
    reported = [] if "../x" in alloc else [("main", REASON_RDMA_UNAVAILABLE)]
    assert [(d.container, d.reason) for d in sink.denials] == reported
    warnings = [e for e in logs if e["log_level"] in ("warning", "error")]
    assert len(warnings) == 1 and warnings[0]["event"].startswith("rdma allocation not served")
    assert list(tmp_path.rglob("*")) == []  # not even the CDI directory
    assert sorted(p for p in sysfs.rglob("*")) == before


@pytest.mark.parametrize(("uid", "container"), [("../up", "main"), ("uid-a", "../../x")])
def test_hostile_names_are_refused(sysfs: Path, tmp_path: Path, uid: str, container: str) -> None:
    sink = Sink()
    out = RDMAHook(sysfs, denials=sink, cdi=CDISpecs(tmp_path / "cdi"))(
        _ctx(_annotation((NIC_A, (VFS_A[0],))), uid, container))
    assert out.devices == () and ANNOTATION_KEY not in out.container_annotations
    assert len(sink.denials) == 1
    assert list(tmp_path.rglob("*")) == []


def test_an_unwritable_cdi_dir_is_a_denial_without_annotation(
    sysfs: Path, tmp_path: Path
) -> None:
    (tmp_path / "cdi").write_text("not a directory")
    sink = Sink()
    out = RDMAHook(sysfs, denials=sink, cdi=CDISpecs(tmp_path / "cdi"))(
        _ctx(_annotation((NIC_A, (VFS_A[0],)))))
    assert out.devices == () and ANNOTATION_KEY not in out.container_annotations
    assert [d.reason for d in sink.denials] == [REASON_RDMA_UNAVAILABLE]


def test_foreign_device_names_in_the_request_are_removed(sysfs: Path, tmp_path: Path) -> None:
    hook = RDMAHook(sysfs, cdi=CDISpecs(tmp_path))
    a = _annotation((NIC_A, (VFS_A[0],)))
    hook(_ctx(_annotation((NIC_B, (VFS_B[0],))), "uid-victim", "main"))
    planted = {
        "cdi.k8s.io/other": f"vendor.com/gpu=0,{KIND}=uid-victim_main",
        "cdi.k8s.io/only-foreign": f"{KIND}=uid-victim_main",
        ANNOTATION_KEY: f"{KIND}=uid-victim_main",
        "unrelated": f"{KIND}=uid-victim_main",
    }
    out = hook(_ctx(a, "uid-a", "main", planted))
    assert dict(out.container_annotations) == {
        "cdi.k8s.io/other": "vendor.com/gpu=0",
        "cdi.k8s.io/only-foreign": REFUSED_DEVICE,
        ANNOTATION_KEY: f"{KIND}=uid-a_main",
        "unrelated": f"{KIND}=uid-victim_main",  # not a CDI annotation: runtimes ignore it
    }
    # a pod without RDMA, and a denied one, get no foreign name either
    for ctx in (_ctx(None, "uid-c", "main", planted),
                _ctx(_annotation((NIC_A, ("0000:99:00.2",))), "uid-d", "main", planted)):
        named = _named(hook(ctx).container_annotations)
        assert f"{KIND}=uid-victim_main" not in named


def test_a_refused_re_creation_leaves_no_earlier_spec(sysfs: Path, tmp_path: Path) -> None:
    hook = RDMAHook(sysfs, cdi=CDISpecs(tmp_path))
    hook(_ctx(_annotation((NIC_A, (VFS_A[0],)))))
    assert list(_resolve(tmp_path)) == ["koordinator.sh/rdma=uid-a_main"]
    out = hook(_ctx(_annotation((NIC_A, ("0000:99:00.2",)))))  # same uid and container
    assert ANNOTATION_KEY not in out.container_annotations
    assert _resolve(tmp_path) == {}


def test_without_cdi_nothing_is_annotated(sysfs: Path) -> None:
    out = RDMAHook(sysfs)(_ctx(_annotation((NIC_A, (VFS_A[0],)))))
    assert len(out.devices) == 2
    assert ANNOTATION_KEY not in out.container_annotations


# -- the property --------------------------------------------------------------------------------

PODS = ("p0", "p1", "p2")
CONTAINERS = ("main", "side")
ALL_VFS = VFS_A + VFS_B
_op = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(PODS),
              st.lists(st.sampled_from((*ALL_VFS, "0000:99:00.2")), max_size=3)),
    st.tuples(st.just("container"), st.sampled_from(PODS), st.sampled_from(CONTAINERS),
              st.booleans()),
    st.tuples(st.just("stop"), st.sampled_from(PODS)),
    st.tuples(st.just("delete"), st.sampled_from(PODS)),
    st.tuples(st.just("list")),
)


def _pf(vf: str) -> str:
    return vf.rsplit(".", 1)[0] + ".0"


@pytest.fixture(scope="module")
def cdi_root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="cdi-prop-") as d:
        yield Path(d)


@given(ops=st.lists(_op, max_size=25))
def test_no_container_ever_resolves_to_a_device_of_another_pod(
    sysfs: Path, cdi_root: Path, ops: list[tuple[object, ...]]
) -> None:
    with tempfile.TemporaryDirectory(dir=cdi_root) as d:
        cdi_dir = Path(d)
        now = [0.0]
        specs_dir = CDISpecs(cdi_dir, monotonic=lambda: now[0])
        registry = new_default_registry(rdma=RDMAHook(sysfs, cdi=specs_dir))
        live: dict[str, tuple[str, tuple[str, ...]]] = {}  # name -> (uid, allocated VFs)
        generation = 0
        seen_uids: list[str] = []
        for op in ops:
            now[0] += 1.0
            if op[0] == "create":  # (re-)created under its name: a new uid
                assert isinstance(op[2], list)
                name, vfs = str(op[1]), tuple(dict.fromkeys(map(str, op[2])))
                generation += 1
                uid = f"uid-{name}-{generation}"
                live[name] = (uid, vfs)
                seen_uids.append(uid)
            elif op[0] == "container" and op[1] in live:
                uid, vfs = live[str(op[1])]
                by_pf: dict[str, list[str]] = {}
                for vf in vfs:
                    by_pf.setdefault(_pf(vf), []).append(vf)
                alloc = _annotation(*((pf, tuple(v)) for pf, v in by_pf.items()))
                planted = {}
                if op[3] and len(seen_uids) > 1:  # a hostile request names another pod
                    other = next(u for u in seen_uids if u != uid)
                    planted = {ANNOTATION_KEY: f"{KIND}={other}_main",
                               "cdi.k8s.io/x": f"{KIND}={other}_side"}
                out = registry.run_container(
                    Stage.PRE_CREATE_CONTAINER,
                    _ctx(alloc if vfs else None, uid, str(op[2]), planted))
                valid = all(v in UVERBS for v in vfs)
                specs = _resolve(cdi_dir)
                for qualified in _named(out.container_annotations):
                    if qualified == REFUSED_DEVICE:
                        continue
                    assert valid and qualified == f"{KIND}={uid}_{op[2]}"
                    assert sorted(specs[qualified]) == sorted([CM_NODE, *map(_node, vfs)])
                assert (ANNOTATION_KEY in out.container_annotations
                        and out.container_annotations[ANNOTATION_KEY] != REFUSED_DEVICE) == (
                    bool(vfs) and valid)
            elif op[0] == "stop" and op[1] in live:
                registry.run_sandbox(Stage.POST_STOP_POD_SANDBOX, PodSandboxContext(
                    pod_meta=PodMeta(str(op[1]), live[str(op[1])][0], "ns")))
                assert not any(f"={live[str(op[1])][0]}_" in n for n in _resolve(cdi_dir))
            elif op[0] == "delete":
                live.pop(str(op[1]), None)
            elif op[0] == "list":
                specs_dir.retain(frozenset(u for u, _ in live.values()), now[0])
                gone = set(seen_uids) - {u for u, _ in live.values()}
                assert not any(n.split("=", 1)[1].rsplit("_", 1)[0] in gone
                               for n in _resolve(cdi_dir))
