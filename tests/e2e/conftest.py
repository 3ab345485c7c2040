"""What every end-to-end test stands on: the storage, its endpoint Secret, the model server.

One fixture (``e2e``) starts the finops-database-handler look-alike, writes the
endpoint Secret the runner reads through the API, and hands the tests the
namespace's runs and the model server's address, so no test repeats that set-up.
Which controller runs (``controller`` or ``probing_controller``) is each test's
choice.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from hack.cluster import LocalCluster
from hack.controllerproc import ControllerProcess, controller_for, running
from hack.crds import install_inferenceservice_crd
from hack.storage_service import StorageService
from tests import servers
from tests.runs import Runs, inference_config, inference_run
from tests.servers import ModelServer

RUNNER_IMAGE = "ghcr.io/krateoplatformops/kserve-krateo-runner:0.1.0"
SECRET = "finops-database-handler-endpoint"
USER, PASSWORD = "finops", "e2e-storage-pw-91c2"


async def endpoint_secret(api: client.ApiClient, namespace: str, url: str) -> None:
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    await client.CoreV1Api(api).create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": SECRET},
            "data": {"server-url": b64(url), "username": b64(USER), "password": b64(PASSWORD)},
        },
    )


def krateo(path: str, secret: str = SECRET, namespace: str | None = None) -> dict[str, Any]:
    ref: dict[str, str] = {"name": secret}
    if namespace:
        ref["namespace"] = namespace
    return {
        "krateo": {
            "api": {
                "endpointRef": ref,
                "path": path,
                "verb": "POST",
                "headers": ["Accept: application/json", "Content-Type: application/json"],
            }
        }
    }


def iris_config(
    name: str, model_url: str, *, policy: str = "None", secret: str = SECRET, **spec: Any
) -> dict[str, Any]:
    """The iris config of upstream's examples: sklearn notebooks of the storage."""
    storage = {
        "input": krateo("/compute/sklearninput", secret),
        "output": krateo("/compute/sklearnoutput", secret),
    }
    config = inference_config(name, RUNNER_IMAGE, policy=policy, storage=storage, **spec)
    config["spec"]["kserve"]["modelUrl"] = model_url
    return config


def iris_run(name: str, config: str, output: str = "predictions", **spec: Any) -> dict[str, Any]:
    parameters = {"input_table_name": "iris", "output_table_name": output}
    return inference_run(name, config, **{"timeoutSeconds": 120, "parameters": parameters, **spec})


@dataclass
class E2E:
    """One test's namespace with the storage up and its endpoint Secret in place."""

    api: client.ApiClient
    namespace: str
    runs: Runs
    storage: StorageService
    model_server: ModelServer

    def model_url(self, model: str = "sklearn-iris") -> str:
        # No scheme, like upstream's examples: the runner adds http://.
        return self.model_server.infer_url(model).removeprefix("http://")

    async def finish(
        self, config: dict[str, Any], run: dict[str, Any], phase: str, *, within: float = 90
    ) -> dict[str, Any]:
        """Create ``config`` and ``run``; the run as it is once in ``phase``."""
        await self.runs.create(config)
        await self.runs.create(run)
        return await self.runs.wait_phase(run["metadata"]["name"], phase, within=within)


@pytest.fixture
async def e2e(
    api_client: client.ApiClient, namespace: str, model_server: ModelServer, tmp_path: Path
) -> AsyncIterator[E2E]:
    async with servers.running(
        StorageService(tmp_path / "storage.sqlite", USER, PASSWORD)
    ) as storage:
        await endpoint_secret(api_client, namespace, storage.url)
        yield E2E(api_client, namespace, Runs(api_client, namespace), storage, model_server)


@pytest.fixture
def iris(e2e: E2E) -> list[list[float]]:
    """The iris table the iris runs read, seeded in the storage."""
    return e2e.storage.seed_iris("iris")


@pytest.fixture
def isvc_controller(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> Iterator[ControllerProcess]:
    """The ``controller`` fixture, started once the InferenceService CRD exists."""
    install_inferenceservice_crd(cluster)
    with running(controller_for(cluster, namespace, tmp_path)) as proc:
        yield proc
