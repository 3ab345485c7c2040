"""hack/suite.py: how `make test` splits the suite into runs and sums their verdicts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from hack import suite

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("line", "counts", "seconds"),
    [
        ("==== 3 passed in 1.20s ====", {"passed": 3}, 1.2),
        (
            "= 1 failed, 1200 passed, 2 skipped, 5 deselected, 1 warning in 900.50s (0:15:00) =",
            {"failed": 1, "passed": 1200, "skipped": 2, "deselected": 5, "warnings": 1},
            900.5,
        ),
        ("= 2 passed, 1 error in 3.00s =", {"passed": 2, "errors": 1}, 3.0),
        ("== 12 deselected in 0.50s ==", {"deselected": 12}, 0.5),
    ],
)
def test_parse_closing_reads_pytests_last_line(
    line: str, counts: dict[str, int], seconds: float
) -> None:
    assert suite.parse_closing(line) == (Counter(counts), seconds)


@pytest.mark.parametrize(
    "line",
    ["", "tests/unit/test_x.py ....  [100%]", "=== short test summary info ===", "= FAILURES ="],
)
def test_parse_closing_ignores_other_lines(line: str) -> None:
    assert suite.parse_closing(line) is None


def test_closing_line_sums_in_pytests_format_without_deselections() -> None:
    counts = Counter({"passed": 1500, "skipped": 3, "deselected": 80, "failed": 2, "warnings": 4})
    line = suite.closing_line(counts, 725.25)
    assert "1500 passed" in line
    assert line.startswith("=" * 10 + " 2 failed, 1500 passed, 3 skipped, 4 warnings in 725.25s")
    assert "(0:12:05)" in line
    assert "deselected" not in line
    # The line reads back as a closing line: whatever reads pytest's reads this one.
    parsed = suite.parse_closing(line)
    assert parsed == (counts - Counter({"deselected": 80}), 725.25)


def _outcome(name: str, code: int, closing: str | None = "= 1 passed in 1.00s =") -> suite.Outcome:
    return suite.Outcome(name, code, Counter(), 1.0, closing)


def test_any_failing_run_fails_the_suite() -> None:
    assert suite.verdict([_outcome("a", 0), _outcome("b", 0), _outcome("c", 0)]) == 0
    assert suite.verdict([_outcome("a", 0), _outcome("b", 1), _outcome("c", 0)]) == 1
    assert suite.verdict([_outcome("a", 2), _outcome("b", 1)]) == 2
    # A run that selected nothing (paths given for one tier) is no failure...
    assert suite.verdict([_outcome("a", 0), _outcome("b", 5, None)]) == 0
    # ...unless nothing ran at all.
    assert suite.verdict([_outcome("a", 5, None), _outcome("b", 5, None)]) == 5
    # pytest exiting 0 without its closing line is not trusted.
    assert suite.verdict([_outcome("a", 0, None)]) == 1


def test_every_test_is_in_exactly_one_run() -> None:
    # The three marker expressions cover every combination of the two markers once.
    def selected(expression: str, markers: set[str]) -> bool:
        return bool(eval(expression, {}, {m: m in markers for m in ("faults", "node")}))

    for markers in (set(), {"faults"}, {"node"}):
        runs = [name for name, (expr, _) in suite.RUNS.items() if selected(expr, markers)]
        assert len(runs) == 1, (markers, runs)
    assert set(suite.DEFAULT_ORDER) == set(suite.RUNS)


def test_only_the_parallel_run_uses_workers() -> None:
    parallel = suite.pytest_command("parallel", 3, ["-x"])
    assert parallel[-5:] == ["-n", "3", "--dist", "load", "-x"]
    for name in ("faults", "node"):
        command = suite.pytest_command(name, 3, [])
        assert command[-2:] == ["-n", "0"]
        assert command[command.index("-m", 3) + 1] == name


INNER = """
def test_ok():
    pass


def test_broken():
    assert False, "broken on purpose"
"""


def test_a_failure_in_one_run_fails_the_whole_suite(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "hack.suite",
                "--workers",
                "2",
                "--order",
                "node,parallel,faults",
            ),
            *("--", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert suite.parse_closing(last) is not None, last
    assert "1 failed, 1 passed" in last
    assert "broken on purpose" in done.stdout
