"""Record gpushare's own ``kubectl inspect gpushare`` on the golden cluster states.

Usage (gen.sh builds the binary and runs this)::

    PYTHONPATH=. python hack/gpushare-inspect-golden/record.py /path/to/kubectl-inspect-gpushare

Starts a throw-away etcd + kube-apiserver (tests/e2e/apiserver.py; the binaries from
hack/kube-apiserver.sh), puts each state of tests/e2e/gpushare_states.py on it, runs the original
binary with each argument list of RUNS ``REPEAT`` times, and writes every distinct output with its
exit code to tests/unit/fixtures/gpushare-inspect/golden.json. The original walks Go maps (nodes,
a node's cards), so one argument list can print several row orders: all are kept.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))  # the e2e harness imports tests.ports
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from apiserver import ApiServer  # noqa: E402
from gpushare_states import GOLDEN, clear_state, load_state  # noqa: E402
from test_scheduler_harness import Kube  # noqa: E402

REPEAT = 40
RUNS: dict[str, list[list[str]]] = {
    "basic": [[], ["-d"], ["gpu-a"], ["-d", "gpu-a"], ["cpu-c"], ["-d", "cpu-c"], ["nope"]],
    "pending": [[], ["-d"], ["solo"], ["-d", "solo"]],
    "allocation": [[], ["-d"]],
    "mib": [[], ["-d"]],
    "empty": [[], ["-d"]],
}


def _binaries() -> tuple[str, str]:
    out = subprocess.run(["bash", str(REPO / "hack" / "kube-apiserver.sh")], check=True,
                         capture_output=True, text=True, cwd=REPO).stdout  # fmt: skip
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return values["KUBE_APISERVER_BIN"], values["ETCD_BIN"]


def main(binary: str, meta: dict[str, str]) -> None:
    golden: dict[str, object] = {**meta, "repeat": REPEAT, "states": {}}
    states: dict[str, list[dict[str, object]]] = {}
    with ApiServer(*_binaries()).start() as srv:
        kube = Kube(srv.url, srv.admin_token)
        env = {**os.environ, "KUBECONFIG": srv.kubeconfig_path()}
        for state, runs in RUNS.items():
            load_state(kube, state)
            states[state] = []
            for args in runs:
                seen: dict[tuple[int, str], None] = {}
                for _ in range(REPEAT):
                    proc = subprocess.run([binary, *args], env=env, capture_output=True,
                                          text=True, timeout=60)  # fmt: skip
                    seen[(proc.returncode, proc.stdout)] = None
                rcs = {rc for rc, _ in seen}
                assert len(rcs) == 1, (state, args, rcs)
                states[state].append(
                    {"args": args, "rc": rcs.pop(), "outputs": [out for _, out in seen]}
                )
                print(f"{state} {args}: {len(seen)} distinct output(s)", file=sys.stderr)
            clear_state(kube, state)
    golden["states"] = states
    GOLDEN.write_text(json.dumps(golden, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], {"source": sys.argv[2] if len(sys.argv) > 2 else "",
                       "go": sys.argv[3] if len(sys.argv) > 3 else ""})  # fmt: skip
