"""A small in-process sampling profiler for ``koord-scheduler run`` under B2 (all threads).

Usage (as B2's ``--koord-wrap``, which puts it before ``python -m scheduler.cli run ...``)::

    python bench/b2_e2e.py --schedulers koord --rounds 1 \\
        --koord-wrap "python bench/pysample.py --out /tmp/prof.txt --"

Every ``--interval`` seconds a daemon thread reads ``sys._current_frames()`` and counts, per
function (file:line name), the samples in which it is on a stack (inclusive) and on top of it
(self); threads whose top frame is a known wait (a lock, a condition, ``select``, a socket
read) are counted apart as idle. The report (busy samples only, inclusive share first) is
written when the process exits (SIGINT or SIGTERM). The sampler holds the GIL while it walks
the stacks, so CPU figures of a profiled run include its cost: use it for shares, not times.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import runpy
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

IDLE_TOPS = {
    "wait",
    "_wait_for_tstate_lock",
    "select",
    "poll",
    "recv_into",
    "read",
    "readinto",
    "accept",
    "sleep",
    "get",
    "acquire",
    "_recv_into",
    "readline",
}


def _where(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_filename.rsplit('/', 2)[-1]}:{code.co_firstlineno} {code.co_name}"


class Sampler(threading.Thread):
    def __init__(self, interval: float) -> None:
        super().__init__(daemon=True, name="pysample")
        self.interval = interval
        self.inclusive: collections.Counter[str] = collections.Counter()
        self.self_: collections.Counter[str] = collections.Counter()
        self.busy = 0
        self.idle = 0
        self.stop = threading.Event()

    def run(self) -> None:
        me = threading.get_ident()
        while not self.stop.wait(self.interval):
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                if frame.f_code.co_name in IDLE_TOPS and "threading" in frame.f_code.co_filename:
                    self.idle += 1
                    continue
                top = frame.f_code.co_name
                # a socket/select wait below Python (an SSL send is busy: it holds the GIL back)
                if top in {"select", "poll", "recv_into", "readinto", "accept", "sleep"}:
                    self.idle += 1
                    continue
                self.busy += 1
                self.self_[_where(frame)] += 1
                seen: set[str] = set()
                f: FrameType | None = frame
                while f is not None:
                    w = _where(f)
                    if w not in seen:
                        seen.add(w)
                        self.inclusive[w] += 1
                    f = f.f_back

    def report(self, out: Path) -> None:
        busy = max(self.busy, 1)
        lines = [f"# busy samples {self.busy}, idle {self.idle}, interval {self.interval}s"]
        lines.append("# inclusive %  self %  function")
        for w, n in self.inclusive.most_common(80):
            lines.append(f"{100 * n / busy:6.1f} {100 * self.self_.get(w, 0) / busy:6.1f}  {w}")
        lines.append("# top self")
        for w, n in self.self_.most_common(40):
            lines.append(f"{100 * n / busy:6.1f}  {w}")
        out.write_text("\n".join(lines) + "\n")


def main() -> None:
    argv = sys.argv[1:]
    split = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--interval", type=float, default=0.005)
    args = parser.parse_args(argv[:split])
    rest = argv[split + 1 :]
    if rest and ("python" in rest[0].rsplit("/", 1)[-1]):
        rest = rest[1:]
    if rest[0] != "-m":
        raise SystemExit("pysample: expected [python] -m MODULE ARGS...")
    module, sys.argv = rest[1], [rest[1], *rest[2:]]
    sampler = Sampler(args.interval)
    started = time.perf_counter()
    atexit.register(lambda: sampler.report(Path(args.out)))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sampler.start()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        sampler.stop.set()
        print(f"pysample: {time.perf_counter() - started:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
