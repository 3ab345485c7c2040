"""An iris run whose model is named by an InferenceService, against KServe's own model server.

The InferenceService is the test stand-in of ``hack/kserve/``; the test
writes its status as KServe's controller would: not Ready while the
predictor deploys, then Ready with the model server's address, then the
address changing.
"""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client

from tests.e2e.conftest import E2E, iris_config, iris_run
from tests.isvc import InferenceServices, inference_service, not_ready_status, ready_status
from tests.runs import condition, status


def iris_isvc_config(name: str, service: str) -> dict[str, object]:
    config = iris_config(name, "unused")
    config["spec"]["kserve"] = {
        "inferenceServiceRef": {"name": service},
        "modelInputName": "input-0",
    }
    return config


@pytest.mark.usefixtures("isvc_controller")
async def test_a_run_waits_for_its_inferenceservice_then_succeeds_and_follows_its_url(
    e2e: E2E, iris: list[list[float]], api_client: client.ApiClient
) -> None:
    services = InferenceServices(api_client, e2e.namespace)
    await services.create(inference_service("sklearn-iris"))
    said = "Revision sklearn-iris-predictor-00001 is waiting for its first pod to be ready"
    await services.set_status("sklearn-iris", not_ready_status("RevisionMissing", said))
    await e2e.runs.create(iris_isvc_config("iris-config", "sklearn-iris"))
    await e2e.runs.create(iris_run("first", "iris-config"))

    waiting = await e2e.runs.wait_reason("first", "ModelNotReady")
    assert status(waiting)["phase"] == "Pending"
    assert status(waiting)["message"] == (
        f"InferenceService {e2e.namespace}/sklearn-iris is not Ready: {said}"
    )
    ready = condition(waiting, "Ready")
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("False", "ModelNotReady")
    jobs = await client.BatchV1Api(api_client).list_namespaced_job(e2e.namespace)
    assert jobs.items == []  # nothing started while the model is not Ready

    # KServe's controller: the predictor is up, the service Ready at its address.
    base = e2e.model_server.url
    await services.set_status("sklearn-iris", ready_status(base))
    done = await e2e.runs.wait_phase("first", "Succeeded", within=120)
    assert status(done)["result"]["predictions"] == len(iris) == 150
    assert status(done)["contract"]["kserve"] == {
        "modelName": "sklearn-iris",
        "modelUrl": f"{base}/v2/models/sklearn-iris/infer",
        "modelVersion": "v2",
        "modelInputName": "input-0",
    }
    assert len(e2e.storage.predictions("predictions")) == 150

    # The service moves (another address of the same server): the next run calls it there.
    moved = base.replace("127.0.0.1", "localhost")
    assert moved != base
    await services.set_status("sklearn-iris", ready_status(moved))
    await e2e.runs.create(iris_run("second", "iris-config", output="predictions2"))
    second = await e2e.runs.wait_phase("second", "Succeeded", within=120)
    assert status(second)["contract"]["kserve"]["modelUrl"] == (
        f"{moved}/v2/models/sklearn-iris/infer"
    )
    assert status(second)["result"]["predictions"] == 150
    config = await e2e.runs.get("iris-config", "inferenceconfigs")
    assert config is not None
    assert status(config)["model"]["url"] == f"{moved}/v2/models/sklearn-iris/infer"
