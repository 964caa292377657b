"""Turn Koordinator's deviceshare allocator test tables into ``scenarios.json`` (facts only).

Reads ``device_allocator_test.go`` and ``allocator_gpu_test.go`` of koordinator-sh/koordinator
(Apache-2.0; the commit is recorded in the output) and writes, per test case of
``TestAutopilotAllocator``, ``TestAutopilotAllocatorWithExclusivePolicyAndRequiredScope`` and
``TestAllocateByTopology``: the Device CR, the request knobs of the case and the assigned and
expected ``DeviceAllocations``. Run by hand when re-syncing:

    python tests/unit/devices/koordinator/extract.py DAT_GO AGT_GO COMMIT > scenarios.json
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

FUNCS = {
    "TestAutopilotAllocator": "autopilot",
    "TestAutopilotAllocatorWithExclusivePolicyAndRequiredScope": "exclusive-scope",
    "TestAllocateByTopology": "by-topology",
}
GPU_FULL = {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100",
            "koordinator.sh/gpu-memory": "85198045184"}


def _vars(text: str) -> dict[str, Any]:
    out = {}
    for m in re.finditer(r"\n\t(fakeDeviceCR\w*) = func\(\) \*schedulingv1alpha1\.Device \{\n"
                         r"\t\tvar data = \[\]byte\(`(.*?)`\)", text):
        out[m.group(1)] = json.loads(m.group(2))
    return out


def _allocations(lines: list[str]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    current: list[dict[str, Any]] | None = None
    after_bus = False
    for line in lines:
        s = line.strip()
        m = re.match(r"schedulingv1alpha1\.(GPU|RDMA|FPGA): ", s)
        if m:
            current = out.setdefault(m.group(1).lower(), [])
            continue
        if current is None:
            continue
        m = re.match(r'BusID: "(.*)",', s)
        if m:
            current[-1].setdefault("vfs", []).append({"busID": m.group(1)})
            after_bus = True
            continue
        m = re.match(r"Minor: +(-?\d+),", s)
        if m:
            if after_bus:
                current[-1]["vfs"][-1]["minor"] = int(m.group(1))
                after_bus = False
            else:
                current.append({"minor": int(m.group(1)), "resources": {}})
            continue
        if s == "Resources: gpuResourceList,":
            current[-1]["resources"] = dict(GPU_FULL)
            continue
        m = re.match(r"apiext\.ResourceRDMA: \*resource\.NewQuantity\((\d+),", s)
        if m:
            current[-1]["resources"] = {"koordinator.sh/rdma": m.group(1)}
            continue
        if s.startswith("Resources:") and "corev1.ResourceList{" not in s:
            raise ValueError(f"unknown resources: {s}")
    return out


def _cases(text: str, func: str, variables: dict[str, Any]) -> list[dict[str, Any]]:
    start = text.index(f"func {func}(t *testing.T) {{")
    end = text.index("for _, tt := range tests", start)
    body = text[start:end].split("\n")
    starts = [i for i, ln in enumerate(body) if re.match(r"\t\t\{$", ln)]
    cases = []
    for a, b in zip(starts, [*starts[1:], len(body)], strict=True):
        lines = body[a:b]
        joined = "\n".join(lines)
        case: dict[str, Any] = {"name": re.search(r'name: +"(.*)",', joined).group(1)}
        m = re.search(r"deviceCR: +(fakeDeviceCR\w*),", joined)
        case["device"] = variables[m.group(1)] if m else json.loads(
            re.search(r"var data = \[\]byte\(`(.*?)`\)", joined).group(1))
        for key in ("gpuWanted", "rdmaWanted"):
            m = re.search(rf"{key}: +(\d+),", joined)
            case[key] = int(m.group(1)) if m else 0
        for key in ("hostNetwork", "wantErr", "secondaryDeviceWellPlanned"):
            case[key] = bool(re.search(rf"{key}: +true,", joined))
        m = re.search(r"exclusivePolicy: +apiext\.(\w+),", joined)
        case["exclusivePolicy"] = {"PCIExpressLevelDeviceExclusivePolicy": "PCIeLevel",
                                   "DeviceLevelDeviceExclusivePolicy": "DeviceLevel"}[
            m.group(1)] if m else ""
        m = re.search(r"requiredTopologyScope: +apiext\.DeviceTopologyScope(\w+),", joined)
        case["requiredTopologyScope"] = m.group(1) if m else ""
        iw = next((i for i, ln in enumerate(lines) if re.match(r"\t\t\twant: ", ln)), len(lines))
        ia = next((i for i, ln in enumerate(lines) if "assignedDevices:" in ln), None)
        case["assigned"] = _allocations(lines[ia:iw]) if ia is not None else {}
        case["want"] = _allocations(lines[iw:])
        cases.append(case)
    return cases


def main() -> None:
    dat, agt, commit = sys.argv[1], sys.argv[2], sys.argv[3]
    texts = {p: Path(p).read_text() for p in (dat, agt)}
    variables = _vars(texts[dat])
    devices: dict[str, Any] = {}
    cases = []
    for func, short in FUNCS.items():
        text = texts[dat] if f"func {func}(" in texts[dat] else texts[agt]
        for case in _cases(text, func, variables):
            # Device CRs are shared by many cases: stored once, named by their text.
            text_of = json.dumps(case["device"], sort_keys=True)
            key = next((k for k, v in devices.items() if json.dumps(v, sort_keys=True) == text_of),
                       f"device-{len(devices)}")
            devices[key] = case["device"]
            cases.append({"suite": short, **case, "device": key})
    source = f"koordinator-sh/koordinator@{commit} pkg/scheduler/plugins/deviceshare"
    lines = [f'{{"source": {json.dumps(source)},', ' "devices": {']
    lines.append(",\n".join(f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}"
                            for k, v in devices.items()))
    lines.append(' },\n "cases": [')
    lines.append(",\n".join(f"  {json.dumps(c, sort_keys=True)}" for c in cases))
    lines.append(" ]\n}")
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
