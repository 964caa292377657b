"""A small in-process sampling profiler for ``koord-scheduler run`` under B2 (all threads).

Usage (as B2's ``--koord-wrap``, which puts it before ``python -m scheduler.cli run ...``)::

    python bench/b2_e2e.py --schedulers koord --rounds 1 \\
        --koord-wrap "python bench/pysample.py --out /tmp/prof.txt --"

With ``--cprofile`` (recommended), every thread runs under cProfile timed by its own CPU
clock, and the merged profile (cumulative, then self time) is written to ``--out`` (and
``OUT.pstats``); cProfile's overhead inflates the times several-fold, so read shares.

Otherwise, every ``--interval`` seconds a daemon thread reads ``sys._current_frames()`` and
counts, per function, the samples in which it is on a stack (inclusive) and on top (self);
threads whose top frame is a known wait are counted apart as idle. This is imperfect: a
thread blocked inside C code (a queue get, a socket read) shows its Python caller as busy.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import contextlib
import cProfile
import os
import pstats
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


class ThreadProfiles:
    """cProfile in every thread, timed by that thread's own CPU clock (``time.thread_time``),
    so a thread waiting for the GIL, a socket or a queue costs nothing: the merged profile is
    where the process's CPU went."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self.lock = threading.Lock()

    def install(self, *_: object) -> None:
        prof = cProfile.Profile(time.thread_time)
        with self.lock:
            self.profiles.append(prof)
        prof.enable()

    def report(self, out: Path) -> None:
        with self.lock:
            profs = list(self.profiles)
        stats = pstats.Stats(profs[0])
        for prof in profs[1:]:
            with contextlib.suppress(TypeError):  # a profiler that never ran
                stats.add(prof)
        stats.dump_stats(str(out) + ".pstats")
        with out.open("w") as f:
            stats.stream = f  # type: ignore[attr-defined]
            stats.sort_stats("cumulative").print_stats(70)
            stats.sort_stats("tottime").print_stats(40)


class ThreadCpu:
    """Every thread's CPU seconds from ``/proc/self/task/<tid>/stat`` (utime + stime), read
    every ``interval`` s and once at exit, summed per thread name with its trailing digits
    dropped (``bind_3`` -> ``bind_``): where the process's CPU went, by role, with no
    profiler's overhead. A thread that exited counts with its last reading."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.last: dict[int, tuple[str, float]] = {}
        self.stop = threading.Event()
        self.tick = os.sysconf("SC_CLK_TCK")

    def read(self) -> None:
        names = {t.native_id: t.name for t in threading.enumerate()}
        for tid_text in os.listdir("/proc/self/task"):
            tid = int(tid_text)
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            cpu = (int(fields[11]) + int(fields[12])) / self.tick
            name = names.get(tid) or self.last.get(tid, ("<unnamed>", 0.0))[0]
            self.last[tid] = (name, cpu)

    def start(self) -> None:
        def loop() -> None:
            while not self.stop.wait(self.interval):
                self.read()

        threading.Thread(target=loop, name="pysample-threads", daemon=True).start()

    def report(self, out: Path) -> None:
        self.read()
        by_role: collections.Counter[str] = collections.Counter()
        for name, cpu in self.last.values():
            by_role[name.rstrip("0123456789")] += cpu
        total = sum(by_role.values())
        lines = [f"# CPU seconds by thread role, total {total:.2f}"]
        for role, cpu in by_role.most_common():
            lines.append(f"{cpu:8.2f} {100 * cpu / max(total, 1e-9):5.1f}%  {role}")
        out.write_text("\n".join(lines) + "\n")


def main() -> None:
    argv = sys.argv[1:]
    split = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--interval", type=float, default=0.005)
    parser.add_argument(
        "--cprofile",
        action="store_true",
        help="cProfile every thread on its CPU clock instead of sampling stacks",
    )
    parser.add_argument(
        "--main-only",
        action="store_true",
        help="with --cprofile: the main thread only (the scheduling cycle and the event drain)",
    )
    parser.add_argument(
        "--threads",
        action="store_true",
        help="CPU seconds per thread role (/proc) instead of sampling stacks",
    )
    args = parser.parse_args(argv[:split])
    rest = argv[split + 1 :]
    if rest and ("python" in rest[0].rsplit("/", 1)[-1]):
        rest = rest[1:]
    if rest[0] != "-m":
        raise SystemExit("pysample: expected [python] -m MODULE ARGS...")
    module, sys.argv = rest[1], [rest[1], *rest[2:]]
    sampler = Sampler(args.interval)
    started = time.perf_counter()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.threads:
        cpu = ThreadCpu(0.25)
        atexit.register(lambda: cpu.report(Path(args.out)))
        cpu.start()
    elif args.cprofile:
        profiles = ThreadProfiles()
        atexit.register(lambda: profiles.report(Path(args.out)))
        if not args.main_only:
            threading.setprofile(profiles.install)
        profiles.install()
    else:
        atexit.register(lambda: sampler.report(Path(args.out)))
        sampler.start()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        sampler.stop.set()
        print(f"pysample: {time.perf_counter() - started:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
