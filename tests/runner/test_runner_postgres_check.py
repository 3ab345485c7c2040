"""``python -m runner --check`` of a config whose storage is PostgreSQL (a real server).

A check connects, ``PREPARE``s the input query and looks at the output table; it
never runs the query nor writes. The query below divides by zero in every row,
which only running it would reveal: a check that passes proves it read nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from contract.exitcodes import ExitCode
from runner.storage.postgres import APPLICATION_NAME
from tests.runner.conftest import World
from tests.runner.pg import contract, secrets, seed
from tests.servers import Database

# Parses and plans; fails with division_by_zero as soon as a row is read.
EXPLOSIVE = "SELECT *, 1 / (sepal_length - sepal_length) AS boom FROM samples WHERE day = $day"


def config(model_url: str, db: Database, **extra: Any) -> dict[str, Any]:
    """What the controller mounts for a check: a run's contract without parameters."""
    checked = contract(model_url, db, query=EXPLOSIVE, **extra)
    checked["jobId"] = "5d0c7a2e-config-uid"
    return checked


def storage_step(outcome: Any) -> dict[str, Any]:
    steps = [e for e in outcome.events() if e.get("step") == "storage"]
    assert len(steps) == 1, outcome.stdout
    step: dict[str, Any] = steps[0]
    return step


@pytest.mark.parametrize("table", ["absent", "present"])
async def test_a_good_config_passes_reading_and_writing_nothing(
    world: World, postgres: Database, table: str
) -> None:
    seed(postgres, 20)
    if table == "present":
        postgres.execute(
            "CREATE TABLE predictions (run_uid text, shard int, row_index bigint, id bigint, "
            "species text, prediction bigint, PRIMARY KEY (run_uid, shard, row_index))"
        )

    outcome = await world.check(config(world.model_server.infer_url(), postgres), secrets(postgres))

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert outcome.result["check"] == "ok"
    seen = storage_step(outcome)
    where = f"postgres 127.0.0.1:{postgres.server.port}/{postgres.name}"
    assert seen["input"] == f"{where}: the query parses (1 parameter(s))"
    if table == "absent":
        assert seen["output"] == f"{where}: table predictions is missing and may be created"
        assert not postgres.query("SELECT to_regclass('predictions') IS NOT NULL")[0][0]
    else:
        assert seen["output"] == f"{where}: table predictions has the conflict key"
        assert postgres.query("SELECT count(*) FROM predictions")[0][0] == 0
    # No session left behind: the check closed its connection (a backend may take a
    # moment to go once its client said goodbye; one left open never goes).
    await wait_for_no_session(postgres)


async def wait_for_no_session(db: Database, within: float = 30.0) -> None:
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
        f"'{APPLICATION_NAME}' AND datname = current_database()"
    )
    async with asyncio.timeout(within):
        while True:
            if not (await asyncio.to_thread(db.query, query))[0][0]:
                return
            await asyncio.sleep(0.1)


async def test_a_query_that_does_not_parse_exits_6(world: World, postgres: Database) -> None:
    seed(postgres, 5)
    checked = config(world.model_server.infer_url(), postgres)
    checked["input"]["postgres"]["query"] = "SELECT * FROM samples WHERE day = $day ORDER"

    outcome = await world.check(checked, secrets(postgres))

    assert outcome.exit_code == ExitCode.INPUT_REJECTED, outcome.termination
    assert outcome.termination.startswith("input: postgres 127.0.0.1:")
    assert "preparing the query: syntax error at end of input" in outcome.termination


async def test_a_paging_key_the_query_lacks_exits_6(world: World, postgres: Database) -> None:
    seed(postgres, 5)
    checked = config(world.model_server.infer_url(), postgres)
    checked["input"]["postgres"]["paging"]["key"] = "uid"

    outcome = await world.check(checked, secrets(postgres))

    assert outcome.exit_code == ExitCode.INPUT_REJECTED, outcome.termination
    assert "preparing the paged query: column input.uid does not exist" in outcome.termination


async def test_a_table_without_the_conflict_key_exits_8(world: World, postgres: Database) -> None:
    seed(postgres, 5)
    postgres.execute(
        "CREATE TABLE predictions (run_uid text, shard int, row_index bigint, prediction real)"
    )

    outcome = await world.check(config(world.model_server.infer_url(), postgres), secrets(postgres))

    assert outcome.exit_code == ExitCode.OUTPUT_REJECTED, outcome.termination
    assert "no unique key on (run_uid, shard, row_index)" in outcome.termination


async def test_a_missing_table_without_createtable_exits_8(
    world: World, postgres: Database
) -> None:
    seed(postgres, 5)
    checked = config(world.model_server.infer_url(), postgres)
    checked["output"]["postgres"]["createTable"] = False

    outcome = await world.check(checked, secrets(postgres))

    assert outcome.exit_code == ExitCode.OUTPUT_REJECTED, outcome.termination
    assert "table predictions does not exist (createTable: true creates it)" in outcome.termination


async def test_a_wrong_password_exits_6_and_shows_nowhere(world: World, postgres: Database) -> None:
    seed(postgres, 5)
    wrong = "n0t-the-pg-password-91c"

    outcome = await world.check(
        config(world.model_server.infer_url(), postgres), secrets(postgres, wrong)
    )

    assert outcome.exit_code == ExitCode.INPUT_REJECTED, outcome.termination
    assert "password authentication failed" in outcome.termination
    assert outcome.stdout
    for text in (outcome.termination, outcome.stdout, outcome.stderr):
        assert wrong not in text
