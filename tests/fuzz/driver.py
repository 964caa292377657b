"""The coverage-guided fuzz driver (atheris / libFuzzer) over ``tests.fuzz.targets``.

Role: ``make fuzz`` runs ``python -m tests.fuzz.driver``: each target (or ``--target NAME``)
is fuzzed for ``--seconds`` in its own subprocess, started from its seeds plus the corpus it
grew before (``.fuzz/corpus/<target>``), under libFuzzer's per-input time limit
(``-timeout``) and memory limit (``-rss_limit_mb``) and an address-space limit
(``RLIMIT_AS``) set before the child starts. A crash (an undeclared exception, a state change
on refusal, a timeout, a memory blow-up) is written under ``.fuzz/crashes/<target>/``; the
driver prints one line per crash and exits 1 when there was any.

``--multiplex`` fuzzes every chosen target in one process for ``--seconds`` in all: the first
byte of an input picks the target, the rest is its input (the short pass of ``make test``
uses it, so startup is paid once). ``--child NAME`` is the subprocess's own entry point;
``--replay FILE --target NAME`` runs one saved input (a crash file) in this process.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / ".fuzz"
MULTIPLEX = "all"

__all__ = ["main"]


def _one_input(name: str):  # type: ignore[no-untyped-def]
    from tests.fuzz.targets import by_name

    target = by_name(name)

    declared = target.errors

    def test_one_input(data: bytes) -> None:
        with contextlib.suppress(*declared):
            target.run(data)

    return test_one_input


def _multiplexed(names: list[str]):  # type: ignore[no-untyped-def]
    runs = [_one_input(n) for n in names]

    def test_one_input(data: bytes) -> None:
        if data:
            runs[data[0] % len(runs)](data[1:])

    return test_one_input


def _child(name: str, names: list[str], libfuzzer_args: list[str]) -> None:
    import atheris
    import structlog

    # the decoders' log lines are not findings (atheris reports a crash on stdout)
    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())

    with atheris.instrument_imports(include=["apis", "scheduler", "koordlet", "runtimehooks"]):
        import tests.fuzz.targets as targets

        targets.TARGETS()  # imports every decoder under instrumentation
        for n in names:
            targets.by_name(n).seeds()
    fn = _multiplexed(names) if name == MULTIPLEX else _one_input(name)
    atheris.Setup([sys.argv[0], *libfuzzer_args], fn)
    atheris.Fuzz()


_TOKENS = re.compile(rb'"[^"\\\n]{1,40}"')
_GENERIC = [b"{", b"}", b"[", b"]", b":", b",", b"null", b"true", b"false", b"-1", b"1e999",
            b"NaN", b'"\\u0000"', b'"\\ud800"', b"&a", b"*a", b"<<:", b"- ", b"!!binary"]


def _dictionary(name: str, names: list[str]) -> Path:
    """A libFuzzer dictionary: the quoted strings of the seeds (field names, enum values) and
    the tokens of the formats, so mutations stay near the decoders' grammar."""
    from tests.fuzz.targets import by_name

    tokens = set(_GENERIC)
    for n in names:
        for seed in by_name(n).seeds():
            tokens.update(_TOKENS.findall(seed))
            tokens.update(w + b":" for w in re.findall(rb"^\s*-?\s*(\w+):", seed, re.M))
    path = WORK / "dict" / f"{name}.dict"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ['"' + "".join(f"\\x{b:02x}" for b in t) + '"' for t in sorted(tokens)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _seed_corpus(name: str, names: list[str]) -> Path:
    from tests.fuzz.targets import by_name

    corpus = WORK / "corpus" / name
    corpus.mkdir(parents=True, exist_ok=True)
    if name == MULTIPLEX:
        for i, n in enumerate(names):
            for j, seed in enumerate(by_name(n).seeds()):
                (corpus / f"seed-{n}-{j}").write_bytes(bytes([i]) + seed)
    else:
        for j, seed in enumerate(by_name(name).seeds()):
            (corpus / f"seed-{j}").write_bytes(seed)
    return corpus


_EXC = re.compile(r"^(\w+(?:\.\w+)*(?:Error|Exception|Changed|Exit|Interrupt)\b.*)$", re.M)


def _crash_line(name: str, path: Path, log: str) -> str:
    """``<target>: <crash file>: <what>``, from the child's last exception line."""
    what = "crash"
    if "libFuzzer: timeout" in log:
        what = "timeout (per-input limit)"
    elif "out-of-memory" in log or "MemoryError" in log:
        what = "out of memory"
    else:
        found = _EXC.findall(log)
        if found:
            what = found[-1][:200]
    return f"{name}: {path.relative_to(ROOT)}: {what}"


def _run(
    name: str, names: list[str], seconds: int, timeout: int, rss_mb: int, extra: list[str]
) -> tuple[list[str], str]:
    corpus = _seed_corpus(name, names)
    crashes = WORK / "crashes" / name
    crashes.mkdir(parents=True, exist_ok=True)
    before = set(crashes.iterdir())
    args = [
        f"-max_total_time={seconds}",
        f"-timeout={timeout}",
        f"-rss_limit_mb={rss_mb}",
        f"-malloc_limit_mb={rss_mb}",
        f"-artifact_prefix={crashes}/",
        f"-dict={_dictionary(name, names)}",
        "-max_len=1048576",
        "-print_final_stats=1",
        *extra,
        str(corpus),
    ]

    def limit() -> None:  # address space: the interpreter, the libraries, and rss_mb more
        cap = (rss_mb + 4096) << 20
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    cmd = [sys.executable, "-m", "tests.fuzz.driver", "--child", name,
           "--targets", ",".join(names), "--", *args]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=ROOT, preexec_fn=limit, capture_output=True, text=True,
        errors="replace", timeout=seconds + 120, check=False,
    )  # fmt: skip
    log = proc.stdout + proc.stderr
    new = sorted(set(crashes.iterdir()) - before)
    lines = [_crash_line(name, p, log) for p in new]
    if proc.returncode != 0 and not new:
        lines.append(f"{name}: exited {proc.returncode} without a crash file: {log[-300:]!r}")
    return lines, log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.driver", description=__doc__)
    parser.add_argument("--target", default="", help="one target (default: every target)")
    parser.add_argument("--seconds", type=int, default=60, help="per target (multiplex: all)")
    parser.add_argument("--timeout", type=int, default=10, help="seconds one input may take")
    parser.add_argument("--rss-mb", type=int, default=2048, help="memory one process may use")
    parser.add_argument("--multiplex", action="store_true")
    parser.add_argument("--child", default="")
    parser.add_argument("--targets", default="")
    parser.add_argument("--replay", default="")
    parser.add_argument("--verbose", action="store_true", help="print each child's log")
    parser.add_argument("libfuzzer", nargs="*", help="more libFuzzer flags, after --")
    args = parser.parse_args(argv)

    if args.child:
        _child(args.child, args.targets.split(","), args.libfuzzer)
        return 0
    from tests.fuzz.targets import TARGETS, by_name

    if args.replay:
        target = by_name(args.target)
        target.run(Path(args.replay).read_bytes())
        print(f"{args.target}: {args.replay}: no crash")
        return 0
    names = [by_name(args.target).name] if args.target else list(TARGETS())
    crashes: list[str] = []
    runs = [(MULTIPLEX, names)] if args.multiplex else [(n, [n]) for n in names]
    for name, chosen in runs:
        start = time.monotonic()
        lines, log = _run(name, chosen, args.seconds, args.timeout, args.rss_mb, args.libfuzzer)
        stats = dict(re.findall(r"stat::(\w+):\s+(\d+)", log))
        print(
            f"fuzz {name}: {stats.get('number_of_executed_units', '?')} inputs in "
            f"{time.monotonic() - start:.0f} s, {len(lines)} crash(es)",
            file=sys.stderr,
        )
        if args.verbose:
            print(log[-4000:], file=sys.stderr)
        crashes.extend(lines)
    for line in crashes:
        print(line)
    return 1 if crashes else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
