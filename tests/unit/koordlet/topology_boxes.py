"""The four reference boxes of docs/device-topology.md as expected matrices, written by hand in
``nvidia-smi topo -m`` style, and a renderer of a discovered ``GPUTopology`` into that style.

Link matrix: ``NV<n>`` = n direct NVLink links, ``SW<n>`` = n links through NVSwitch, ``-`` = no
NVLink. PCIe matrix (the pair's common ancestor): ``PIX`` Single, ``PXB`` Multiple, ``PHB``
HostBridge, ``NODE`` Node, ``SYS`` System, ``INT`` Internal, ``?`` unknown.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from apis.topology import GPUTopology
from tests.unit.koordlet.fake_nvml import (
    Card,
    a100_nvlink_pairs_cards,
    h100_nvswitch_cards,
    t4_pcie_cards,
    v100_cube_mesh_cards,
)

_PCIE = {
    "Internal": "INT",
    "Single": "PIX",
    "Multiple": "PXB",
    "HostBridge": "PHB",
    "Node": "NODE",
    "System": "SYS",
}


def render(topology: GPUTopology, count: int) -> tuple[str, str, dict[str, str]]:
    """(link matrix, PCIe matrix, bandwidth per NVLink pair "a-b") of minors 0..count-1."""
    nv_rows, pcie_rows = [], []
    bandwidth: dict[str, str] = {}
    for a in range(count):
        nv_row, pcie_row = [], []
        for b in range(count):
            link = topology.link(a, b) if a != b else None
            if a == b:
                nv_row.append("X")
                pcie_row.append("X")
            elif link is None:
                nv_row.append("?")
                pcie_row.append("?")
            else:
                kind = "SW" if link.nvswitch else "NV"
                nv_row.append(f"{kind}{link.nvlinks}" if link.is_nvlink else "-")
                pcie_row.append(_PCIE.get(link.common_ancestor, "?"))
                if a < b and link.bandwidth is not None:
                    bandwidth[f"{a}-{b}"] = link.bandwidth.canonical()
        nv_rows.append(" ".join(nv_row))
        pcie_rows.append(" ".join(pcie_row))
    return "\n".join(nv_rows), "\n".join(pcie_rows), bandwidth


def _matrix(text: str) -> str:
    return "\n".join(" ".join(line.split()) for line in text.strip().splitlines())


@dataclass(frozen=True)
class Box:
    cards: Callable[[], list[Card]]
    example: str  # config/examples/<example>
    links: str
    pcie: str
    bandwidth: dict[str, str]

    @property
    def count(self) -> int:
        return len(self.links.splitlines())


_TWO_SOCKETS_PAIRS = _matrix(
    """
    X    PIX  NODE NODE SYS  SYS  SYS  SYS
    PIX  X    NODE NODE SYS  SYS  SYS  SYS
    NODE NODE X    PIX  SYS  SYS  SYS  SYS
    NODE NODE PIX  X    SYS  SYS  SYS  SYS
    SYS  SYS  SYS  SYS  X    PIX  NODE NODE
    SYS  SYS  SYS  SYS  PIX  X    NODE NODE
    SYS  SYS  SYS  SYS  NODE NODE X    PIX
    SYS  SYS  SYS  SYS  NODE NODE PIX  X
    """
)

_PAIRS = ((0, 1), (2, 3), (4, 5), (6, 7))

BOXES: dict[str, Box] = {
    "h100-nvswitch": Box(
        cards=h100_nvswitch_cards,
        example="fake-gpus-h100-nvswitch.yaml",
        links=_matrix(
            "\n".join(" ".join("X" if a == b else "SW18" for b in range(8)) for a in range(8))
        ),
        pcie=_TWO_SOCKETS_PAIRS,
        bandwidth={f"{a}-{b}": "450G" for a in range(8) for b in range(a + 1, 8)},
    ),
    "a100-nvlink-pairs": Box(
        cards=a100_nvlink_pairs_cards,
        example="fake-gpus-a100-nvlink-pairs.yaml",
        links=_matrix(
            """
            X    NV12 -    -    -    -    -    -
            NV12 X    -    -    -    -    -    -
            -    -    X    NV12 -    -    -    -
            -    -    NV12 X    -    -    -    -
            -    -    -    -    X    NV12 -    -
            -    -    -    -    NV12 X    -    -
            -    -    -    -    -    -    X    NV12
            -    -    -    -    -    -    NV12 X
            """
        ),
        pcie=_TWO_SOCKETS_PAIRS,
        bandwidth={f"{a}-{b}": "300G" for a, b in _PAIRS},
    ),
    "v100-cube-mesh": Box(
        cards=v100_cube_mesh_cards,
        example="fake-gpus-v100-cube-mesh.yaml",
        links=_matrix(
            """
            X   NV1 NV1 NV2
            NV1 X   NV2 NV1
            NV1 NV2 X   NV2
            NV2 NV1 NV2 X
            """
        ),
        pcie=_matrix(
            """
            X   PIX PXB PXB
            PIX X   PXB PXB
            PXB PXB X   PIX
            PXB PXB PIX X
            """
        ),
        bandwidth={
            "0-1": "25G",
            "0-2": "25G",
            "0-3": "50G",
            "1-2": "50G",
            "1-3": "25G",
            "2-3": "50G",
        },
    ),
    "t4-pcie": Box(
        cards=t4_pcie_cards,
        example="fake-gpus-t4-pcie.yaml",
        links=_matrix(
            """
            X - - -
            - X - -
            - - X -
            - - - X
            """
        ),
        pcie=_matrix(
            """
            X   PIX SYS SYS
            PIX X   SYS SYS
            SYS SYS X   PHB
            SYS SYS PHB X
            """
        ),
        bandwidth={},
    ),
}
