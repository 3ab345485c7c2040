"""Joining predictions to their input through the existing providers (runner/join.py).

The storage look-alike answers rows as objects (``rows_as=objects``) with an ``id``
that is not the row's position and a column the model must not see; the runner
picks the feature columns, sends them, and stores each prediction beside its
row's key and passthrough column. Real servers only: KServe's model server and
the look-alike.
"""

from __future__ import annotations

from typing import Any

import pytest

from contract.exitcodes import ExitCode
from hack.storage_service import IRIS_COLUMNS
from tests.runner.conftest import World, direct_iris, iris_contract, random_iris_rows
from tests.runner.test_runner_streaming import http_secrets, paged_http_contract

COLUMNS = ("id", "species_hint", *IRIS_COLUMNS)
JOIN = {"columns": list(IRIS_COLUMNS), "keyColumn": "id", "passthroughColumns": ["species_hint"]}


def seed_people(world: World, table: str, count: int) -> dict[int, list[float]]:
    """``count`` iris rows keyed by ids that run backwards from 5000, a text column first."""
    features = random_iris_rows(count, seed=5)
    ids = [5000 - 7 * i for i in range(count)]
    world.storage.seed_table(
        table, COLUMNS, [(i, f"hint-{i}", *row) for i, row in zip(ids, features, strict=True)]
    )
    return dict(zip(ids, features, strict=True))


def assert_joined(stored: list[Any], by_id: dict[int, list[float]]) -> None:
    """Every input row's prediction once, beside its own key and passthrough column."""
    assert len(stored) == len(by_id) > 0
    ids = [row["id"] for row in stored]
    assert sorted(ids) == sorted(by_id)
    expected = dict(zip(by_id, direct_iris(list(by_id.values())), strict=True))
    for row in stored:
        assert set(row) == {"id", "species_hint", "prediction"}
        assert row["species_hint"] == f"hint-{row['id']}"
        assert row["prediction"] == expected[row["id"]]


async def test_krateo_stores_each_prediction_beside_its_key(world: World) -> None:
    by_id = seed_people(world, "people", 120)
    contract = iris_contract(world.model_server.infer_url(), input_table="people")
    contract["input"]["krateo"].update(JOIN)
    contract["parameters"]["rows_as"] = "objects"

    outcome = await world.run(contract)

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert outcome.result["predictions"] == 120
    assert_joined([value for _, value in world.storage.stored_values("iris_predictions")], by_id)


async def test_a_paged_sharded_http_run_joins_every_row_of_every_shard(world: World) -> None:
    by_id = seed_people(world, "big", 230)
    contract = paged_http_contract(world.model_server.infer_url(), 50, sharding={"count": 2})
    contract["input"]["http"].update(JOIN)
    contract["parameters"] = {"rows_as": "objects"}

    for index in range(2):
        outcome = await world.run(
            contract,
            http_secrets(world.storage.url),
            env={
                "JOB_COMPLETION_INDEX": str(index),
                "pod_uid": f"pod-{index}",
            },
        )
        assert outcome.exit_code == ExitCode.DONE, outcome.termination

    assert_joined([value for _, value in world.storage.stored_values("out")], by_id)


@pytest.mark.parametrize("paged", [False, True])
async def test_a_column_absent_from_a_row_is_refused_naming_the_row_and_column(
    world: World, paged: bool
) -> None:
    seed_people(world, "big", 30)
    contract = paged_http_contract(world.model_server.infer_url(), 10)
    if not paged:
        del contract["input"]["http"]["paging"]
        contract["output"]["http"].pop("resumePath")
    contract["input"]["http"].update({**JOIN, "columns": [*IRIS_COLUMNS[:3], "petal_widht"]})
    contract["parameters"] = {"rows_as": "objects"}

    outcome = await world.run(contract, http_secrets(world.storage.url))

    assert outcome.exit_code == ExitCode.INPUT_REJECTED, outcome.termination
    assert outcome.termination.startswith(
        "input: row 0 has no column 'petal_widht', which columns names"
    ), outcome.termination
    assert "'petal_width'" in outcome.termination
    assert not world.storage.has_table("out")


async def test_rows_without_named_columns_are_refused_when_join_keys_are_given(
    world: World,
) -> None:
    world.seed_random_iris("big", 20)
    contract = paged_http_contract(world.model_server.infer_url(), 10)
    contract["input"]["http"]["keyColumn"] = "id"

    outcome = await world.run(contract, http_secrets(world.storage.url))

    assert outcome.exit_code == ExitCode.INPUT_REJECTED, outcome.termination
    assert "row 0 is a list of values, not an object with named columns" in outcome.termination
    assert not world.storage.has_table("out")
