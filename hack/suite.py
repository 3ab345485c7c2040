"""The whole test suite as ``make test`` runs it: three pytest runs, one verdict.

Most of the suite waits (on the API server, the controller, a model server),
so it runs on several pytest-xdist workers, each with its own control plane
(the ``cluster`` fixture is per session, and each worker is a session). Two
tiers run alone, after it, one pytest each, because they must not share the
machine's two cores with anything: the fault tier (kills and outages with
deadlines) and the real-node tier (real kubelets, containerd, image builds).

=========  ==============================  =====================
run        tests (by marker)               workers
=========  ==============================  =====================
parallel   everything but faults and node  ``--workers`` (xdist)
faults     ``faults`` (tests/faults)        1
node       ``node`` (tests/node)            1
=========  ==============================  =====================

Tests are chosen by marker, and markers come from directories
(tests/conftest.py), so a new test file is picked up with no list to keep.
Every run goes ahead even if an earlier one failed; the exit status is the
first failure's (pytest's own codes). Each run ends with pytest's closing
line, and the last line of all is their sum in the same format. ``--order``
runs them in another order (the suite does not depend on it); arguments
after ``--`` go to every pytest run (paths, ``-k``, ``-x``...).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

RUNS: dict[str, tuple[str, bool]] = {
    # name: (marker expression, on xdist workers)
    "parallel": ("not faults and not node", True),
    "faults": ("faults", False),
    "node": ("node", False),
}
DEFAULT_ORDER = ("parallel", "faults", "node")
DEFAULT_WORKERS = 4

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


def pytest_command(name: str, workers: int, extra: Sequence[str]) -> list[str]:
    marker, parallel = RUNS[name]
    command = [sys.executable, "-m", "pytest", "-m", marker]
    # -p no:xdist would also drop the xdist_group marker some tests use; -n 0 keeps it.
    command += ["-n", str(workers), "--dist", "load"] if parallel else ["-n", "0"]
    return [*command, *extra]


def run(name: str, workers: int, extra: Sequence[str]) -> Outcome:
    command = pytest_command(name, workers, extra)
    print(f"\n### {name}: {' '.join(command[1:])}", flush=True)
    started = time.monotonic()
    closing: str | None = None
    counts: Counter[str] = Counter()
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            parsed = parse_closing(line)
            if parsed is not None:
                closing, counts = line.strip(), parsed[0]
    seconds = time.monotonic() - started
    return Outcome(name, proc.returncode, counts, seconds, closing)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.suite", description=__doc__)
    parser.add_argument(
        "--order",
        default=",".join(DEFAULT_ORDER),
        help=f"the runs, comma-separated, in the order to run them (default {DEFAULT_ORDER})",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=int(os.environ.get("KSC_TEST_WORKERS", DEFAULT_WORKERS)),
        help="xdist workers (each with its own control plane) for the parallel run; "
        f"default $KSC_TEST_WORKERS or {DEFAULT_WORKERS}",
    )
    parser.add_argument("pytest_args", nargs="*", help="passed to every pytest run")
    args = parser.parse_args(argv)
    order = [name.strip() for name in args.order.split(",") if name.strip()]
    if sorted(order) != sorted(RUNS):
        parser.error(f"--order must name each of {sorted(RUNS)} once, got {order}")
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    started = time.monotonic()
    outcomes = [run(name, args.workers, args.pytest_args) for name in order]
    total: Counter[str] = Counter()
    print("\n### the suite, run by run", flush=True)
    for outcome in outcomes:
        total.update(outcome.counts)
        shown = outcome.closing or f"(no closing line; pytest exited {outcome.returncode})"
        print(f"{outcome.name:>8}: {shown}  [exit {outcome.returncode}]")
    status = verdict(outcomes)
    print(f"### all runs ({'+'.join(order)}):")
    print(closing_line(total, time.monotonic() - started), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
