"""The ``postgres`` provider against a real PostgreSQL server (hack/postgres.py).

Every test has its own database on the session's server. Rows carry an ``id``
that is not their position, so each stored prediction is checked against its
own input row through the key, and "stored exactly once" is counted as distinct
keys in the output table. Failures are checked for their exit code, a message
naming what failed, and an output left as it was.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

import psycopg
import pytest

from contract.exitcodes import ExitCode
from hack.pki import Pki, make_pki
from hack.storage_service import IRIS_COLUMNS
from runner.storage.base import Partition, Stored
from runner.storage.postgres import APPLICATION_NAME, RETRY_EVENT, PostgresProvider, from_settings
from tests.runner.conftest import SmallDisk, World, direct_iris
from tests.runner.pg import JOB, NAMESPACE, SECRET, connection, context, contract, secrets, seed
from tests.servers import Database

HOLD_LOCK = 4242


def stored(db: Database, table: str = "predictions") -> list[tuple[Any, ...]]:
    return db.query(
        f"SELECT run_uid, shard, row_index, id, species, prediction FROM {table} ORDER BY row_index"
    )


def assert_stored_once(
    db: Database, by_id: dict[int, list[float]], table: str = "predictions"
) -> None:
    """Every input row's prediction once, beside its own key and passthrough value."""
    rows = stored(db, table)
    assert len(rows) == len(by_id) > 0
    (distinct,) = db.query(f"SELECT count(DISTINCT id) FROM {table}")[0]
    assert distinct == len(by_id)
    expected = dict(zip(by_id, direct_iris(list(by_id.values())), strict=True))
    for run_uid, _, _, key, species, prediction in rows:
        assert run_uid == JOB
        assert species == f"s-{key}"
        assert prediction == expected[int(key)]


async def test_a_paged_run_stores_every_prediction_once_beside_its_key(
    world: World, postgres: Database
) -> None:
    by_id = seed(postgres, 530)

    outcome = await world.run(contract(world.model_server.infer_url(), postgres), secrets(postgres))

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert_stored_once(postgres, by_id)
    # row_index is the row's position in key order: the smallest id is row 0.
    rows = stored(postgres)
    assert [r[2] for r in rows] == list(range(530))
    assert rows[0][3] == min(by_id)
    result = outcome.result
    assert (result["rows"], result["predictions"], result["chunks"]) == (530, 530, 6)
    assert outcome.progress is not None
    assert (outcome.progress.rows_done, outcome.progress.rows_total) == (530, 530)


async def test_parameters_are_bound_never_formatted_into_the_query(
    world: World, postgres: Database
) -> None:
    by_id = seed(postgres, 200)
    postgres.execute("CREATE TABLE notes (id bigint, note text)")
    # A parameter whose text would break (or rewrite) a query formatted with it.
    tricky = "it's'; DROP TABLE samples; --"
    postgres.execute("INSERT INTO notes VALUES (%s, %s)", [(i, tricky) for i in by_id])
    query = (
        "SELECT s.* FROM samples s JOIN notes n USING (id) "
        "WHERE s.day = $day AND n.note = $note -- $ignored in a comment"
    )
    wanted = {i: row for i, row in by_id.items() if i % 2}
    run = contract(world.model_server.infer_url(), postgres, query=query, page_size=None)
    run["parameters"] = {"day": "2024-05-01", "note": tricky}

    outcome = await world.run(run, secrets(postgres))

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert_stored_once(postgres, wanted)
    assert postgres.query("SELECT count(*) FROM samples")[0][0] == 200


async def test_numeric_columns_reach_the_model_as_numbers(world: World, postgres: Database) -> None:
    by_id = seed(postgres, 40)
    features = ", ".join(f"{c}::numeric(6, 2) AS {c}" for c in IRIS_COLUMNS)
    query = f"SELECT id, species, {features} FROM samples"
    run = contract(world.model_server.infer_url(), postgres, query=query, page_size=None)

    outcome = await world.run(run, secrets(postgres))

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert_stored_once(postgres, by_id)


async def test_a_parameter_the_run_does_not_give_is_a_contract_error(
    world: World, postgres: Database
) -> None:
    seed(postgres, 10)
    run = contract(
        world.model_server.infer_url(), postgres, query="SELECT * FROM samples WHERE day = $day"
    )

    outcome = await world.run(run, secrets(postgres))

    assert outcome.exit_code == ExitCode.BAD_CONTRACT, outcome.termination
    assert "the query uses $day, which the run's parameters do not give" in outcome.termination


async def test_shards_store_disjoint_rows_that_together_are_the_input(
    world: World, postgres: Database
) -> None:
    by_id = seed(postgres, 307)
    run = contract(world.model_server.infer_url(), postgres, page_size=40, sharding={"count": 3})

    for index in range(3):
        env = {"JOB_COMPLETION_INDEX": str(index), "pod_uid": f"pod-{index}"}
        outcome = await world.run(run, secrets(postgres), env=env)
        assert outcome.exit_code == ExitCode.DONE, outcome.termination

    assert_stored_once(postgres, by_id)
    shards = postgres.query("SELECT shard, array_agg(row_index) FROM predictions GROUP BY shard")
    assert len(shards) == 3
    for shard, positions in shards:
        assert isinstance(positions, list)
        assert positions
        assert all(p % 3 == shard for p in positions)


async def test_a_query_with_a_syntax_error_is_refused_and_nothing_is_stored(
    world: World, postgres: Database
) -> None:
    seed(postgres, 10)
    run = contract(world.model_server.infer_url(), postgres, query="SELECT * FORM samples")

    outcome = await world.run(run, secrets(postgres))

    assert outcome.exit_code == ExitCode.INPUT_REJECTED, outcome.termination
    assert outcome.termination.startswith(
        f"input: postgres 127.0.0.1:{postgres.server.port}/{postgres.name}: "
    )
    assert 'syntax error at or near "FORM"' in outcome.termination
    assert "[SQLSTATE 42601]" in outcome.termination
    assert not postgres.query("SELECT to_regclass('predictions') IS NOT NULL")[0][0]


async def test_a_table_without_the_conflict_key_is_refused_before_any_prediction(
    world: World, postgres: Database
) -> None:
    seed(postgres, 50)
    postgres.execute(
        "CREATE TABLE predictions (run_uid text, shard int, row_index bigint, id bigint, "
        "species text, prediction double precision)"
    )

    outcome = await world.run(contract(world.model_server.infer_url(), postgres), secrets(postgres))

    assert outcome.exit_code == ExitCode.OUTPUT_REJECTED, outcome.termination
    assert "table predictions has no unique key on (run_uid, shard, row_index)" in (
        outcome.termination
    )
    assert "(stored: nothing of the input; missing from row 0)" in outcome.termination
    assert postgres.query("SELECT count(*) FROM predictions")[0][0] == 0
    assert not any(e.get("event") == "inference started" for e in outcome.events())


async def test_a_column_absent_from_the_rows_names_the_row_and_the_column(
    world: World, postgres: Database
) -> None:
    seed(postgres, 50)
    run = contract(
        world.model_server.infer_url(),
        postgres,
        input_extra={"columns": ["sepal_length", "sepal_width", "petal_length", "petal_wdth"]},
    )

    outcome = await world.run(run, secrets(postgres))

    assert outcome.exit_code == ExitCode.INPUT_REJECTED, outcome.termination
    assert outcome.termination.startswith(
        "input: row 0 has no column 'petal_wdth', which columns names"
    ), outcome.termination
    assert not postgres.query("SELECT to_regclass('predictions') IS NOT NULL")[0][0]


async def test_a_column_the_query_names_but_the_table_lacks_is_refused(
    world: World, postgres: Database
) -> None:
    seed(postgres, 10)
    run = contract(world.model_server.infer_url(), postgres, query="SELECT id, colour FROM samples")

    outcome = await world.run(run, secrets(postgres))

    assert outcome.exit_code == ExitCode.INPUT_REJECTED, outcome.termination
    assert 'column "colour" does not exist' in outcome.termination


@pytest.mark.parametrize("side", ["input", "output"])
async def test_a_missing_table_is_refused_by_name_before_any_prediction(
    world: World, postgres: Database, side: str
) -> None:
    seed(postgres, 20)
    query = "SELECT * FROM no_such_samples" if side == "input" else "SELECT * FROM samples"
    run = contract(world.model_server.infer_url(), postgres, query=query)
    run["output"]["postgres"]["createTable"] = False

    outcome = await world.run(run, secrets(postgres))

    code = ExitCode.INPUT_REJECTED if side == "input" else ExitCode.OUTPUT_REJECTED
    assert outcome.exit_code == code, outcome.termination
    assert outcome.termination.startswith(f"{side}: postgres 127.0.0.1:{postgres.server.port}/")
    if side == "input":
        assert 'relation "no_such_samples" does not exist' in outcome.termination
        assert "[SQLSTATE 42P01]" in outcome.termination
    else:
        assert "table predictions does not exist (createTable: true creates it)" in (
            outcome.termination
        )
    assert not any(e.get("event") == "inference started" for e in outcome.events())
    assert not postgres.query("SELECT to_regclass('predictions') IS NOT NULL")[0][0]


async def test_an_output_table_missing_a_carried_column_is_refused(
    world: World, postgres: Database
) -> None:
    seed(postgres, 30)
    postgres.execute(
        "CREATE TABLE predictions (run_uid text, shard int, row_index bigint, id bigint, "
        "prediction double precision, PRIMARY KEY (run_uid, shard, row_index))"
    )

    outcome = await world.run(contract(world.model_server.infer_url(), postgres), secrets(postgres))

    assert outcome.exit_code == ExitCode.OUTPUT_REJECTED, outcome.termination
    assert "table predictions has no column 'species'" in outcome.termination
    assert postgres.query("SELECT count(*) FROM predictions")[0][0] == 0


@pytest.mark.parametrize("role", ["input", "output"])
async def test_a_wrong_password_is_a_clear_error_and_shows_nowhere(
    world: World, postgres: Database, role: str
) -> None:
    seed(postgres, 10)
    wrong = "Wr0ng-pg-secret-5fd1"
    given = secrets(postgres)
    run = contract(world.model_server.infer_url(), postgres)
    # The other side reads another Secret holding the right password.
    other = "output" if role == "input" else "input"
    run[other]["postgres"]["secretRef"]["name"] = "right"
    given.secrets[(NAMESPACE, "right")] = dict(given.secrets[(NAMESPACE, SECRET)])
    given.secrets[(NAMESPACE, SECRET)]["password"] = wrong

    outcome = await world.run(run, given)

    # Refused credentials are permanent on either side: 6 for the input, 8 for the
    # output (checked before any prediction), as --check says too.
    code = ExitCode.INPUT_REJECTED if role == "input" else ExitCode.OUTPUT_REJECTED
    assert outcome.exit_code == code, outcome.termination
    assert outcome.termination.startswith(f"{role}: postgres 127.0.0.1:")
    assert 'password authentication failed for user "postgres"' in outcome.termination
    assert outcome.stdout
    for text in (outcome.termination, outcome.stdout, outcome.stderr):
        assert wrong not in text
        assert postgres.server.password not in text


@pytest.mark.parametrize("role", ["input", "output"])
async def test_a_secret_without_a_password_is_refused_at_once(
    world: World, postgres: Database, role: str
) -> None:
    seed(postgres, 10)
    given = secrets(postgres)
    run = contract(world.model_server.infer_url(), postgres)
    other = "output" if role == "input" else "input"
    run[other]["postgres"]["secretRef"]["name"] = "right"
    given.secrets[(NAMESPACE, "right")] = dict(given.secrets[(NAMESPACE, SECRET)])
    del given.secrets[(NAMESPACE, SECRET)]["password"]

    outcome = await world.run(run, given)

    # As for an S3 Secret without its keys: no retry brings the key back, so
    # the Job must not spend its attempts on it (6 input, 8 output).
    code = ExitCode.INPUT_REJECTED if role == "input" else ExitCode.OUTPUT_REJECTED
    assert outcome.exit_code == code, outcome.termination
    assert f"Secret {NAMESPACE}/{SECRET} has no password" in outcome.termination
    assert postgres.server.password not in outcome.stdout + outcome.stderr


@contextmanager
def writes_held_after(db: Database, rows: int) -> Iterator[psycopg.Connection[Any]]:
    """Inserts into ``predictions`` wait, once ``rows`` are stored, until this lets go.

    A statement trigger takes a transaction-level advisory lock that this
    session holds: a write after the first ``rows`` stalls in the database,
    exactly where a runner would be killed or a server restarted.
    """
    db.execute(
        "CREATE TABLE predictions (run_uid text NOT NULL, shard int NOT NULL, "
        "row_index bigint NOT NULL, pod_uid text, id bigint, species text, "
        "prediction double precision, PRIMARY KEY (run_uid, shard, row_index))"
    )
    db.execute(
        "CREATE FUNCTION hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        f"IF (SELECT count(*) FROM predictions) >= {rows} THEN "
        f"PERFORM pg_advisory_xact_lock({HOLD_LOCK}); END IF; RETURN NULL; END $$"
    )
    db.execute(
        "CREATE TRIGGER hold BEFORE INSERT ON predictions "
        "FOR EACH STATEMENT EXECUTE FUNCTION hold()"
    )
    holder = db.server.connect(db.name)
    holder.execute(f"SELECT pg_advisory_lock({HOLD_LOCK})")
    try:
        yield holder
    finally:
        holder.close()


async def wait_for_held_write(db: Database, within: float = 120.0) -> None:
    """Until a runner's insert waits on the hold (or fail after ``within`` seconds)."""
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
        f"'{APPLICATION_NAME}' AND wait_event_type = 'Lock' AND wait_event = 'advisory' "
        "AND datname = current_database()"
    )
    async with asyncio.timeout(within):
        while True:
            if (await asyncio.to_thread(db.query, query))[0][0]:
                return
            await asyncio.sleep(0.05)


async def test_a_server_restarted_mid_run_is_retried_and_every_row_stored_once(
    world: World, postgres: Database
) -> None:
    by_id = seed(postgres, 900)
    run = contract(world.model_server.infer_url(), postgres)

    with writes_held_after(postgres, 300):
        task = asyncio.create_task(world.run(run, secrets(postgres)))
        await wait_for_held_write(postgres)
        # A fast shutdown cuts every session, the runner's stalled write among them.
        await asyncio.to_thread(postgres.server.restart)
    outcome = await task

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert_stored_once(postgres, by_id)
    retries = [e for e in outcome.events() if e.get("event") == RETRY_EVENT]
    assert retries, outcome.stdout[-3000:]
    assert all(postgres.server.password not in str(e) for e in retries)


async def test_a_full_disk_is_retried_until_there_is_room_and_every_row_stored_once(
    world: World, postgres: Database, small_disk: SmallDisk
) -> None:
    """The output table lives on a 64 KiB filesystem: inserts fail with "No space left".

    PostgreSQL says disk full (SQLSTATE 53100); the runner retries it with
    backoff. Once a retry has failed the test grows the filesystem: the run goes
    on from the chunk that failed and stores every row once.
    """
    by_id = seed(postgres, 1500)
    space = f"small_{postgres.name[-8:]}"
    location = postgres.server.root / space
    owner = pwd.getpwnam("nobody") if os.geteuid() == 0 else pwd.getpwuid(os.geteuid())
    small_disk.mount(location, "64k", owner=(owner.pw_uid, owner.pw_gid))
    postgres.execute(f"CREATE TABLESPACE {space} LOCATION '{location}'")
    try:
        postgres.execute(
            "CREATE TABLE predictions (run_uid text NOT NULL, shard int NOT NULL, "
            "row_index bigint NOT NULL, pod_uid text, id bigint, species text, "
            "prediction double precision, PRIMARY KEY (run_uid, shard, row_index)) "
            f"TABLESPACE {space}"
        )
        log_start = postgres.server.log.stat().st_size
        task = asyncio.create_task(
            world.run(contract(world.model_server.infer_url(), postgres), secrets(postgres))
        )
        async with asyncio.timeout(180):
            while b"No space left on device" not in postgres.server.log.read_bytes()[log_start:]:
                assert not task.done(), (await task).termination
                await asyncio.sleep(0.1)
        stored_when_full = int(str(postgres.query("SELECT count(*) FROM predictions")[0][0]))
        small_disk.resize(location, "16m")
        outcome = await task

        assert outcome.exit_code == ExitCode.DONE, outcome.termination
        assert 0 < stored_when_full < len(by_id)
        assert_stored_once(postgres, by_id)
        retries = [e for e in outcome.events() if e.get("event") == RETRY_EVENT]
        assert retries, outcome.stdout[-3000:]
        said = str(retries[0])
        assert "could not extend file" in said, said
        assert "No space left on device" in said, said
        assert "[SQLSTATE 53100]" in said, said
    finally:
        postgres.execute("DROP TABLE IF EXISTS predictions")
        postgres.execute(f"DROP TABLESPACE IF EXISTS {space}")


async def test_a_runner_killed_mid_write_is_resumed_and_every_row_stored_once(
    world: World, postgres: Database
) -> None:
    by_id = seed(postgres, 1000)
    run = contract(world.model_server.infer_url(), postgres)

    with writes_held_after(postgres, 400):
        process = await world.start_killable(run, secrets(postgres))
        try:
            await wait_for_held_write(postgres)
        finally:
            process.send_signal(signal.SIGKILL)
            await process.wait()
    assert process.returncode == -signal.SIGKILL
    # The held chunk was never committed: what is stored is the first 4 pages.
    stored_before = postgres.query("SELECT count(*) FROM predictions")[0][0]
    assert stored_before == 400
    postgres.execute("DROP TRIGGER hold ON predictions")

    outcome = await world.run(run, secrets(postgres), env={"pod_uid": "pod-retry"})

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert_stored_once(postgres, by_id)
    result = outcome.result
    assert (result["resumedRows"], result["rows"], result["duplicates"]) == (400, 1000, 0)
    pods: dict[Any, Any] = dict(
        postgres.query("SELECT pod_uid, count(*) FROM predictions GROUP BY pod_uid")
    )
    assert pods == {"pod-killed": 400, "pod-retry": 600}


async def test_createtable_types_follow_the_first_values(world: World, postgres: Database) -> None:
    seed(postgres, 20)
    outcome = await world.run(contract(world.model_server.infer_url(), postgres), secrets(postgres))
    assert outcome.exit_code == ExitCode.DONE, outcome.termination

    types: dict[Any, Any] = dict(
        postgres.query(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_name = 'predictions'"
        )
    )
    assert types == {
        "run_uid": "text",
        "shard": "integer",
        "row_index": "bigint",
        "pod_uid": "text",
        "id": "bigint",
        "species": "text",
        # The iris classifier answers class numbers: JSON integers.
        "prediction": "bigint",
        "stored_at": "timestamp with time zone",
    }


async def test_shards_creating_the_table_at_once_each_store_their_rows(
    postgres: Database,
) -> None:
    """Two shards start together on a table that does not exist yet: both store.

    PostgreSQL's concurrent ``CREATE TABLE IF NOT EXISTS`` lets the loser fail on
    the catalog's unique index, or see the winner's table before its columns;
    each round is a new table, so the race gets many chances.
    """
    rows = [{"id": 1, "prediction": 0.5}, {"id": 2, "prediction": 1.5}]

    async def shard(table: str, index: int) -> Stored:
        ctx = context(postgres, pod_uid=f"pod-{index}")
        output = connection(postgres, table=table, createTable=True)
        provider = from_settings(output, "output", {})
        await provider.prepare(ctx)
        try:
            return await provider.store_keyed(ctx, 0, rows, Partition(index, 2))
        finally:
            await provider.close()

    for round_ in range(20):
        table = f"raced_{round_}"
        both = await asyncio.gather(shard(table, 0), shard(table, 1), return_exceptions=True)
        assert list(both) == [Stored(2, 0), Stored(2, 0)], (table, both)
        assert postgres.query(f"SELECT count(*) FROM {table}") == [(4,)]


class CatalogReads:
    """Counts the output's queries of the table's columns, on one provider's connection."""

    COLUMNS_QUERY = "LEFT JOIN pg_attribute a ON a.attrelid = c.oid"

    def __init__(self) -> None:
        self.statements: list[str] = []

    def watch(self, provider: PostgresProvider) -> None:
        seen = self.statements

        # The provider's cursors take $1 placeholders (raw), as counted here.
        class Counting(psycopg.AsyncRawCursor[Any]):
            async def execute(self, query: Any, params: Any = None, **more: Any) -> Self:
                seen.append(query if isinstance(query, str) else query.as_string(self.connection))
                return await super().execute(query, params, **more)

        assert provider._connection is not None, "prepare() connects"
        assert provider._connection.cursor_factory is psycopg.AsyncRawCursor
        provider._connection.cursor_factory = Counting

    def take(self) -> int:
        """The column reads since the last take (and that queries were seen at all)."""
        assert self.statements, "no query went through the counting cursor"
        count = sum(self.COLUMNS_QUERY in statement for statement in self.statements)
        self.statements.clear()
        return count


async def test_the_output_reads_the_tables_columns_once_per_check(postgres: Database) -> None:
    """Resume, the first write and the probe each read the table's columns once.

    The first write into a table it creates reads them once more, after the
    create (another shard's table may have won).
    """
    rows = [{"id": 1, "prediction": 0.5}, {"id": 2, "prediction": 1.5}]
    ctx = context(postgres)
    output = connection(postgres, table="predictions", createTable=True)
    reads, resumed = [], []
    for _ in ("missing", "present"):
        provider = from_settings(output, "output", {})
        await provider.prepare(ctx)
        counter = CatalogReads()
        counter.watch(provider)
        try:
            resumed.append(await provider.stored_next(ctx, Partition()))
            reads.append(counter.take())
            await provider.store_keyed(ctx, 0, rows, Partition())
            reads.append(counter.take())
            await provider.probe(ctx)
            reads.append(counter.take())
        finally:
            await provider.close()
    assert resumed == [0, 2]
    assert reads == [1, 2, 1, 1, 1, 1]
    assert postgres.query("SELECT count(*) FROM predictions") == [(2,)]


@pytest.fixture
def other_pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "other-pki")


@pytest.mark.parametrize("ca", ["the-servers", "none", "another"])
async def test_tls_verify_full_trusts_only_the_secrets_ca(
    world: World, postgres: Database, postgres_pki: Pki, other_pki: Pki, ca: str
) -> None:
    by_id = seed(postgres, 60)
    given = secrets(postgres)
    if ca != "none":
        pki = postgres_pki if ca == "the-servers" else other_pki
        given.secrets[(NAMESPACE, SECRET)]["ca"] = pki.ca_cert.read_text()
    run = contract(world.model_server.infer_url(), postgres)
    for entry in (run["input"]["postgres"], run["output"]["postgres"]):
        entry["sslmode"] = "verify-full"
    leftovers = set(Path(tempfile.gettempdir()).glob("runner-pg-ca-*"))

    outcome = await world.run(run, given)

    # The CA file libpq reads is removed when the run ends.
    assert set(Path(tempfile.gettempdir()).glob("runner-pg-ca-*")) == leftovers
    if ca == "the-servers":
        assert outcome.exit_code == ExitCode.DONE, outcome.termination
        assert_stored_once(postgres, by_id)
        return
    assert outcome.exit_code == ExitCode.INPUT_REJECTED, outcome.termination
    assert outcome.termination.startswith(f"input: postgres 127.0.0.1:{postgres.server.port}/")
    # Another CA of the same name: the server's certificate fails its signature check.
    reason = "root certificate file" if ca == "none" else "SSL error"
    assert reason in outcome.termination
