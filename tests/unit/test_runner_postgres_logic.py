"""The postgres provider's pure parts: settings, $name binding, values, error classes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg import errors

from contract.credentials import find_inline_credentials
from runner import storage
from runner.retry import Transient
from runner.storage.base import StorageError, StorageRejected
from runner.storage.postgres import (
    PostgresProvider,
    bind_names,
    column_type,
    failure,
    output_rows,
)

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]

BASE: dict[str, Any] = {"host": "db", "database": "features", "secretRef": {"name": "pg"}}


def provider(role: str, **settings: Any) -> PostgresProvider:
    found = storage.resolve({"postgres": {**BASE, **settings}}, role, {})
    assert isinstance(found, PostgresProvider)
    return found


def test_names_become_numbered_parameters_in_order_of_first_use() -> None:
    query, names = bind_names("SELECT * FROM t WHERE a = $day AND b > $low AND c = $day;")
    assert query == "SELECT * FROM t WHERE a = $1 AND b > $2 AND c = $1"
    assert names == ["day", "low"]


@pytest.mark.parametrize(
    "text",
    [
        "SELECT '$day' AS s",
        "SELECT E'it\\'s $day' AS s",
        "SELECT 'it''s $day' AS s",
        'SELECT 1 AS "$day"',
        "SELECT 1 -- $day\n",
        "SELECT 1 /* $day /* nested $x */ still */",
        "SELECT $$ $day $$ AS s",
        "SELECT $tag$ $day $tag$ AS s",
        "SELECT a$day FROM t",
    ],
)
def test_names_inside_strings_identifiers_comments_and_dollar_quotes_stay(text: str) -> None:
    query, names = bind_names(text)
    assert names == []
    assert query == text.strip()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("SELECT * FROM t WHERE a = $1", "by name ($day), not by number ($1)"),
        ("SELECT 'open", "string is not closed"),
        ('SELECT "open', "quoted identifier is not closed"),
        ("SELECT /* open", "comment */ is not closed"),
        ("SELECT $q$ open", "dollar quote $q$ is not closed"),
        (" ; ", "query is empty"),
    ],
)
def test_queries_that_cannot_be_bound_are_refused(text: str, says: str) -> None:
    with pytest.raises(ValueError, match="query") as error:
        bind_names(text)
    assert says in str(error.value)


@pytest.mark.parametrize(
    ("role", "settings", "says"),
    [
        ("input", {}, "an input entry needs a query"),
        ("input", {"query": "SELECT 1", "table": "t"}, "table belongs to an output entry"),
        ("output", {}, "an output entry needs a table"),
        ("output", {"table": "t", "query": "SELECT 1"}, "belong to an input entry"),
        ("output", {"table": "a.b.c"}, "expected name or schema.name"),
        ("output", {"table": "bad-name"}, "expected a name of"),
        ("input", {"query": "SELECT 1", "paging": {"pageSize": 10}}, "paging.key"),
        ("input", {"query": "SELECT 1", "paging": {"pageSize": 10, "key": "a b"}}, "paging.key"),
        ("input", {"query": "SELECT 1", "sslmode": "always"}, "sslmode"),
        ("input", {"query": "SELECT 1", "password": "x"}, "password: Extra inputs"),
    ],
)
def test_wrong_entries_are_refused_before_any_io(
    role: str, settings: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValueError, match=rf"^{role}\.postgres: ") as error:
        provider(role, **settings)
    assert says in str(error.value)


def test_a_good_entry_parses_with_libpq_defaults() -> None:
    found = provider(
        "input", query="SELECT * FROM t WHERE d = $day", paging={"pageSize": 5, "key": "id"}
    )
    assert found.settings.port == 5432
    assert found.settings.sslmode == "prefer"
    assert found.paging is not None
    assert (found.paging.page_size, found.paging.key) == (5, "id")
    assert found.names == ["day"]
    assert found.where == "postgres db:5432/features"
    assert found.named_rows


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (True, "boolean"),
        (3, "bigint"),
        (1.5, "double precision"),
        ([1], "jsonb"),
        ({}, "jsonb"),
        ("x", "text"),
        (None, "text"),
    ],
)
def test_created_columns_take_the_first_values_type(value: Any, kind: str) -> None:
    assert column_type(value) == kind


def test_output_rows_carry_columns_and_encode_lists_as_json() -> None:
    assert output_rows([1.0, 2.0]) == ([], [[1.0], [2.0]])
    carried, rows = output_rows([{"id": 7, "tag": "x", "prediction": [0.1, 0.9]}])
    assert carried == ["id", "tag"]
    assert rows == [[7, "x", "[0.1,0.9]"]]


def test_a_carried_column_named_like_the_tables_own_is_refused() -> None:
    with pytest.raises(StorageRejected, match=r"\['row_index'\] would overwrite"):
        output_rows([{"row_index": 1, "prediction": 0.0}])


def test_failures_are_classified_by_sqlstate_and_connection_message() -> None:
    where = "postgres db:5432/features"
    assert isinstance(failure(where, "x", TimeoutError()), Transient)
    assert isinstance(failure(where, "x", errors.AdminShutdown("bye")), Transient)
    assert isinstance(failure(where, "x", errors.DiskFull("full")), Transient)
    assert isinstance(failure(where, "x", errors.SerializationFailure("again")), Transient)
    assert isinstance(failure(where, "x", errors.SyntaxError("bad")), StorageRejected)
    assert isinstance(failure(where, "x", errors.UndefinedTable("none")), StorageRejected)
    refused = failure(
        where,
        "connecting",
        psycopg.OperationalError('FATAL:  password authentication failed for user "u"'),
    )
    assert isinstance(refused, StorageRejected)
    assert str(refused).startswith("postgres db:5432/features: connecting: FATAL:")
    assert isinstance(
        failure(where, "x", psycopg.OperationalError("Connection refused")), Transient
    )
    other = failure(where, "x", psycopg.DataError("?"))
    assert type(other) is StorageError


def test_the_example_config_resolves_and_holds_no_credential() -> None:
    docs = list(yaml.safe_load_all((REPO / "examples" / "postgres.yaml").read_text()))
    config = next(d for d in docs if d["kind"] == "InferenceConfig")
    run = next(d for d in docs if d["kind"] == "InferenceRun")
    entries = config["spec"]["storage"]
    parameters = run["spec"]["parameters"]
    source = storage.resolve(entries["input"], "input", parameters)
    sink = storage.resolve(entries["output"], "output", parameters)
    assert isinstance(source, PostgresProvider)
    assert isinstance(sink, PostgresProvider)
    assert source.names == ["day"]
    assert storage.selection(entries["input"]) is not None
    assert find_inline_credentials(config["spec"]["storage"]) == []
