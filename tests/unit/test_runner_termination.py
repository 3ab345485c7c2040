"""The termination message and the progress lines: the controller's two views of a run."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from contract.progress import Progress, last_progress, parse_line
from contract.termination import (
    MAX_BYTES,
    RunResult,
    cut,
    parse_success,
    success_message,
    total,
)
from runner import termination
from runner.progress import ProgressTracker
from runner.redact import Redactor
from runner.termination import failure_message

pytestmark = pytest.mark.unit


def test_success_is_compact_json() -> None:
    message = success_message(RunResult(rows=150, predictions=150, duration_seconds=1.23456))
    assert message == '{"rows":150,"predictions":150,"durationSeconds":1.235}'


@pytest.mark.parametrize(
    "result",
    [
        RunResult(rows=150, predictions=150, duration_seconds=1.5),
        RunResult(1000, 990, 2.0, resumed_rows=900, pages=2, chunks=1, duplicates=10),
    ],
)
def test_the_controller_parses_what_the_runner_writes(result: RunResult) -> None:
    assert parse_success(success_message(result)) == result


@pytest.mark.parametrize(
    "message",
    [
        "",
        "not json",
        "[]",
        "output: storage answered 500",
        '{"rows": 1, "predictions": 1}',
        '{"rows": -1, "predictions": 1, "durationSeconds": 1}',
        '{"rows": 1, "predictions": 1, "durationSeconds": 1, "pages": -2}',
    ],
)
def test_anything_else_is_no_result(message: str) -> None:
    assert parse_success(message) is None


def test_unknown_keys_are_ignored() -> None:
    parsed = parse_success('{"rows":1,"predictions":1,"durationSeconds":0.5,"new":true}')
    assert parsed == RunResult(1, 1, 0.5)


def test_shards_add_up_their_counts_and_take_the_longest_duration() -> None:
    shards = [
        RunResult(10, 10, 2.0, resumed_rows=4, pages=1, chunks=1, duplicates=0),
        RunResult(5, 4, 3.0, resumed_rows=0, pages=2, chunks=3, duplicates=1),
    ]
    assert total(shards) == RunResult(15, 14, 3.0, resumed_rows=4, pages=3, chunks=4, duplicates=1)
    # An unpaged run reports no streaming counts, and its total has none either.
    assert total([RunResult(1, 1, 1.0), RunResult(2, 2, 0.5)]) == RunResult(3, 3, 1.0)
    assert total([]) is None


def test_failure_is_one_redacted_line_with_its_stage() -> None:
    redactor = Redactor(["hunter22"])
    message = failure_message("output", "POST http://h answered 200:\n  boom hunter22\n", redactor)
    assert message == "output: POST http://h answered 200: boom [REDACTED]"


def test_failure_without_reason_is_the_stage() -> None:
    assert failure_message("input", "  ", Redactor()) == "input"


def test_cut_keeps_short_text_and_cuts_long_text_on_a_character_boundary() -> None:
    assert cut("short") == "short"
    long = "é" * 3000  # 6000 bytes
    cut_text = cut(long)
    assert len(cut_text.encode()) <= MAX_BYTES < 4096
    assert cut_text.endswith("…")
    assert set(cut_text[:-1]) == {"é"}


def test_a_huge_failure_message_still_fits(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    termination.write(path, failure_message("inference", "x" * 10_000, Redactor()))
    assert len(path.read_bytes()) <= MAX_BYTES


def test_progress_lines_round_trip() -> None:
    line = orjson.dumps({"event": "progress", **Progress(5, 10).fields(), "level": "info"})
    assert parse_line(line.decode()) == Progress(rows_done=5, rows_total=10)
    assert Progress(5, 10).fraction == 0.5
    assert Progress(0, 0).fraction == 1.0


def test_last_progress_finds_the_newest_valid_line_among_other_logs() -> None:
    log = "\n".join(
        [
            '{"event": "input loaded", "rows": 100}',
            '{"event": "progress", "rowsDone": 10, "rowsTotal": 100}',
            # kubectl logs --timestamps puts a timestamp first
            '2026-11-22T00:00:01.000Z {"event": "progress", "rowsDone": 60, "rowsTotal": 100}',
            '{"event": "progress", "rowsDone": true, "rowsTotal": 100}',
            '{"event": "progress", "rowsDone": -1, "rowsTotal": 100}',
            '{"event": "progress", "rowsDone": 70',  # cut by tailLines/limitBytes
            "plain text mentioning progress",
            '{"event": "model request failed, retrying"}',
        ]
    )
    assert last_progress(log) == Progress(rows_done=60, rows_total=100)


def test_last_progress_of_a_log_without_progress_is_none() -> None:
    assert last_progress("") is None
    assert last_progress('{"event": "contract loaded"}\n') is None
    assert last_progress('["progress"]') is None


def test_tracker_reports_only_changes() -> None:
    emitted: list[Progress] = []
    tracker = ProgressTracker(10, emitted.append)
    tracker.report()
    tracker.report()
    tracker.advance(4)
    tracker.report()
    assert emitted == [Progress(0, 10), Progress(4, 10)]


async def test_tracker_running_reports_at_start_and_at_the_end() -> None:
    emitted: list[Progress] = []
    tracker = ProgressTracker(3, emitted.append, interval=3600)
    async with tracker.running():
        tracker.advance(3)
    assert emitted[0] == Progress(0, 3)
    assert emitted[-1] == Progress(3, 3)
