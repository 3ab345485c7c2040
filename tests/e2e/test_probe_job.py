"""A config's live probe with the real runner (`python -m runner --check`) as a Job.

The runner reads the endpoint Secret with the chart's runner ServiceAccount,
lists the storage's notebooks and reads the model's metadata from KServe's
own model server: what a probe proves before any run is started.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import E2E, iris_config
from tests.kubehelpers import eventually
from tests.runs import Runs, condition


async def probed(runs: Runs, name: str) -> dict[str, Any]:
    async def found() -> dict[str, Any] | None:
        config = await runs.get(name, "inferenceconfigs")
        return condition(config, "Probed") if config else None

    return await eventually(found, within=90, what=f"a Probed condition on {name}")


@pytest.mark.usefixtures("probing_controller")
async def test_a_good_config_passes_its_probe(e2e: E2E) -> None:
    await e2e.runs.create(iris_config("good", e2e.model_url()))
    result = await probed(e2e.runs, "good")
    assert (result["status"], result["reason"]) == ("True", "ProbeSucceeded"), result
    assert '"model":"sklearn-iris"' in result["message"]
    assert not e2e.storage.calls  # no notebook ran: no data was read or written
    assert e2e.storage.listings == 2  # the input and output storages answered


@pytest.mark.usefixtures("probing_controller")
async def test_an_unreachable_model_fails_the_probe_with_the_reason(e2e: E2E) -> None:
    await e2e.runs.create(iris_config("down", "127.0.0.1:1/v2/models/sklearn-iris/infer"))
    result = await probed(e2e.runs, "down")
    assert (result["status"], result["reason"]) == ("False", "InferenceFailed"), result
    assert "inference:" in result["message"]


@pytest.mark.usefixtures("probing_controller")
async def test_an_unreadable_secret_fails_the_probe_naming_it(e2e: E2E) -> None:
    await e2e.runs.create(iris_config("nosecret", e2e.model_url(), secret="not-there"))
    result = await probed(e2e.runs, "nosecret")
    assert (result["status"], result["reason"]) == ("False", "InputRejected"), result
    assert "not-there" in result["message"]
