"""Iris end to end: storage -> KServe's model server -> storage, v2 and v1."""

from __future__ import annotations

import pytest

from contract.exitcodes import ExitCode
from tests.runner.conftest import (
    World,
    direct_iris,
    iris_contract,
)


@pytest.mark.parametrize(
    ("model_version", "path"),
    [("v2", "/v2/models/sklearn-iris/infer"), ("v1", "/v1/models/sklearn-iris:predict")],
)
async def test_iris_predictions_are_stored_one_row_each_with_job_and_pod_ids(
    world: World, model_version: str, path: str
) -> None:
    rows = world.storage.seed_iris("iris")
    # No scheme: the runner adds http:// as upstream does.
    model_url = world.model_server.url.removeprefix("http://") + path
    contract = iris_contract(model_url, batching={"batchSize": 32, "concurrency": 3})
    contract["kserve"]["modelVersion"] = model_version

    outcome = await world.run(contract)

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    stored = world.storage.predictions("iris_predictions")
    assert [(job, pod) for job, pod, _, _ in stored] == [("3f1c2a9e-job", "pod-0a1b")] * len(rows)
    assert [counter for _, _, _, counter in stored] == list(range(len(rows)))
    assert [prediction for _, _, prediction, _ in stored] == direct_iris(rows)
    assert outcome.result["rows"] == len(rows)
    assert outcome.result["predictions"] == len(rows)
    assert outcome.result["durationSeconds"] >= 0
    progress = outcome.progress
    assert progress is not None
    assert (progress.rows_done, progress.rows_total) == (len(rows), len(rows))


async def test_iris_reads_the_input_once_writes_the_output_once_and_ignores_payload(
    world: World,
) -> None:
    world.storage.seed_iris("iris")
    contract = iris_contract(world.model_server.infer_url())
    contract["input"]["krateo"]["api"]["payload"] = {"ignored": "as upstream"}

    outcome = await world.run(contract)

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert world.storage.calls == {"sklearninput": 1, "sklearnoutput": 1}
    warnings = [e for e in outcome.events() if e["level"] == "warning"]
    assert [(e["event"], e["role"]) for e in warnings] == [
        ("api.payload is ignored, as upstream: the body is the run's parameters", "input")
    ]
