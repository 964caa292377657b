"""Mutation testing of the four modules the scheduler's and koordlet's guarantees rest on.

Drives mutmut 3 (``pip install -e '.[mutation]'``), one module at a time, each against only
the tests that cover it: ``COVERING_TESTS`` names the test paths a module's mutants may be
killed by, and mutmut's own per-test coverage (its stats run) narrows that further to the
tests that call the mutated function. A mutant is one small change in one function
(``a < b`` -> ``a <= b``, ``x + 1`` -> ``x + 2``, a dropped argument, ...); it is *killed*
when a covering test fails with it applied and *survives* when every covering test passes.

Each module has its own scratch tree, ``.mutation/<module>/`` (git-ignored): a generated
``pyproject.toml`` (this project's pytest settings plus the module's ``[tool.mutmut]``
scope) and links to the packages and tests; mutmut copies them into ``mutants/`` there and
keeps its verdicts between runs, so a second run only retests what changed.

Equivalent mutants (no test can tell them from the original) are named in the covering
test files, one per line, as ``# mutmut-equivalent: <mutant name>``, the reason why on the
comment lines that follow. The score is
killed / (all - equivalent); "no tests" (a function no covering test calls) counts against
it like a survivor.

    python hack/mutation.py                        every module, one worker
    python hack/mutation.py scheduler/devices/ledger.py
    python hack/mutation.py --rerun-survivors MODULE   only the surviving mutants again
                                                   (after adding tests: a test change alone
                                                   does not make mutmut retest a verdict)
    python hack/mutation.py --list MODULE          the survivors, one line each
    python hack/mutation.py --diffs MODULE         the survivors, each with its diff
    python hack/mutation.py --show NAME MODULE     one mutant's diff
    python hack/mutation.py --report MODULE        the counts of the last run, running nothing
    python hack/mutation.py --only 'GLOB' MODULE   only the mutants whose name matches (e.g.
                                                   '*x_card_fits__*'; repeatable), counted alone

Exit status: 0 when every module run reached its threshold (``--min-score``, default 0:
report only), 1 otherwise, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
import time
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ROOT / ".mutation"
PACKAGES = ("apis", "scheduler", "koordlet", "runtimehooks")

# module -> the test paths that cover it (the unit tests of its own layer and its direct users).
# The ledger is built by nearly every devices test, so mutmut's per-function narrowing leaves
# all of them: its list leaves out the allocator's equivalence suites (allocator, fast path,
# rowfit: two thirds of the 60 s a surviving mutant costs), which read the ledger but hold the
# allocator to account.
_DEVICES = "tests/unit/devices"
COVERING_TESTS: dict[str, tuple[str, ...]] = {
    "scheduler/devices/ledger.py": tuple(
        f"{_DEVICES}/{name}.py"
        for name in (
            "test_ledger", "test_overlay", "test_sources", "test_rdma", "test_rowcache",
            "test_scoring", "test_card_boundaries", "test_koordinator_scenarios",
            "test_partitions", "test_interconnect", "test_topology", "test_request",
            "test_package",
        )
    ),
    "apis/allocation.py": ("tests/unit/apis",),
    "scheduler/devices/allocator.py": ("tests/unit/devices",),
    "koordlet/admission.py": (
        "tests/unit/koordlet/test_koordlet_admission.py",
        "tests/unit/koordlet/test_koordlet_hookserver.py",
    ),
}

EQUIVALENT = re.compile(r"#\s*mutmut-equivalent:\s*(\S+)")

# mutmut's exit codes (mutmut/stats.py) folded into the four verdicts this report counts
KILLED_CODES = {1, 3, 36, -24, 24, 152, 255, -11, -9, 37}
SURVIVED_CODES = {0}
NO_TESTS_CODES = {5, 33}


@dataclass(frozen=True)
class Score:
    module: str
    killed: int
    survived: int
    no_tests: int
    equivalent: int
    not_run: int
    survivors: tuple[str, ...]

    @property
    def scored(self) -> int:
        return self.killed + self.survived + self.no_tests

    @property
    def percent(self) -> float:
        return 100.0 * self.killed / self.scored if self.scored else 100.0

    def line(self) -> str:
        return (
            f"{self.module}: killed {self.killed}, survived {self.survived}, "
            f"no tests {self.no_tests}, equivalent {self.equivalent}, not run {self.not_run}"
            f" -> {self.percent:.1f} % of {self.scored} non-equivalent mutants"
        )


def slug(module: str) -> str:
    return module.removesuffix(".py").replace("/", ".")


def workdir(module: str) -> Path:
    return SCRATCH / slug(module)


def prepare(module: str, isolation: str = "fork") -> Path:
    """The module's scratch tree: links to the code and tests, and its own pyproject.toml."""
    work = workdir(module)
    work.mkdir(parents=True, exist_ok=True)
    for name in (*PACKAGES, "tests"):
        link = work / name
        if not link.is_symlink():
            link.symlink_to(ROOT / name, target_is_directory=True)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pytest_opts = project["tool"]["pytest"]["ini_options"]
    lines = ["# generated by hack/mutation.py; edit COVERING_TESTS there", ""]
    lines += ["[tool.pytest.ini_options]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in pytest_opts.items()]
    lines += [
        "",
        "[tool.mutmut]",
        f"source_paths = {json.dumps(list(PACKAGES))}",
        f"only_mutate = {json.dumps([module])}",
        f"pytest_add_cli_args_test_selection = {json.dumps(list(COVERING_TESTS[module]))}",
        # the scratch tree is no git work tree: mutmut's git change detection has nothing to read
        "use_git_change_detection = false",
        # fork: workers fork from the process that ran the stats; forkserver: for test set-ups
        # that are not fork-safe (grpc servers, threads)
        f"process_isolation = {json.dumps(isolation)}",
        "",
    ]
    (work / "pyproject.toml").write_text("\n".join(lines))
    return work


def mutmut(work: Path, *args: str) -> int:
    exe = Path(sys.executable).with_name("mutmut")
    if not exe.exists():
        sys.exit("mutmut is not installed: pip install -e '.[mutation]' (make mutation does it)")
    return subprocess.call([str(exe), *args], cwd=work)


def equivalents(module: str) -> dict[str, Path]:
    """Mutant name -> the test file naming it equivalent (for this module's mutants only)."""
    prefix = slug(module) + "."
    named: dict[str, Path] = {}
    for path in COVERING_TESTS[module]:
        target = ROOT / path
        files = sorted(target.rglob("*.py")) if target.is_dir() else [target]
        for file in files:
            for match in EQUIVALENT.finditer(file.read_text()):
                if match.group(1).startswith(prefix):
                    named[match.group(1)] = file
    return named


def score(module: str, only: list[str] | None = None) -> Score:
    meta = workdir(module) / "mutants" / (module + ".meta")
    if not meta.exists():
        raise SystemExit(f"{module}: no mutation run yet (no {meta.relative_to(ROOT)})")
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    if only:
        codes = {k: v for k, v in codes.items() if any(fnmatch.fnmatch(k, g) for g in only)}
    named = equivalents(module)
    if only:
        named = {k: v for k, v in named.items() if any(fnmatch.fnmatch(k, g) for g in only)}
    verdicts: Counter[str] = Counter()
    survivors = []
    for name, code in sorted(codes.items()):
        if name in named and code not in KILLED_CODES:
            verdicts["equivalent"] += 1
        elif code in KILLED_CODES:
            verdicts["killed"] += 1
        elif code in SURVIVED_CODES:
            verdicts["survived"] += 1
            survivors.append(name)
        elif code in NO_TESTS_CODES:
            verdicts["no_tests"] += 1
            survivors.append(name)
        else:
            verdicts["not_run"] += 1
    stale = sorted(set(named) - set(codes))
    for name in stale:
        print(f"warning: {named[name].relative_to(ROOT)} names {name}, no such mutant any more")
    killed_named = sorted(n for n in named if codes.get(n) in KILLED_CODES)
    for name in killed_named:
        print(f"warning: {named[name].relative_to(ROOT)} calls {name} equivalent; a test kills it")
    return Score(
        module=module,
        killed=verdicts["killed"],
        survived=verdicts["survived"],
        no_tests=verdicts["no_tests"],
        equivalent=verdicts["equivalent"],
        not_run=verdicts["not_run"],
        survivors=tuple(survivors),
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", default=list(COVERING_TESTS))
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("MUTATION_JOBS", "1")))
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--rerun-survivors", action="store_true")
    mode.add_argument("--list", action="store_true")
    mode.add_argument("--diffs", action="store_true")
    mode.add_argument("--report", action="store_true")
    mode.add_argument("--show", metavar="MUTANT")
    parser.add_argument("--min-score", type=float, default=0.0)
    parser.add_argument("--only", action="append", metavar="GLOB", default=[])
    parser.add_argument(
        "--isolation",
        choices=("fork", "forkserver"),
        default=os.environ.get("MUTATION_ISOLATION", "fork"),
    )
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in COVERING_TESTS]
    if unknown:
        print(
            f"error: no covering tests known for {', '.join(unknown)}; "
            f"known: {', '.join(COVERING_TESTS)}",
            file=sys.stderr,
        )
        return 2

    results = []
    for module in args.modules:
        work = prepare(module, args.isolation)
        if args.show:
            mutmut(work, "show", args.show)
            continue
        if args.list or args.diffs:
            for name in score(module, args.only).survivors:
                if args.diffs:
                    sys.stdout.flush()
                    mutmut(work, "show", name)
                else:
                    print(name)
            continue
        started = time.monotonic()
        if not args.report:
            names: list[str] = []
            if args.rerun_survivors:
                names = list(score(module, args.only).survivors)
                if not names:
                    print(f"{module}: no survivors to rerun")
            elif args.only:
                names = args.only
            if names or not args.rerun_survivors:
                print(f"== {module}: mutmut against {' '.join(COVERING_TESTS[module])}", flush=True)
                mutmut(work, "run", "--max-children", str(args.jobs), *names)
        result = score(module, args.only)
        results.append(result)
        if not args.report:
            print(f"   ({time.monotonic() - started:.0f} s)")
    if not results:
        return 0
    print()
    for result in results:
        print(result.line())
    return 0 if all(r.percent >= args.min_score for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
