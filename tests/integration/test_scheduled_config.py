"""A scheduled run follows its config on the real control plane: deleted, it stops; back, it goes.

A CronJob whose config was deleted used to keep firing every minute from its
last contract while the run's status said it "starts when the config exists".
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio import client

from hack.controllerproc import ControllerProcess
from tests.integration.test_controller import OK, children
from tests.kubehelpers import eventually, wait_for_events
from tests.runs import Runs, condition, inference_config, inference_run, status

CONFIGS = "inferenceconfigs"
CONFIG_GENERATION = "ai.krateo.io/config-generation"
CONFIG_RESOURCE_VERSION = "ai.krateo.io/config-resource-version"


async def _cronjob(api: client.ApiClient, namespace: str, uid: str) -> Any:
    (cron,) = (await children(api, namespace, uid))["cronjobs"]
    return cron


async def _configmap(api: client.ApiClient, namespace: str, uid: str) -> Any:
    (configmap,) = (await children(api, namespace, uid))["configmaps"]
    return configmap


@pytest.mark.timeout(240)
async def test_a_scheduled_run_is_suspended_while_its_config_is_gone_and_resumed_after(
    api_client: client.ApiClient, runs: Runs, namespace: str, controller: ControllerProcess
) -> None:
    await runs.create(inference_config("cfg", OK))
    # A tick that never comes during the test: only the CronJob's suspend is looked at.
    tick = await runs.create(inference_run("tick", "cfg", schedule="0 0 1 1 *"))
    paused = await runs.create(inference_run("paused", "cfg", schedule="0 0 1 1 *", suspend=True))
    uid, paused_uid = tick["metadata"]["uid"], paused["metadata"]["uid"]
    await runs.wait_phase("tick", "Scheduled")
    await runs.wait_phase("paused", "Suspended")
    assert (await _cronjob(api_client, namespace, uid)).spec.suspend is False
    assert (await _cronjob(api_client, namespace, paused_uid)).spec.suspend is True

    await runs.delete("cfg", CONFIGS)

    async def suspended() -> bool:
        return bool((await _cronjob(api_client, namespace, uid)).spec.suspend)

    await eventually(suspended, within=30, what="the CronJob suspended once its config is gone")
    gone = await runs.wait_reason("tick", "ConfigNotFound", within=30)
    assert status(gone)["phase"] == "Error"
    assert "is suspended until it exists" in status(gone)["message"]
    assert "nextScheduleTime" not in status(gone)
    ready = condition(gone, "Ready")
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("False", "ConfigNotFound")
    await wait_for_events(
        api_client, namespace, "tick", "ConfigNotFound", what="a ConfigNotFound Warning Event"
    )
    await runs.wait_reason("paused", "ConfigNotFound", within=30)
    assert (await _cronjob(api_client, namespace, paused_uid)).spec.suspend is True

    # The config comes back, different: the contract follows, the CronJob resumes.
    edited = inference_config("cfg", OK, batching={"batchSize": 7})
    edited["spec"]["kserve"]["modelName"] = "returned"
    back = await runs.create(edited)
    resumed = await runs.wait_phase("tick", "Scheduled", within=30)
    assert (await _cronjob(api_client, namespace, uid)).spec.suspend is False
    configmap = await _configmap(api_client, namespace, uid)
    contract = json.loads(configmap.data["contract.json"])
    assert contract["kserve"]["modelName"] == "returned"
    assert contract["batching"]["batchSize"] == 7
    annotations = configmap.metadata.annotations
    assert annotations[CONFIG_GENERATION] == str(back["metadata"]["generation"])
    assert int(annotations[CONFIG_RESOURCE_VERSION]) >= int(back["metadata"]["resourceVersion"])
    st = status(resumed)
    assert st["configResourceVersion"] == annotations[CONFIG_RESOURCE_VERSION]
    assert st["configGeneration"] == back["metadata"]["generation"]
    assert st["contract"]["kserve"]["modelName"] == "returned"

    # The run the user suspended stays suspended, with the new contract for when it resumes.
    await runs.wait_phase("paused", "Suspended", within=30)
    assert (await _cronjob(api_client, namespace, paused_uid)).spec.suspend is True
    paused_contract = json.loads(
        (await _configmap(api_client, namespace, paused_uid)).data["contract.json"]
    )
    assert paused_contract["kserve"]["modelName"] == "returned"


@pytest.mark.timeout(240)
async def test_a_scheduled_run_is_suspended_while_its_config_is_invalid_and_resumed_after(
    api_client: client.ApiClient, runs: Runs, namespace: str, controller: ControllerProcess
) -> None:
    # The CronJob fires its last contract, rendered from the config before the
    # bad edit: it used to go on firing that while the status said the config
    # could not be used.
    await runs.create(inference_config("cfg", OK))
    tick = await runs.create(inference_run("tick", "cfg", schedule="0 0 1 1 *"))
    uid = tick["metadata"]["uid"]
    await runs.wait_phase("tick", "Scheduled")
    assert (await _cronjob(api_client, namespace, uid)).spec.suspend is False

    # A modelUrl of spaces: the schema takes it (it only asks for a URL or an
    # InferenceService), the controller finds no URL in it.
    await runs.patch("cfg", {"spec": {"kserve": {"modelUrl": " "}}}, CONFIGS)

    async def suspended() -> bool:
        return bool((await _cronjob(api_client, namespace, uid)).spec.suspend)

    await eventually(suspended, within=30, what="the CronJob suspended once its config is invalid")
    invalid = await runs.wait_reason("tick", "MissingModelUrl", within=30)
    assert status(invalid)["phase"] == "Error"
    assert "is suspended until the config is usable" in status(invalid)["message"]
    assert "modelUrl" in status(invalid)["message"]

    fixed = {"spec": {"kserve": {"modelUrl": "m:1/v2/models/fixed/infer"}}}
    await runs.patch("cfg", fixed, CONFIGS)
    await runs.wait_phase("tick", "Scheduled", within=30)
    assert (await _cronjob(api_client, namespace, uid)).spec.suspend is False
    contract = json.loads((await _configmap(api_client, namespace, uid)).data["contract.json"])
    assert contract["kserve"]["modelUrl"] == "m:1/v2/models/fixed/infer"
