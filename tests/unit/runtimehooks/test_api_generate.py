"""runtimehooks.api: the wire contract (SPEC section 7) and the generated modules' freshness."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from runtimehooks.api import api_pb2, api_pb2_grpc, generate

grpc_tools = pytest.importorskip("grpc_tools", reason="grpcio-tools regenerates the modules")

F = descriptor_pb2.FieldDescriptorProto
STR, U32, I64, U64, MSG = F.TYPE_STRING, F.TYPE_UINT32, F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_MESSAGE
MAP = "map"  # a map<string,string> field (a repeated *Entry message)
RES = ".runtime.v1alpha1.LinuxContainerResources"

# message -> [(number, name, type or MAP, type name of a message field)]
WIRE: dict[str, list[tuple[int, str, object, str]]] = {
    "PodSandboxMetadata": [(1, "name", STR, ""), (2, "uid", STR, ""),
                           (3, "namespace", STR, ""), (4, "attempt", U32, "")],
    "ContainerMetadata": [(1, "name", STR, ""), (2, "attempt", U32, ""), (3, "id", STR, "")],
    "HugepageLimit": [(1, "page_size", STR, ""), (2, "limit", U64, "")],
    "LinuxContainerResources": [
        (1, "cpu_period", I64, ""), (2, "cpu_quota", I64, ""), (3, "cpu_shares", I64, ""),
        (4, "memory_limit_in_bytes", I64, ""), (5, "oom_score_adj", I64, ""),
        (6, "cpuset_cpus", STR, ""), (7, "cpuset_mems", STR, ""),
        (8, "hugepage_limits", MSG, ".runtime.v1alpha1.HugepageLimit"),
        (9, "unified", MAP, ""), (10, "memory_swap_limit_in_bytes", I64, ""),
    ],
    "PodSandboxHookRequest": [
        (1, "pod_meta", MSG, ".runtime.v1alpha1.PodSandboxMetadata"),
        (2, "runtime_handler", STR, ""), (3, "labels", MAP, ""), (4, "annotations", MAP, ""),
        (5, "cgroup_parent", STR, ""), (6, "overhead", MSG, RES), (7, "resources", MSG, RES),
    ],
    "PodSandboxHookResponse": [(1, "labels", MAP, ""), (2, "annotations", MAP, ""),
                               (3, "cgroup_parent", STR, ""), (4, "resources", MSG, RES)],
    "ContainerResourceHookRequest": [
        (1, "pod_meta", MSG, ".runtime.v1alpha1.PodSandboxMetadata"),
        (2, "container_meta", MSG, ".runtime.v1alpha1.ContainerMetadata"),
        (3, "container_annotations", MAP, ""), (4, "container_resources", MSG, RES),
        (5, "pod_resources", MSG, RES), (6, "pod_annotations", MAP, ""),
        (7, "pod_labels", MAP, ""), (8, "pod_cgroup_parent", STR, ""),
        (9, "container_envs", MAP, ""),
    ],
    "ContainerResourceHookResponse": [
        (1, "container_annotations", MAP, ""), (2, "container_resources", MSG, RES),
        (3, "pod_cgroup_parent", STR, ""), (4, "container_envs", MAP, ""),
    ],
}  # fmt: skip

SANDBOX = ("PodSandboxHookRequest", "PodSandboxHookResponse")
CONTAINER = ("ContainerResourceHookRequest", "ContainerResourceHookResponse")
METHODS = {
    "PreRunPodSandboxHook": SANDBOX,
    "PostStopPodSandboxHook": SANDBOX,
    "PreCreateContainerHook": CONTAINER,
    "PreStartContainerHook": CONTAINER,
    "PostStartContainerHook": CONTAINER,
    "PostStopContainerHook": CONTAINER,
    "PreUpdateContainerResourcesHook": CONTAINER,
}


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    return descriptor_pb2.FileDescriptorProto.FromString(api_pb2.DESCRIPTOR.serialized_pb)


def test_package_and_go_package() -> None:
    fd = _file_descriptor()
    assert fd.package == "runtime.v1alpha1"
    assert fd.syntax == "proto3"
    assert fd.options.go_package == "github.com/koordinator-sh/koordinator/apis/runtime/v1alpha1"


@pytest.mark.parametrize("message", sorted(WIRE), ids=sorted(WIRE))
def test_message_fields_match_spec(message: str) -> None:
    desc = {m.name: m for m in _file_descriptor().message_type}[message]
    got = []
    for f in desc.field:
        is_map = f.label == F.LABEL_REPEATED and f.type == MSG and f.type_name.endswith("Entry")
        kind = MAP if is_map else f.type
        got.append((f.number, f.name, kind, "" if is_map or f.type != MSG else f.type_name))
    assert got == WIRE[message]


def test_service_methods_match_spec() -> None:
    (service,) = _file_descriptor().service
    assert service.name == "RuntimeHookService"
    got = {
        m.name: (m.input_type.rsplit(".", 1)[1], m.output_type.rsplit(".", 1)[1])
        for m in service.method
    }
    assert got == METHODS
    assert all(not m.client_streaming and not m.server_streaming for m in service.method)


def test_generated_modules_import_as_a_package() -> None:
    assert api_pb2_grpc.RuntimeHookServiceStub is not None
    source = Path(api_pb2_grpc.__file__).read_text()
    assert "from runtimehooks.api import api_pb2" in source
    assert not re.search(r"^import api_pb2", source, re.MULTILINE)


def _strip_json_names(fd: descriptor_pb2.FileDescriptorProto) -> None:
    def strip(msg: descriptor_pb2.DescriptorProto) -> None:
        for f in msg.field:
            f.ClearField("json_name")
        for nested in msg.nested_type:
            strip(nested)

    for m in fd.message_type:
        strip(m)


def test_committed_descriptor_matches_proto() -> None:
    """Version-independent: the committed module was compiled from today's api.proto."""
    compiled = generate.compile_descriptor()
    _strip_json_names(compiled)
    assert _file_descriptor() == compiled, "api_pb2.py is stale: run `make proto`"


def test_generated_modules_are_current(tmp_path: Path) -> None:
    committed_grpc = (generate.API_DIR / "api_pb2_grpc.py").read_text()
    match = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", committed_grpc)
    assert match is not None
    installed = importlib.metadata.version("grpcio-tools")
    if match.group(1) != installed:
        pytest.skip(f"modules generated by grpcio-tools {match.group(1)}, {installed} installed")
    written = generate.generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(generate.GENERATED_FILES)
    stale = [p.name for p in written if p.read_bytes() != (generate.API_DIR / p.name).read_bytes()]
    assert stale == [], f"stale generated modules {stale}: run `make proto`"


def test_check_entry_point_reports_stale(tmp_path: Path) -> None:
    (tmp_path / "api_pb2.py").write_text("# edited\n")
    run = [sys.executable, "-m", "runtimehooks.api.generate", "--check", "--out", str(tmp_path)]
    done = subprocess.run(run, capture_output=True, text=True, cwd=generate.REPO_ROOT)
    assert done.returncode == 1
    assert "api_pb2.py" in done.stderr
