"""Postgres pages and chunks kept columnar give what the row path gives, value for value.

A streaming run reads a ``postgres`` page as CSV the server writes and Arrow
parses, and writes a columnar page's output as CSV Arrow writes
(:mod:`runner.storage._pgcolumnar`). Each test reads or writes the same data
both ways against the real server and compares: every type the columnar path
parses, the ones it carries as text (dates, uuids, json, arrays, ``char(n)``),
nulls, quotes, newlines and the floats that are easy to get wrong.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import orjson
import pyarrow as pa
import pytest

from runner.join import RowSplitter, Selection
from runner.storage._columnar import ArrowRows
from runner.storage.base import Partition, StorageContext
from runner.storage.postgres import PostgresProvider, from_settings
from tests.runner.pg import connection, context
from tests.servers import Database

TEXTS = ['a "quoted", comma', "line\nbreak\r\n", "back\\slash", "", "ünï ☃", "'single'", None]
FLOATS = [0.1 + 0.2, -0.0, 1e-300, 1.7976931348623157e308, math.nan, math.inf, -math.inf, None]


def weird_table(db: Database, count: int = 23) -> None:
    db.execute(
        "CREATE TABLE weird (id bigint PRIMARY KEY, i2 smallint, i4 integer, f4 real, "
        "f8 double precision, num numeric, b boolean, t text, v varchar(20), c char(5), "
        "d date, ts timestamptz, u uuid, j jsonb, arr integer[])"
    )
    rows = []
    for n in range(count):
        text = TEXTS[n % len(TEXTS)]
        rows.append(
            (
                1000 - 3 * n,
                None if n % 5 == 4 else n - 7,
                n * 1000 if n % 6 else None,
                1.1 * n if n % 4 else None,
                FLOATS[n % len(FLOATS)],
                [Decimal("12345678901234567890.125"), Decimal("NaN"), None, Decimal(n)][n % 4],
                [True, False, None][n % 3],
                text,
                None if text is None else text[:20],
                None if n % 3 == 0 else "ab",
                None if n % 4 == 0 else f"2024-05-{n % 28 + 1:02d}",
                None if n % 5 == 0 else f"2024-05-01 12:00:{n % 60:02d}+02",
                None if n % 2 else f"12345678-1234-5678-1234-{n:012d}",
                None if n % 3 == 1 else '{"k": [1, "x\\"y"], "n": null}',
                None if n % 4 == 2 else [n, None, 3],
            )
        )
    db.execute(
        "INSERT INTO weird VALUES (" + ", ".join(["%s"] * 15) + ")",
        rows,
    )


def row_path(provider: PostgresProvider) -> PostgresProvider:
    # The provider as it reads a query whose columns cannot travel columnar.
    provider._described = True
    provider._layout = None
    return provider


def comparable(value: Any) -> Any:
    """Floats by repr (NaN equals NaN, -0.0 differs from 0.0), containers inside out."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [comparable(v) for v in value]
    return value


def typed(value: Any) -> Any:
    """A value with its type and sign: ``1`` differs from ``1.0``, ``-0.0`` from ``0.0``."""
    if isinstance(value, list | tuple):
        return [typed(v) for v in value]
    return (type(value).__name__, repr(value))


async def read_all(
    provider: PostgresProvider, ctx: StorageContext, part: Partition, page_size: int
) -> tuple[list[Any], list[type]]:
    await provider.prepare(ctx)
    rows: list[Any] = []
    kinds: list[type] = []
    offset = 0
    try:
        while True:
            page = await provider.read_page(ctx, offset, page_size, part)
            if page.rows:
                kinds.append(type(page.rows))
            rows.extend(list(page.rows))
            offset += len(page.rows)
            if len(page.rows) < page_size:
                return rows, kinds
    finally:
        await provider.close()


@pytest.mark.parametrize("shards", [1, 3])
async def test_pages_read_columnar_equal_the_row_paths(postgres: Database, shards: int) -> None:
    weird_table(postgres)
    query = "SELECT * FROM weird WHERE id > $low"
    entry = connection(postgres, query=query, paging={"pageSize": 4, "key": "id"})
    for index in range(shards):
        part = Partition(index, shards)
        ctx = context(postgres, parameters={"low": "0"})
        columnar, kinds = await read_all(from_settings(entry, "input", {}), ctx, part, 4)
        rows, row_kinds = await read_all(row_path(from_settings(entry, "input", {})), ctx, part, 4)
        assert rows, "the row path read nothing"
        assert set(kinds) == {ArrowRows}, kinds
        assert set(row_kinds) == {list}, row_kinds
        assert comparable(columnar) == comparable(rows)
        assert [list(r) for r in columnar] == [list(r) for r in rows]  # column order too


async def test_the_model_gets_the_row_paths_numbers_from_the_servers_text(
    postgres: Database,
) -> None:
    postgres.execute(
        "CREATE TABLE numbers (id bigint PRIMARY KEY, i2 smallint, i4 integer, f4 real, "
        "f8 double precision, num numeric)"
    )
    values = [0.1 + 0.2, -0.0, 1e-300, 1.7976931348623157e308, 5.0, 1e20, 1e-5, 2.5e-7]
    postgres.execute(
        "INSERT INTO numbers VALUES (%s, %s, %s, %s, %s, %s)",
        [(n, n - 3, n * 100_000, 1.1 * n, value, f"{n}.10") for n, value in enumerate(values)],
    )
    paging = {"pageSize": 50, "key": "id"}
    entry = connection(postgres, query="SELECT * FROM numbers", paging=paging)
    columns = ["i2", "i4", "f4", "f8", "num"]
    rows, _ = await read_all(
        row_path(from_settings(entry, "input", {})), context(postgres), Partition(), 50
    )
    provider = from_settings(entry, "input", {})
    ctx = context(postgres)
    await provider.prepare(ctx)
    try:
        page = await provider.read_page(ctx, 0, 50, Partition())
    finally:
        await provider.close()
    assert isinstance(page.rows, ArrowRows)
    assert set(page.rows.texts) >= {"i2", "i4", "f4", "f8"}  # the server's text, kept
    split = page.rows.columnar(RowSplitter(Selection(columns=columns, key_column="id")))
    assert split is not None
    features, _ = split
    sent = orjson.loads(features.json())
    expected = [[row[name] for name in columns] for row in rows]
    assert len(sent) == len(values)
    # Of the same types and signs: the server writes 5.0 as "5" and -0.0 as "-0",
    # JSON integers, which the columnar path sends as 5.0 and -0.0.
    assert typed(sent) == typed(expected)
    assert typed(sent[1])[3] == ("float", "-0.0")


async def test_an_empty_query_is_an_empty_page(postgres: Database) -> None:
    weird_table(postgres)
    entry = connection(
        postgres, query="SELECT * FROM weird WHERE id < 0", paging={"pageSize": 4, "key": "id"}
    )
    rows, kinds = await read_all(
        from_settings(entry, "input", {}), context(postgres), Partition(), 4
    )
    assert rows == []
    assert kinds == []


async def test_a_query_with_two_columns_of_one_name_is_read_by_the_row_path(
    postgres: Database,
) -> None:
    weird_table(postgres, 5)
    entry = connection(
        postgres,
        query="SELECT w.id, w.i4 AS x, w.f8 AS x FROM weird w",
        paging={"pageSize": 4, "key": "id"},
    )
    rows, kinds = await read_all(
        from_settings(entry, "input", {}), context(postgres), Partition(), 4
    )
    assert set(kinds) == {list}
    assert len(rows) == 5


def stored(db: Database, table: str) -> list[Any]:
    found = db.query(f"SELECT * FROM {table} ORDER BY shard, row_index")
    return [comparable([v for v in row if not hasattr(v, "tzinfo")]) for row in found]


async def store_both(db: Database, output: pa.Table) -> tuple[list[Any], list[Any]]:
    part = Partition(1, 3)
    ctx = context(db)
    for name, chunk in (("from_table", output), ("from_rows", output.to_pylist())):
        provider = from_settings(connection(db, table=name, createTable=True), "output", {})
        await provider.prepare(ctx)
        try:
            assert await provider.stored_next(ctx, part) == 0
            first = await provider.store_keyed(ctx, 4, chunk, part)
            again = await provider.store_keyed(ctx, 4, chunk, part)
        finally:
            await provider.close()
        assert (first.stored, first.duplicates) == (output.num_rows, 0)
        assert (again.stored, again.duplicates) == (0, output.num_rows)
    return stored(db, "from_table"), stored(db, "from_rows")


async def test_a_columnar_chunk_is_stored_as_its_rows_would_be(postgres: Database) -> None:
    floats = [f for f in FLOATS if f is None or math.isfinite(f)]
    count = 14
    output = pa.table(
        {
            "id": pa.array([1000 - 3 * n for n in range(count)], pa.int64()),
            "name": pa.array([TEXTS[n % len(TEXTS)] for n in range(count)], pa.string()),
            "score": pa.array([floats[n % len(floats)] for n in range(count)], pa.float64()),
            "flag": pa.array([[True, False, None][n % 3] for n in range(count)], pa.bool_()),
            "prediction": pa.array([n % 3 for n in range(count)], pa.int64()),
        }
    )
    from_table, from_rows = await store_both(postgres, output)
    assert len(from_table) == count
    assert from_table == from_rows
    columns = postgres.query(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_name = 'from_table' ORDER BY ordinal_position"
    )
    assert ("name", "text") in columns
    assert ("score", "double precision") in columns


async def test_a_chunk_of_lists_is_stored_by_the_row_path(postgres: Database) -> None:
    output = pa.table(
        {
            "id": pa.array([7, 8, 9], pa.int64()),
            "prediction": pa.array([[0.25, 0.75], [1.0, 0.0], [0.5, 0.5]]),
        }
    )
    from_table, from_rows = await store_both(postgres, output)
    assert len(from_table) == 3
    assert from_table == from_rows


def stored_texts(db: Database, table: str, columns: list[str]) -> list[tuple[object, ...]]:
    """Each stored row's columns as the server writes them (``::text``): numeric's scale too."""
    listed = ", ".join(f"{name}::text" for name in columns)
    return db.query(f"SELECT row_index, {listed} FROM {table} ORDER BY shard, row_index")


def text_tables(db: Database, columns: str) -> None:
    for name in ("from_table", "from_rows"):
        db.execute(
            f"CREATE TABLE {name} (run_uid text, shard integer, row_index bigint, {columns}, "
            "PRIMARY KEY (run_uid, shard, row_index))"
        )


ODD_FLOATS: list[float | None] = [-0.0, 1.0, 1e-5, 1e-7, 1e10, 1e15, 1e16, 0.1 + 0.2]
ODD_FLOATS += [math.nan, math.inf, -math.inf, 2.5, None]


async def test_floats_into_text_and_numeric_columns_are_stored_as_the_row_path_stores_them(
    postgres: Database,
) -> None:
    # Arrow's CSV wrote -0.0 as "-0", 1.0 as "1", 1e-05 as "0.00001": other text in
    # a text column, another scale in a numeric one, than the row path's COPY.
    columns = ["as_text", "as_numeric", "as_float", "prediction"]
    text_tables(
        postgres, "as_text text, as_numeric numeric, as_float double precision, prediction text"
    )
    floats = pa.array(ODD_FLOATS, pa.float64())
    output = pa.table({"as_text": floats, "as_numeric": floats, "as_float": floats})
    output = output.append_column("prediction", floats)
    await store_both(postgres, output)
    from_table = stored_texts(postgres, "from_table", columns)
    from_rows = stored_texts(postgres, "from_rows", columns)
    assert len(from_rows) == len(ODD_FLOATS)
    assert from_table == from_rows
    # The row path's spelling, Python's: the float and its sign are kept.
    assert from_rows[0][1:] == ("-0.0", "0.0", "-0", "-0.0")
    assert from_rows[2][1] == "1e-05"


async def test_booleans_into_text_and_jsonb_columns_are_stored_as_the_row_path_stores_them(
    postgres: Database,
) -> None:
    # The row path's COPY wrote t/f (psycopg's), which a text column kept as "t" and
    # a jsonb one refused; the columnar path's CSV writes true/false.
    columns = ["as_text", "as_json", "as_bool", "prediction"]
    text_tables(postgres, "as_text text, as_json jsonb, as_bool boolean, prediction text")
    flags = pa.array([True, False, None, True, False])
    output = pa.table({"as_text": flags, "as_json": flags, "as_bool": flags, "prediction": flags})
    await store_both(postgres, output)
    from_table = stored_texts(postgres, "from_table", columns)
    from_rows = stored_texts(postgres, "from_rows", columns)
    assert len(from_rows) == 5
    assert from_table == from_rows
    # What PostgreSQL gives for a boolean cast to text.
    assert from_rows[0][1:] == ("true", "true", "true", "true")
    assert from_rows[2][1:] == (None, None, None, None)
