"""Regenerate the Python modules of ``api.proto`` (``python -m runtimehooks.api.generate``).

Role: the one way the committed ``api_pb2.py``, ``api_pb2.pyi``, ``api_pb2_grpc.py`` and
``api_pb2_grpc.pyi`` are produced (``make proto``), and the check that they are current
(``--check``; the unit tests do the same).

Invariants:

- The output is a pure function of ``api.proto`` and the installed grpcio-tools: protoc runs in
  a subprocess (``python -m grpc_tools.protoc``; nothing is imported or registered in this
  process) with the repository root as the include path, so the file is compiled as
  ``runtimehooks/api/api.proto`` and protoc itself writes the grpc module's import as
  ``from runtimehooks.api import api_pb2`` — the modules work as ``runtimehooks.api.api_pb2``
  and a second ``api.proto`` elsewhere in the process cannot collide in the descriptor pool.
- ``api_pb2.py`` and ``api_pb2_grpc.py`` are protoc's output byte for byte. ``api_pb2.pyi``
  (protoc's ``--pyi_out``) gets a three-line header that silences mypy, ruff and the formatter
  inside it (the stub is generated code; mypy still uses its types).  ``api_pb2_grpc.pyi`` is
  written here from the compiled descriptor (protoc has no stub for the grpc module), so
  ``server.py`` type-checks against the generated servicer.
- Files are written only after every step succeeded; a failure leaves the old ones in place.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from google.protobuf import descriptor_pb2

__all__ = [
    "API_DIR",
    "GENERATED_FILES",
    "PROTO",
    "REPO_ROOT",
    "compile_descriptor",
    "generate",
    "main",
    "render",
    "stale_files",
]

API_DIR: Final = Path(__file__).resolve().parent
REPO_ROOT: Final = API_DIR.parents[1]
PROTO: Final = API_DIR / "api.proto"
GENERATED_FILES: Final = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py", "api_pb2_grpc.pyi")

_PYI_HEADER: Final = "# mypy: ignore-errors\n# ruff: noqa\n# fmt: off\n"


def _protoc(proto: Path, include: Path, out: Path) -> None:
    rel = proto.relative_to(include)
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        f"--descriptor_set_out={out / 'api.desc'}",
        str(rel),
    ]
    done = subprocess.run(cmd, cwd=include, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"protoc failed ({done.returncode}): {done.stderr.strip()}")


def _grpc_stub(fd: descriptor_pb2.FileDescriptorProto, pb2_module: str) -> str:
    """The typed interface of the grpc module protoc wrote, from the compiled descriptor."""
    package = fd.package

    def local(type_name: str) -> str:
        prefix = f".{package}."
        if not type_name.startswith(prefix):
            raise ValueError(f"type {type_name} is not in package {package}")
        return "api_pb2." + type_name[len(prefix) :]

    streaming = any(m.server_streaming for s in fd.service for m in s.method)
    lines = [
        '"""Typed interface of ``api_pb2_grpc`` (written by runtimehooks.api.generate)."""',
        "",
        "# Generated from api.proto. DO NOT EDIT.",
        "",
        *(["from collections.abc import Iterator", ""] if streaming else []),
        "import grpc",
        "",
        f"from {pb2_module.rpartition('.')[0]} import api_pb2",
    ]
    for service in fd.service:
        name = service.name
        lines += ["", f"class {name}Stub:"]
        lines.append("    def __init__(self, channel: grpc.Channel) -> None: ...")
        for m in service.method:
            kind = "UnaryStream" if m.server_streaming else "UnaryUnary"
            lines.append(f"    {m.name}: grpc.{kind}MultiCallable")
        lines += ["", f"class {name}Servicer:"]
        for m in service.method:
            if m.client_streaming:
                raise ValueError(f"client-streaming method {name}.{m.name} is not supported")
            answer = local(m.output_type)
            if m.server_streaming:
                answer = f"Iterator[{answer}]"
            lines.append(
                f"    def {m.name}(\n"
                f"        self, request: {local(m.input_type)}, context: grpc.ServicerContext\n"
                f"    ) -> {answer}: ..."
            )
        lines += [
            "",
            f"def add_{name}Servicer_to_server(",
            f"    servicer: {name}Servicer, server: grpc.Server",
            ") -> None: ...",
        ]
    return "\n".join(lines) + "\n"


def _compile(
    proto: Path, root: Path
) -> tuple[dict[str, bytes], descriptor_pb2.FileDescriptorProto]:
    with tempfile.TemporaryDirectory(prefix="koord-proto-") as tmp:
        out = Path(tmp)
        _protoc(proto, root, out)
        gen = out / proto.parent.relative_to(root)
        files = {name: (gen / name).read_bytes() for name in GENERATED_FILES[:3]}
        fds = descriptor_pb2.FileDescriptorSet.FromString((out / "api.desc").read_bytes())
    return files, fds.file[0]


def compile_descriptor(
    proto: Path = PROTO, root: Path = REPO_ROOT
) -> descriptor_pb2.FileDescriptorProto:
    """The descriptor protoc compiles from ``proto`` (no source info)."""
    return _compile(proto, root)[1]


def render(proto: Path = PROTO, root: Path = REPO_ROOT) -> dict[str, bytes]:
    """Compile ``proto`` and return every generated file's name and content."""
    files, fd = _compile(proto, root)
    files["api_pb2.pyi"] = _PYI_HEADER.encode() + files["api_pb2.pyi"]
    pb2_module = ".".join((*proto.parent.relative_to(root).parts, "api_pb2"))
    files["api_pb2_grpc.pyi"] = _grpc_stub(fd, pb2_module).encode()
    return files


def generate(out_dir: Path = API_DIR, proto: Path = PROTO, root: Path = REPO_ROOT) -> list[Path]:
    """Write the generated modules into ``out_dir``; returns the paths written."""
    files = render(proto, root)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in files.items():
        path = out_dir / name
        path.write_bytes(content)
        written.append(path)
    return written


def stale_files(out_dir: Path = API_DIR) -> list[str]:
    """Names of generated files in ``out_dir`` that differ from a fresh generation."""
    stale = []
    for name, content in render().items():
        path = out_dir / name
        if not path.is_file() or path.read_bytes() != content:
            stale.append(name)
    return stale


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runtimehooks.api.generate",
        description="Regenerate the Python modules of api.proto.",
    )
    parser.add_argument("--out", type=Path, default=API_DIR, help="output directory")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the files in --out are stale"
    )
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.out)
        if stale:
            print(f"stale generated files: {', '.join(stale)}; run `make proto`", file=sys.stderr)
            return 1
        return 0
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
