"""The whole test suite as ``make test`` runs it: four pytest runs, one verdict.

Most of the suite waits (on the API server, the controller, a model server),
so it runs on several pytest-xdist workers, each with its own control plane
(the ``cluster`` fixture is per session, and each worker is a session). The
unit tests need no server and run apart, on workers of their own, at the same
time as the parallel run. The fault tier (kills and outages of
kube-apiserver, etcd and controllers) runs apart from both: a fault test stops
the control plane it runs on, so no other test may share that control plane,
and its deadlines want the cores not to be taken by the parallel run's four
workers. It has workers of its own (each with its own control plane: an
outage on one never reaches another), and runs at the same time as the
real-node tier (real kubelets, containerd, image builds: a control plane of
its own, nodes on 127.0.0.2 and 127.0.0.3, their own cgroups), which must
never run twice at once and so is one process.

=========  ==============================  =====================  ==================
run        tests (by marker)               workers                waits for
=========  ==============================  =====================  ==================
unit       ``unit`` (tests/unit)           ``--unit-workers``     helm, helm-docs
parallel   integration and e2e             ``--workers``          every tool
faults     ``faults`` (tests/faults)       ``--fault-workers``    every tool
node       ``node`` (tests/node)           1                      every tool, node, images
=========  ==============================  =====================  ==================

**Builds.** The suite first starts building the tools (``hack/binaries.py``:
the control plane, helm, kwok, versitygw..., then the real-node pieces and,
on a cold layer cache, its images) in the background, and each run starts
once what it waits for is there, so on a cold cache the unit tests run while
the control plane compiles. Warm, every build is a cache hit within seconds.
``--no-build`` skips this (the tools must then already be built).

``--order`` says when each runs: runs separated by commas run one after the
other, runs joined by ``+`` at the same time (the default is
``unit+parallel,faults+node``); ``node,faults,parallel,unit`` runs all four
one by one the other way round, which shows the suite does not depend on the
order. Runs at the same time print their lines as they come, each after its
run's name in brackets.

Tests are chosen by marker, and markers come from directories
(tests/conftest.py), so a new test file is picked up with no list to keep;
each run also collects only its own directories (``run_paths``: a new
directory goes to the parallel run), since collecting is importing.
Every run goes ahead even if an earlier one failed; the exit status is the
first failure's (pytest's own codes, in ``--order``'s order; a run whose tools
failed to build exits 3 without starting). Each run ends with pytest's closing
line, and the last line of all is their sum in the same format. Arguments
after ``--`` go to every pytest run (paths, ``-k``, ``-x``...).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hack import binaries

RUNS: dict[str, str] = {
    # name: marker expression
    "unit": "unit",
    "parallel": "not unit and not faults and not node",
    "faults": "faults",
    "node": "node",
}
# What each run waits for (hack/binaries.py): the chart tests among the unit
# tests run helm and helm-docs; the rest start control planes and more.
NEEDS: dict[str, tuple[str, ...]] = {
    "unit": ("helm", "helm-docs"),
    "parallel": binaries.TOOLS,
    "faults": binaries.TOOLS,
    "node": binaries.ALL,
}
# Where each run collects its tests: collecting is importing, and the whole
# suite costs a pytest process ~19 CPU-seconds to collect (2,700 tests) where
# tests/faults alone costs 5. A run has up to five such processes (xdist's
# workers collect too), so collecting everything in every run was ~2 of the
# suite's CPU-minutes. The parallel run takes every other directory (and any
# test file at the top), so a new directory needs no entry here.
OWN_DIRS = {"unit": "unit", "faults": "faults", "node": "node"}
TESTS = binaries.REPO / "tests"
DEFAULT_ORDER = "unit+parallel,faults+node"
DEFAULT_UNIT_WORKERS = 2
DEFAULT_WORKERS = 4
DEFAULT_FAULT_WORKERS = 4
BUILD_FAILED = 3  # the exit status of a run whose tools failed to build (it never started)

NO_TESTS_COLLECTED = 5  # pytest's exit code when a run selects nothing

# pytest's closing line, e.g. "==== 3 passed, 1 skipped in 12.34s (0:00:12) ====".
_CLOSING = re.compile(r"^=+ (?P<counts>.+?) in (?P<seconds>[\d.]+)s(?: \([\d:]+\))? =+$")
_COUNT = re.compile(r"(\d+) (\w+)")
# Plural and singular spellings pytest uses, summed under one.
_SAME = {"error": "errors", "warning": "warnings"}
# The order pytest prints them in; anything else comes after.
_ORDER = ("failed", "passed", "skipped", "xfailed", "xpassed", "warnings", "errors", "rerun")


@dataclass(frozen=True)
class Outcome:
    name: str
    returncode: int
    counts: Counter[str]
    seconds: float
    closing: str | None


def parse_order(text: str) -> list[list[str]]:
    """``--order``: stages one after the other (``,``), each of runs at the same time (``+``).

    Every run is named exactly once; anything else is a ``ValueError`` saying what is wrong.
    """
    stages = [[name.strip() for name in stage.split("+")] for stage in text.split(",")]
    named = [name for stage in stages for name in stage]
    unknown = sorted({name for name in named if name not in RUNS})
    twice = sorted({name for name in named if named.count(name) > 1})
    missing = sorted(set(RUNS) - set(named))
    problems = [
        *([f"unknown run(s) {unknown}"] if unknown else []),
        *([f"named more than once: {twice}"] if twice else []),
        *([f"missing: {missing}"] if missing else []),
    ]
    if problems:
        raise ValueError(
            f"--order {text!r}: {'; '.join(problems)} (name each of {sorted(RUNS)} once, "
            "',' between runs one after the other, '+' between runs at the same time)"
        )
    return stages


def parse_closing(line: str) -> tuple[Counter[str], float] | None:
    """The counts and duration of pytest's closing line, or None if ``line`` is not one."""
    match = _CLOSING.match(line.strip())
    if not match:
        return None
    counts: Counter[str] = Counter()
    for number, word in _COUNT.findall(match.group("counts")):
        counts[_SAME.get(word, word)] += int(number)
    if not counts:
        return None
    return counts, float(match.group("seconds"))


def closing_line(counts: Counter[str], seconds: float) -> str:
    """A closing line in pytest's format for the sum of the runs (deselections left out)."""
    words = [w for w in _ORDER if counts[w]] + sorted(
        w for w in counts if w not in _ORDER and w != "deselected" and counts[w]
    )
    body = ", ".join(f"{counts[w]} {w}" for w in words) or "no tests ran"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{'=' * 10} {body} in {seconds:.2f}s ({hours}:{minutes:02d}:{secs:02d}) {'=' * 10}"


def verdict(outcomes: Sequence[Outcome]) -> int:
    """The exit status of the whole suite: the first failing run's, else 0."""
    ran = False
    for outcome in outcomes:
        if outcome.returncode == NO_TESTS_COLLECTED:
            continue
        if outcome.returncode != 0:
            return outcome.returncode
        if outcome.closing is None:
            return 1  # pytest exited 0 without its closing line: something is off
        ran = True
    return 0 if ran else NO_TESTS_COLLECTED


def run_paths(name: str, tests: Path = TESTS) -> list[str]:
    """The test directories (and files) run ``name`` collects, relative to the repository."""
    if name in OWN_DIRS:
        found = [tests / OWN_DIRS[name]]
    else:
        others = set(OWN_DIRS.values())
        found = sorted(
            entry
            for entry in tests.iterdir()
            if (entry.is_dir() and entry.name not in others and (entry / "__init__.py").exists())
            or (entry.is_file() and entry.name.startswith("test_") and entry.suffix == ".py")
        )
    return [str(path.relative_to(tests.parent)) for path in found]


def names_paths(args: Sequence[str]) -> bool:
    """Whether ``args`` name tests to run (a path, maybe with ``::test``), as pytest takes them."""
    return any(
        not arg.startswith("-") and (binaries.REPO / arg.split("::")[0]).exists() for arg in args
    )


def pytest_command(name: str, workers: int, extra: Sequence[str]) -> list[str]:
    """The pytest of run ``name`` on ``workers`` xdist workers (1: one process, no workers).

    It collects only the run's own directories (``run_paths``), unless ``extra``
    names paths itself; the marker still chooses among what is collected.
    """
    command = [sys.executable, "-m", "pytest", "-m", RUNS[name]]
    # -p no:xdist would also drop the xdist_group marker some tests use; -n 0 keeps it.
    command += ["-n", str(workers), "--dist", "load"] if workers > 1 else ["-n", "0"]
    paths = [] if names_paths(extra) else run_paths(name)
    return [*command, *extra, *paths]


_PRINTING = threading.Lock()


def _echo(line: str) -> None:
    with _PRINTING:
        sys.stdout.write(line)
        sys.stdout.flush()


def _no_wait(name: str) -> str | None:
    return None


def run_stage(
    commands: dict[str, list[str]], ready: Callable[[str], str | None] = _no_wait
) -> list[Outcome]:
    """Run these pytest commands at the same time; their outcomes, in the same order.

    Each waits first for ``ready(name)``: None lets it start, a message keeps it
    from starting (it is printed, and the run exits ``BUILD_FAILED``). With more
    than one run, each line printed is prefixed with its run's name.
    """
    prefixed = len(commands) > 1
    outcomes: dict[str, Outcome] = {}

    def say(name: str, line: str) -> None:
        _echo(f"[{name}] {line}" if prefixed else line)

    def follow(name: str, command: list[str]) -> None:
        waited = time.monotonic()
        refused = ready(name)
        if refused is not None:
            say(name, f"not run: {refused}\n")
            outcomes[name] = Outcome(name, BUILD_FAILED, Counter(), 0.0, None)
            return
        if time.monotonic() - waited > 1:
            say(name, f"(waited {time.monotonic() - waited:.0f} s for its tools)\n")
        started = time.monotonic()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, bufsize=1)
        assert proc.stdout is not None
        closing: str | None = None
        counts: Counter[str] = Counter()
        for line in proc.stdout:
            say(name, line)
            parsed = parse_closing(line)
            if parsed is not None:
                closing, counts = line.strip(), parsed[0]
        returncode = proc.wait()
        outcomes[name] = Outcome(name, returncode, counts, time.monotonic() - started, closing)

    followers = []
    for name, command in commands.items():
        _echo(f"\n### {name}: {' '.join(command[1:])}\n")
        follower = threading.Thread(target=follow, args=(name, command), name=f"follow-{name}")
        follower.start()
        followers.append(follower)
    for follower in followers:
        follower.join()
    return [outcomes[name] for name in commands]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hack.suite",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--order",
        default=DEFAULT_ORDER,
        help="when each run goes: ',' between runs one after the other, '+' between runs "
        f"at the same time (default {DEFAULT_ORDER})",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=int(os.environ.get("KSC_TEST_WORKERS", DEFAULT_WORKERS)),
        help="xdist workers (each with its own control plane) for the parallel run; "
        f"default $KSC_TEST_WORKERS or {DEFAULT_WORKERS}",
    )
    parser.add_argument(
        "--fault-workers",
        type=int,
        default=int(os.environ.get("KSC_FAULT_WORKERS", DEFAULT_FAULT_WORKERS)),
        help="xdist workers (each with its own control plane) for the fault run; 1 runs it "
        f"in one process; default $KSC_FAULT_WORKERS or {DEFAULT_FAULT_WORKERS}",
    )
    parser.add_argument(
        "--unit-workers",
        type=int,
        default=DEFAULT_UNIT_WORKERS,
        help=f"xdist workers for the unit run (default {DEFAULT_UNIT_WORKERS})",
    )
    parser.add_argument(
        "--no-build",
        action="store_true",
        help="start every run at once, without building the tools (hack/binaries.py) first",
    )
    parser.add_argument("pytest_args", nargs="*", help="passed to every pytest run")
    args = parser.parse_args(argv)
    try:
        stages = parse_order(args.order)
    except ValueError as exc:
        parser.error(str(exc))
    workers = {
        "unit": args.unit_workers,
        "parallel": args.workers,
        "faults": args.fault_workers,
        "node": 1,
    }
    for option, value in (
        ("--unit-workers", args.unit_workers),
        ("--workers", args.workers),
        ("--fault-workers", args.fault_workers),
    ):
        if value < 1:
            parser.error(f"{option} must be at least 1, got {value}")
    started = time.monotonic()
    builds: binaries.Builds | None = None
    ready: Callable[[str], str | None] = _no_wait
    if not args.no_build:
        log_dir = Path(tempfile.mkdtemp(prefix="ksc-builds-"))
        builds = binaries.Builds(binaries.ALL, log_dir).start()

        def ready(name: str) -> str | None:
            assert builds is not None
            failed = [b.name for b in builds.wait(NEEDS[name]) if not b.ok]
            return f"the build of {', '.join(failed)} failed (below)" if failed else None

    outcomes: list[Outcome] = []
    for stage in stages:
        commands = {name: pytest_command(name, workers[name], args.pytest_args) for name in stage}
        outcomes += run_stage(commands, ready)
    if builds is not None:
        print("\n### the tools (hack/binaries.py)", flush=True)
        if binaries.report(builds.join()) == 0:
            shutil.rmtree(builds.log_dir)
    total: Counter[str] = Counter()
    print("\n### the suite, run by run", flush=True)
    for outcome in outcomes:
        total.update(outcome.counts)
        shown = outcome.closing or f"(no closing line; pytest exited {outcome.returncode})"
        print(f"{outcome.name:>8}: {shown}  [exit {outcome.returncode}]")
    status = verdict(outcomes)
    print(f"### all runs ({','.join('+'.join(stage) for stage in stages)}):")
    print(closing_line(total, time.monotonic() - started), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
