"""A config's live probe with the real runner (`python -m runner --check`) as a Job.

The runner reads the endpoint Secret with the chart's runner ServiceAccount,
lists the storage's notebooks and reads the model's metadata from KServe's
own model server: what a probe proves before any run is started.
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from hack.storage_service import StorageService
from tests.controllerproc import ControllerProcess
from tests.e2e.test_e2e import endpoint_secret, iris_config, model_url, storage
from tests.kubehelpers import eventually
from tests.runs import Runs, condition
from tests.servers import ModelServer

__all__ = ["storage"]  # the fixture, shared with the other end-to-end tests


async def probed(runs: Runs, name: str) -> dict[str, Any]:
    async def found() -> dict[str, Any] | None:
        config = await runs.get(name, "inferenceconfigs")
        return condition(config, "Probed") if config else None

    return await eventually(found, within=90, what=f"a Probed condition on {name}")


async def test_a_good_config_passes_its_probe(
    api_client: client.ApiClient,
    namespace: str,
    probing_controller: ControllerProcess,
    model_server: ModelServer,
    storage: StorageService,
) -> None:
    await endpoint_secret(api_client, namespace, storage.url)
    runs = Runs(api_client, namespace)
    await runs.create(iris_config("good", model_url(model_server)))
    result = await probed(runs, "good")
    assert (result["status"], result["reason"]) == ("True", "ProbeSucceeded"), result
    assert '"model":"sklearn-iris"' in result["message"]
    assert not storage.calls  # no notebook ran: no data was read or written
    assert storage.listings == 2  # the input and output storages answered


async def test_an_unreachable_model_fails_the_probe_with_the_reason(
    api_client: client.ApiClient,
    namespace: str,
    probing_controller: ControllerProcess,
    storage: StorageService,
) -> None:
    await endpoint_secret(api_client, namespace, storage.url)
    runs = Runs(api_client, namespace)
    await runs.create(iris_config("down", "127.0.0.1:1/v2/models/sklearn-iris/infer"))
    result = await probed(runs, "down")
    assert (result["status"], result["reason"]) == ("False", "InferenceFailed"), result
    assert "inference:" in result["message"]


async def test_an_unreadable_secret_fails_the_probe_naming_it(
    api_client: client.ApiClient,
    namespace: str,
    probing_controller: ControllerProcess,
    model_server: ModelServer,
) -> None:
    runs = Runs(api_client, namespace)
    await runs.create(iris_config("nosecret", model_url(model_server), secret="not-there"))
    result = await probed(runs, "nosecret")
    assert (result["status"], result["reason"]) == ("False", "InputRejected"), result
    assert "not-there" in result["message"]
