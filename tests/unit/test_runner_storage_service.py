"""The storage look-alike's notebooks and argv rules (hack/storage_service.py), on SQLite."""

from __future__ import annotations

import sqlite3

import orjson
import pytest

from hack.storage_service import (
    ARGUMENT_LIMIT,
    NotebookFailed,
    argv_from_body,
    parse_arguments,
    sklearn_input,
    store_output,
    triton_input,
    zero_filled,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def db() -> sqlite3.Connection:
    return sqlite3.connect(":memory:")


def test_body_values_become_key_value_arguments() -> None:
    assert argv_from_body({"a": "1", "b": "x=y"}) == ["a=1", "b=x=y"]
    # The notebooks keep only what comes before a second "=".
    assert parse_arguments(["a=1", "b=x=y", "c"]) == {"a": "1", "b": "x", "c": ""}


def test_non_string_values_fail_like_the_handler() -> None:
    with pytest.raises(TypeError, match="not int"):
        argv_from_body({"a": 1})
    with pytest.raises(TypeError, match="must be a JSON object"):
        argv_from_body(["a"])


def test_one_argument_is_limited_to_128_kib() -> None:
    argv_from_body({"p": "x" * (ARGUMENT_LIMIT - 3)})
    with pytest.raises(OSError, match="Argument list too long"):
        argv_from_body({"p": "x" * (ARGUMENT_LIMIT - 2)})


def test_sklearn_input_returns_every_row_as_floats(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE t (a, b)")
    db.executemany("INSERT INTO t VALUES (?, ?)", [(1, 2.5), (3, 4)])
    out = orjson.loads(sklearn_input(db, {"input_table_name": "t"}))
    assert out == {"result": [[1.0, 2.5], [3.0, 4.0]]}


@pytest.mark.parametrize("name", ["t; DROP TABLE x", "t x", "1t", ""])
def test_identifiers_are_validated_not_interpolated(db: sqlite3.Connection, name: str) -> None:
    with pytest.raises(NotebookFailed, match="invalid table name"):
        sklearn_input(db, {"input_table_name": name})


def test_missing_argument_is_reported_like_upstream(db: sqlite3.Connection) -> None:
    with pytest.raises(NotebookFailed, match="missing agument for call: job_uid"):
        store_output(db, {"output_table_name": "o"})


def test_store_output_inserts_one_row_per_prediction(db: sqlite3.Connection) -> None:
    arguments = {"output_table_name": "o", "job_uid": "j", "pod_uid": "p"}
    assert store_output(db, {**arguments, "predictions": "[1,0,2]"}) == ""
    store_output(db, {**arguments, "predictions": "[2,2]", "predictions_offset": "3"})
    rows = db.execute("SELECT jobuid, poduid, prediction, counter FROM o ORDER BY counter")
    assert rows.fetchall() == [
        ("j", "p", 1.0, 0),
        ("j", "p", 0.0, 1),
        ("j", "p", 2.0, 2),
        ("j", "p", 2.0, 3),
        ("j", "p", 2.0, 4),
    ]


def test_the_same_prediction_twice_violates_the_primary_key(db: sqlite3.Connection) -> None:
    arguments = {"output_table_name": "o", "job_uid": "j", "pod_uid": "p", "predictions": "[1]"}
    store_output(db, arguments)
    with pytest.raises(sqlite3.IntegrityError):
        store_output(db, arguments)


def test_triton_input_zero_fills_and_keeps_the_tail(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE s (k, v, timestamp)")
    db.executemany(
        "INSERT INTO s VALUES (?, ?, ?)",
        [
            ("a", 1.0, "2026-01-01T00:00:00+00:00"),
            ("a", None, "2026-01-01T00:01:00+00:00"),
            ("a", 4.0, "2026-01-01T00:04:00+00:00"),
            ("b", 9.0, "2026-01-01T00:02:00+00:00"),
        ],
    )
    arguments = {
        "input_table_name": "s",
        "input_table_column_name": "v",
        "key_name": "k",
        "key_value": "a",
    }
    out = orjson.loads(triton_input(db, {**arguments, "input_data_length": "4"}))
    assert out == {"result": [[0.0, 0.0, 0.0, 4.0]]}
    everything = orjson.loads(triton_input(db, {**arguments, "input_data_length": "100"}))
    assert everything == {"result": [[1.0, 0.0, 0.0, 0.0, 4.0]]}
    nothing = orjson.loads(
        triton_input(db, {**arguments, "key_value": "z", "input_data_length": "4"})
    )
    assert nothing == {"result": []}


def test_zero_filled_uses_the_smallest_step() -> None:
    assert zero_filled([(0.0, 1.0), (2.0, 2.0), (3.0, 3.0)]) == [1.0, 0.0, 2.0, 3.0]
    assert zero_filled([(5.0, 7.0)]) == [7.0]


def test_a_table_made_by_keyed_writes_has_one_unique_index(db: sqlite3.Connection) -> None:
    # rowkey is the key; a second unique index (upstream's primary key) doubled the
    # cost of every keyed insert and could never refuse a row rowkey lets through.
    keyed = {"shard_index": "0", "shard_count": "1", "idempotency_key": "j/0/0"}
    first = {"output_table_name": "o", "job_uid": "j", "pod_uid": "p", "predictions": "[1,2]"}
    assert orjson.loads(store_output(db, {**first, **keyed})) == {"stored": 2, "duplicates": 0}
    again = {**first, "pod_uid": "q", "predictions": "[1,2,3]"}
    assert orjson.loads(store_output(db, {**again, **keyed})) == {"stored": 1, "duplicates": 2}
    indexes = db.execute("PRAGMA index_list(o)").fetchall()
    assert [(row[1], row[2]) for row in indexes] == [("o_rowkey", 1)]
    rows = db.execute("SELECT poduid, prediction, counter, rowkey FROM o ORDER BY counter")
    assert rows.fetchall() == [
        ("p", 1.0, 0, "j/0/0"),
        ("p", 2.0, 1, "j/0/1"),
        ("q", 3.0, 2, "j/0/2"),
    ]


def test_rows_that_are_not_all_floats_are_still_made_floats(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE t (a, b)")
    db.executemany("INSERT INTO t VALUES (?, ?)", [(1, 2.5), (3.0, "4")])
    answer = orjson.loads(sklearn_input(db, {"input_table_name": "t", "offset": "0"}))
    assert answer == {"result": [[1.0, 2.5], [3.0, 4.0]], "total": 2}
    assert isinstance(answer["result"][0][0], float)
