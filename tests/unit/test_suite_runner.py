"""hack/suite.py: how `make test` splits the suite into runs and sums their verdicts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
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
    # Each test has one directory marker (tests/conftest.py); each is in one run.
    def selected(expression: str, markers: set[str]) -> bool:
        names = ("unit", "integration", "e2e", "faults", "node")
        return bool(eval(expression, {}, {m: m in markers for m in names}))

    for markers in ({"unit"}, {"integration"}, {"e2e"}, {"faults"}, {"node"}):
        runs = [name for name, expr in suite.RUNS.items() if selected(expr, markers)]
        assert len(runs) == 1, (markers, runs)
    assert sorted(n for stage in suite.parse_order(suite.DEFAULT_ORDER) for n in stage) == sorted(
        suite.RUNS
    )
    assert set(suite.NEEDS) == set(suite.RUNS)


def test_the_default_order_runs_units_beside_the_parallel_run_then_faults_beside_node() -> None:
    assert suite.parse_order(suite.DEFAULT_ORDER) == [["unit", "parallel"], ["faults", "node"]]


@pytest.mark.parametrize(
    ("text", "stages"),
    [
        ("unit,parallel,faults,node", [["unit"], ["parallel"], ["faults"], ["node"]]),
        ("node,faults,parallel,unit", [["node"], ["faults"], ["parallel"], ["unit"]]),
        ("node+faults,parallel+unit", [["node", "faults"], ["parallel", "unit"]]),
        (" faults + node , unit+parallel ", [["faults", "node"], ["unit", "parallel"]]),
        ("unit+parallel+faults+node", [["unit", "parallel", "faults", "node"]]),
    ],
)
def test_order_reads_stages_one_after_the_other_of_runs_at_the_same_time(
    text: str, stages: list[list[str]]
) -> None:
    assert suite.parse_order(text) == stages


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("unit,parallel,faults", "missing: ['node']"),
        ("unit,parallel,faults,node,faults", "named more than once: ['faults']"),
        ("unit+parallel+faults,node+e2e", "unknown run(s) ['e2e']"),
        ("unit,parallel,,faults+node", "unknown run(s) ['']"),
        ("", "missing: ['faults', 'node', 'parallel', 'unit']"),
    ],
)
def test_a_bad_order_is_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        suite.parse_order(text)


def test_a_bad_order_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        suite.main(["--order", "unit,parallel,node"])
    assert exited.value.code == 2
    assert "missing: ['faults']" in capsys.readouterr().err


def test_runs_with_workers_get_xdist_and_the_node_run_none() -> None:
    parallel = suite.pytest_command("parallel", 3, ["-x"])
    assert parallel[5:10] == ["-n", "3", "--dist", "load", "-x"]
    faults = suite.pytest_command("faults", 2, [])
    assert faults[5:9] == ["-n", "2", "--dist", "load"]
    for name in ("faults", "node"):
        command = suite.pytest_command(name, 1, [])
        assert command[5:7] == ["-n", "0"]
        assert command[command.index("-m", 3) + 1] == name
        assert command[-1] == f"tests/{name}"


def test_each_run_collects_its_own_directories_and_together_every_test() -> None:
    paths = {name: suite.run_paths(name) for name in suite.RUNS}
    assert paths["unit"] == ["tests/unit"]
    assert paths["faults"] == ["tests/faults"]
    assert paths["node"] == ["tests/node"]
    assert {"tests/integration", "tests/e2e", "tests/runner"} <= set(paths["parallel"])
    # Every test file of the repository is under exactly one run's paths.
    taken = [p for run in paths.values() for p in run]
    for test_file in suite.TESTS.rglob("test_*.py"):
        relative = str(test_file.relative_to(suite.TESTS.parent))
        owners = [p for p in taken if relative == p or relative.startswith(p + "/")]
        assert len(owners) == 1, (relative, owners)


def test_a_directory_of_tests_added_later_goes_to_the_parallel_run(tmp_path: Path) -> None:
    for name in ("unit", "faults", "node", "soak", "helpers_only"):
        (tmp_path / "tests" / name).mkdir(parents=True)
    for name in ("unit", "faults", "node", "soak"):
        (tmp_path / "tests" / name / "__init__.py").touch()
    (tmp_path / "tests" / "test_top.py").touch()
    (tmp_path / "tests" / "kubehelpers.py").touch()
    parallel = suite.run_paths("parallel", tmp_path / "tests")
    assert parallel == ["tests/soak", "tests/test_top.py"]


def test_paths_given_after_the_separator_replace_the_runs_own() -> None:
    command = suite.pytest_command("unit", 1, ["-k", "chart", "tests/unit/test_chart.py::test_x"])
    assert command[-1] == "tests/unit/test_chart.py::test_x"
    assert "tests/unit" not in command
    assert suite.pytest_command("unit", 1, ["-k", "chart"])[-1] == "tests/unit"


def _fake_pytest(lines: list[str], code: int, pause: float = 0.0) -> list[str]:
    """A command that prints ``lines`` (with a pause between) and exits ``code``."""
    script = (
        "import sys, time\n"
        f"for line in {lines!r}:\n"
        "    print(line, flush=True)\n"
        f"    time.sleep({pause})\n"
        f"sys.exit({code})\n"
    )
    return [sys.executable, "-c", script]


def test_runs_at_the_same_time_each_keep_their_lines_and_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    commands = {
        "faults": _fake_pytest(["f-one", "== 1 failed, 2 passed in 0.20s =="], 1, 0.2),
        "node": _fake_pytest(["n-one", "n-two", "== 3 passed in 0.10s =="], 0, 0.1),
    }
    outcomes = suite.run_stage(commands)
    assert [o.name for o in outcomes] == ["faults", "node"]
    faults, node = outcomes
    assert (faults.returncode, faults.counts) == (1, Counter({"failed": 1, "passed": 2}))
    assert faults.closing == "== 1 failed, 2 passed in 0.20s =="
    assert (node.returncode, node.counts) == (0, Counter({"passed": 3}))
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("[")]
    assert [line for line in lines if line.startswith("[faults] ")] == [
        "[faults] f-one",
        "[faults] == 1 failed, 2 passed in 0.20s ==",
    ]
    assert [line for line in lines if line.startswith("[node] ")] == [
        "[node] n-one",
        "[node] n-two",
        "[node] == 3 passed in 0.10s ==",
    ]
    assert len(lines) == 5, out
    assert suite.verdict(outcomes) == 1


def test_a_run_starts_once_ready_and_one_refused_never_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    started = tmp_path / "started"
    gate = tmp_path / "gate"
    touch = [
        sys.executable,
        "-c",
        f"open({str(started)!r}, 'w').close(); print('= 1 passed in 0.01s =')",
    ]

    def ready(name: str) -> str | None:
        if name == "node":
            return "the build of node failed (below)"
        # The unit run may start only once this file exists: written by the check below.
        while not gate.exists():
            time.sleep(0.01)
        return None

    result: list[suite.Outcome] = []
    stage = threading.Thread(
        target=lambda: result.extend(suite.run_stage({"unit": touch, "node": touch}, ready))
    )
    stage.start()
    time.sleep(0.3)
    assert not started.exists()  # still waiting for its tools
    gate.touch()
    stage.join(timeout=60)
    assert started.exists()
    unit, node = result
    assert (unit.returncode, unit.counts) == (0, Counter({"passed": 1}))
    assert (node.returncode, node.closing) == (suite.BUILD_FAILED, None)
    assert "[node] not run: the build of node failed (below)" in capsys.readouterr().out
    assert suite.verdict(result) == suite.BUILD_FAILED


def test_a_run_alone_prints_its_lines_as_they_are(capsys: pytest.CaptureFixture[str]) -> None:
    (outcome,) = suite.run_stage({"node": _fake_pytest(["n-one", "== 1 passed in 0.01s =="], 0)})
    assert outcome.counts == Counter({"passed": 1})
    out = capsys.readouterr().out
    assert "\nn-one\n== 1 passed in 0.01s ==\n" in out
    assert "[node]" not in out


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
                "--unit-workers",
                "1",
                "--fault-workers",
                "1",
                "--order",
                "node+faults,parallel+unit",
                "--no-build",
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


def test_each_fault_test_named_in_the_order_is_a_test() -> None:
    """A renamed fault test (or case) would drop silently to the end of the fault run's order."""
    conftest = (REPO / "tests" / "faults" / "conftest.py").read_text()
    names = re.findall(
        r'^    "(test_\w+\.py)::(test_\w+)(?:\[([\w-]+)\])?",', conftest, flags=re.MULTILINE
    )
    assert len(names) >= 10, "ORDER not found in tests/faults/conftest.py"
    for file, test, case in names:
        source = (REPO / "tests" / "faults" / file).read_text()
        assert re.search(rf"^(async )?def {test}\(", source, flags=re.MULTILINE), f"{file}::{test}"
        # A case is a parameter value of the test's file, written as a string.
        assert not case or f'"{case}"' in source, f"{file}::{test}[{case}]"
