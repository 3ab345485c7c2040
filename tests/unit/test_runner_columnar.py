"""An s3 page kept columnar gives what the row path gives: the same request, the same chunk.

The row path is the reference: records (``records_of``), the join's split
(:class:`runner.join.RowSplitter`) and output (:func:`runner.join.join`), then
the chunk's table (``chunk_table``). Each case runs both on one Arrow page and
compares the model's rows (decoded from the request body) and the stored
chunk, types included; pages the columnar path must leave to the row path
(nulls, NaN, a missing column, other types) are checked to be left.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
import pyarrow as pa
import pytest

from runner.inference import TensorSpec, v1_request, v2_request
from runner.join import RowSplitter, Selection, join
from runner.storage._columnar import ArrowRows, EncodedRows, constant, positions
from runner.storage._s3formats import chunk_table, encode_chunk, records_of
from runner.storage._s3layout import Format
from runner.storage.base import Page, Partition
from runner.streaming import Joiner

IRIS = ("sepal_length", "sepal_width", "petal_length", "petal_width")


def page(**columns: Any) -> ArrowRows:
    return ArrowRows([pa.table(columns)], records_of)


def row_path(rows: ArrowRows, selection: Selection, answer: list[Any]) -> tuple[Any, pa.Table]:
    features, carried = RowSplitter(selection).split(list(rows))
    output = join(selection, carried, answer)
    return features, chunk_table(output, len(rows), 0, 0)


def columnar_path(rows: ArrowRows, selection: Selection, answer: list[Any]) -> tuple[Any, pa.Table]:
    found = rows.columnar(RowSplitter(selection))
    assert found is not None, "the page was left to the row path"
    features, carried = found
    spec = TensorSpec("input-0", "FP32", (len(features[0]),))
    body = orjson.loads(v2_request(spec, features))
    assert body["inputs"][0]["shape"] == [len(rows), len(features[0])]
    output = carried.output(answer) if selection.joins else answer
    assert output is not None, "the output was left to the row path"
    return body["inputs"][0]["data"], chunk_table(output, len(rows), 0, 0)


def assert_same(rows: ArrowRows, selection: Selection, answer: list[Any]) -> pa.Table:
    expected_rows, expected_chunk = row_path(rows, selection, answer)
    got_rows, got_chunk = columnar_path(rows, selection, answer)
    assert got_rows == expected_rows
    assert got_chunk.schema == expected_chunk.schema
    assert got_chunk.to_pylist() == expected_chunk.to_pylist()
    return got_chunk


def test_a_keyed_page_with_a_passthrough_text_column() -> None:
    rows = page(
        id=pa.array([7, 3, 11], pa.int32()),
        sepal_length=[5.1, 6.2, 7.7],
        sepal_width=[3.5, 2.9, 3.0],
        petal_length=[1.4, 4.3, 6.1],
        petal_width=[0.2, 1.3, 2.3],
        species=["setosa", None, "virginica"],
    )
    selection = Selection(key_column="id", passthrough_columns=["species"])
    chunk = assert_same(rows, selection, [0, 1, 2])
    # Carried integers widen to 64 bits, as Table.from_pylist types Python ints.
    assert chunk.schema.field("id").type == pa.int64()
    assert chunk.column("species").to_pylist() == ["setosa", None, "virginica"]


def test_mixed_integer_and_float_columns_keep_their_numbers() -> None:
    rows = page(
        a=pa.array([5, 6, -7], pa.int64()),
        b=pa.array([3.5, 0.1 + 0.2, 1e-7], pa.float64()),
        c=pa.array([1.25, 2.5, 1e20], pa.float32()),
        d=pa.array([0, 1, 255], pa.uint8()),
    )
    selection = Selection(columns=["a", "b", "c", "d"])
    assert_same(rows, selection, [1, 0, 2])
    features, _ = columnar_path(rows, selection, [1, 0, 2])
    # Integers stay integers in the body; floats round-trip exactly.
    assert [type(v) for v in features[0]] == [int, float, float, int]
    assert features[1][1] == 0.1 + 0.2


def test_columns_pick_and_order_the_features_and_several_answers_per_row() -> None:
    rows = page(key=["a", "b"], x=[1.0, 2.0], y=[3.0, 4.0], z=[5.0, 6.0])
    selection = Selection(columns=["z", "x"], key_column="key")
    chunk = assert_same(rows, selection, [0.1, 0.9, 0.8, 0.2])
    assert chunk.column("prediction").to_pylist() == [[0.1, 0.9], [0.8, 0.2]]


def test_one_feature_column_and_no_carried_columns() -> None:
    rows = page(value=[1.5, 2.5, 3.5])
    chunk = assert_same(rows, Selection(), [10, 20, 30])
    assert chunk.column_names == ["shard", "row", "prediction"]


def test_a_v1_body_carries_the_same_rows() -> None:
    found = page(a=[1, 2], b=[0.5, 1.5]).columnar(RowSplitter(Selection()))
    assert found is not None
    assert orjson.loads(v1_request(found[0])) == {"instances": [[1, 0.5], [2, 1.5]]}


def test_encoded_rows_slice_like_a_list() -> None:
    found = page(a=list(range(10)), b=[float(i) / 2 for i in range(10)]).columnar(
        RowSplitter(Selection())
    )
    assert found is not None
    rows: EncodedRows = found[0]
    assert len(rows) == 10
    assert rows[3] == [3, 1.5]
    assert orjson.loads(rows[4:7].json()) == [[4, 2.0], [5, 2.5], [6, 3.0]]
    assert rows[10:].json() == b"[]"


def typed(value: Any) -> Any:
    """A decoded value with its type and sign: ``1`` differs from ``1.0``, ``-0.0`` from ``0.0``."""
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value).__name__, repr(value))


def test_whole_floats_reach_the_model_as_floats_with_their_sign() -> None:
    # Arrow's cast writes 1.0 as "1" and -0.0 as "-0": JSON integers (0 without its sign).
    rows = page(
        a=[-0.0, 1.0, 1e15, 1e10, 2.5, 1e-7],
        b=pa.array([1, -2, 3, 2**53 + 1, 5, 6], pa.int64()),
        c=pa.array([1.0, -0.0, 0.5, 3.0, 1e20, 7.0], pa.float32()),
    )
    selection = Selection(columns=["a", "b", "c"])
    expected, _ = row_path(rows, selection, [0] * 6)
    sent, _ = columnar_path(rows, selection, [0] * 6)
    assert len(sent) == 6
    assert typed(sent) == typed(expected)
    assert typed(sent[0]) == [("float", "-0.0"), ("int", "1"), ("float", "1.0")]


ODD_FLOATS = [-0.0, 1.0, 1e-5, 1e15, math.nan, math.inf, -math.inf, 0.1 + 0.2, None]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_a_chunk_is_stored_byte_for_byte_as_the_row_path_stores_it(fmt: Format) -> None:
    count = len(ODD_FLOATS)
    rows = page(
        id=pa.array(range(count), pa.int32()),
        x=[0.5 * n for n in range(count)],
        score=pa.array(ODD_FLOATS, pa.float64()),
        flag=[True, False, None] * 3,
        big=pa.array([2**53 + 1, -(2**63), None] * 3, pa.int64()),
        name=['a,"b"', "line\nbreak", None, "", "ü", "-0", "true", "t", "nan"],
    )
    selection = Selection(key_column="id", passthrough_columns=["score", "flag", "big", "name"])
    answer = [-0.0, 1.0, 2.0, 0.0, 1e-7, 3.0, -0.0, 1e20, 0.5]
    _, expected = row_path(rows, selection, answer)
    _, got = columnar_path(rows, selection, answer)
    stored = encode_chunk(got, fmt, "none")
    assert stored == encode_chunk(expected, fmt, "none")
    assert got.num_rows == count


@pytest.mark.parametrize(
    "answer",
    [[2**63, 1, 2], [1, "b", 2.5], [[1, 2], "x", None]],
    ids=["an integer beyond int64", "numbers and a string", "a list and a string"],
)
def test_predictions_no_arrow_column_holds_are_joined_as_the_row_path_joins_them(
    answer: list[Any],
) -> None:
    # They made an OverflowError (no clear error) or an ArrowInvalid (the model's
    # fault, exit 7) where the row path hands the output each value as answered.
    rows = page(id=[7, 3, 11], a=[0.5, 1.5, 2.5])
    selection = Selection(key_column="id")
    columnar = Joiner.of(selection, Partition(), columnar_output=True)
    assert columnar is not None
    split = columnar.split(Page(0, rows, None))
    assert isinstance(split.rows, EncodedRows), "the page went columnar"
    got = columnar.output(split, answer)
    expected = [
        {"id": key, "prediction": value} for key, value in zip([7, 3, 11], answer, strict=True)
    ]
    assert got == expected
    row_path_joiner = Joiner.of(selection, Partition(), columnar_output=True)
    assert row_path_joiner is not None
    plain = row_path_joiner.split(Page(0, list(rows), None))
    assert isinstance(plain.rows, list)
    assert row_path_joiner.output(plain, answer) == got


def test_a_page_of_several_tables_is_one_page() -> None:
    first = pa.table({"id": [1, 2], "x": [0.5, 1.5]})
    second = pa.table({"id": [3], "x": [2.5]})
    rows = ArrowRows([first, second], records_of)
    assert len(rows) == 3
    assert_same(rows, Selection(key_column="id"), [0, 1, 0])


@pytest.mark.parametrize(
    ("columns", "selection", "why"),
    [
        ({"a": [1.0, None], "b": [1.0, 2.0]}, Selection(), "a null feature"),
        ({"a": [1.0, math.nan], "b": [1.0, 2.0]}, Selection(), "a NaN feature"),
        ({"a": [1.0, math.inf], "b": [1.0, 2.0]}, Selection(), "an infinite feature"),
        ({"a": ["x", "y"], "b": [1.0, 2.0]}, Selection(), "a text feature"),
        ({"a": [True, False]}, Selection(), "a boolean feature"),
        ({"a": [[1.0, 2.0], [3.0, 4.0]]}, Selection(), "a vector feature"),
        ({"a": [1.0, 2.0]}, Selection(columns=["a", "gone"]), "a column columns names, absent"),
        ({"id": [1, None], "a": [1.0, 2.0]}, Selection(key_column="id"), "a null key"),
        ({"id": [1, 2]}, Selection(key_column="id"), "no feature column left"),
        (
            {"id": [1, 2], "note": pa.array([None, None], pa.string()), "a": [1.0, 2.0]},
            Selection(key_column="id", passthrough_columns=["note"]),
            "a carried column null on every row",
        ),
        (
            {"id": pa.array([0, 1], pa.timestamp("s")), "a": [1.0, 2.0]},
            Selection(key_column="id"),
            "a carried timestamp",
        ),
        (
            {"id": pa.array([0, 2**64 - 1], pa.uint64()), "a": [1.0, 2.0]},
            Selection(key_column="id"),
            "a carried uint64 beyond int64",
        ),
        ({"a": [1.0, 2.0]}, Selection(key_column="id"), "a key column absent"),
    ],
)
def test_pages_the_row_path_must_take(
    columns: dict[str, Any], selection: Selection, why: str
) -> None:
    assert page(**columns).columnar(RowSplitter(selection)) is None, why


def test_the_row_path_still_reads_a_page_left_to_it() -> None:
    rows = page(id=[1, None], a=[1.0, 2.0])
    assert rows.columnar(RowSplitter(Selection(key_column="id"))) is None
    assert list(rows) == [{"id": 1, "a": 1.0}, {"id": None, "a": 2.0}]
    assert rows[1] == {"id": None, "a": 2.0}


def test_an_empty_page_is_left_to_the_row_path() -> None:
    empty = pa.table({"a": pa.array([], pa.float64())})
    assert ArrowRows([empty], records_of).columnar(RowSplitter(Selection())) is None


def test_a_wrong_count_of_predictions_is_refused() -> None:
    found = page(id=[1, 2, 3], a=[1.0, 2.0, 3.0]).columnar(RowSplitter(Selection(key_column="id")))
    assert found is not None
    with pytest.raises(ValueError, match="4 prediction"):
        found[1].output([1, 2, 3, 4])


@pytest.mark.parametrize(
    ("first", "count", "step", "expected"),
    [(0, 3, 1, [0, 1, 2]), (5, 4, 3, [5, 8, 11, 14]), (7, 0, 1, []), (2, 1, 4, [2])],
)
def test_positions_count_from_first_by_step(
    first: int, count: int, step: int, expected: list[int]
) -> None:
    column = positions(first, count, step)
    assert column.type == pa.int64()
    assert column.to_pylist() == expected


def test_positions_reuse_a_count_without_sharing_values() -> None:
    assert positions(10, 3).to_pylist() == [10, 11, 12]
    assert positions(0, 3).to_pylist() == [0, 1, 2]


def test_a_constant_column_has_its_type_and_no_nulls() -> None:
    column = constant(3, 4, pa.int32())
    assert column.type == pa.int32()
    assert column.null_count == 0
    assert column.to_pylist() == [3, 3, 3, 3]
