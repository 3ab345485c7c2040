"""InferenceConfig status on the real control plane: Ready at once, and the live probe."""

from __future__ import annotations

import json

from kubernetes_asyncio import client

from hack.cluster import LocalCluster
from hack.controllerproc import ControllerProcess
from tests.integration.test_controller import FAIL, OK
from tests.kubehelpers import eventually, wait_for_events
from tests.runs import (
    CONFIGS,
    MODEL_URL_PATCH,
    Runs,
    condition,
    inference_config,
    inference_run,
    status,
    without_model_url,
)


async def test_kubectl_wait_for_ready_on_a_good_config(
    runs: Runs, namespace: str, controller: ControllerProcess, cluster: LocalCluster
) -> None:
    created = await runs.create(inference_config("cfg", OK))
    waited = cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Ready", "infcfg/cfg", "--timeout=30s"
    )
    assert "condition met" in waited.stdout
    config = await runs.get("cfg", CONFIGS)
    assert config is not None
    assert status(config)["observedGeneration"] == created["metadata"]["generation"]
    ready = condition(config, "Ready")
    assert ready is not None
    assert (ready["reason"], ready["observedGeneration"]) == ("Valid", 1)
    assert condition(config, "Probed") is None  # probes are off for this controller
    shown = cluster.kubectl("get", "infcfg", "-n", namespace, "-o", "wide").stdout
    assert "True" in shown.splitlines()[1]


async def test_an_unusable_config_is_not_ready_with_the_field(
    runs: Runs, controller: ControllerProcess
) -> None:
    await runs.create(without_model_url(inference_config("cfg", OK)))
    ready = await runs.wait_config_condition("cfg", "Ready", "False", within=30)
    assert ready["reason"] == "MissingModelUrl"
    assert "modelUrl" in ready["message"]
    await runs.patch("cfg", MODEL_URL_PATCH, CONFIGS)
    await runs.wait_condition(
        "cfg",
        "Ready",
        lambda c: c["status"] == "True" and c["observedGeneration"] == 2,
        plural=CONFIGS,
        within=30,
        what="Ready=True for generation 2",
    )


async def test_a_probe_that_passes_is_recorded_and_cleaned_up(
    api_client: client.ApiClient,
    runs: Runs,
    namespace: str,
    probing_controller: ControllerProcess,
    cluster: LocalCluster,
) -> None:
    await runs.create(inference_config("cfg", OK))
    probed = await runs.wait_condition("cfg", "Probed", plural=CONFIGS, what="a Probed condition")
    assert (probed["status"], probed["reason"]) == ("True", "ProbeSucceeded")
    config = await runs.get("cfg", CONFIGS)
    assert config is not None
    assert status(config)["lastProbeTime"]
    batch = client.BatchV1Api(api_client)

    async def probe_gone() -> bool:
        return not (await batch.list_namespaced_job(namespace)).items

    await eventually(probe_gone, within=30, what="the probe Job to be deleted")
    shown = cluster.kubectl("get", "infcfg", "-n", namespace).stdout.splitlines()
    assert shown[0].split()[:3] == ["NAME", "READY", "PROBED"]
    assert shown[1].split()[1:3] == ["True", "True"]


async def test_a_probe_that_fails_says_why_on_the_config_and_its_runs(
    api_client: client.ApiClient, runs: Runs, namespace: str, probing_controller: ControllerProcess
) -> None:
    await runs.create(inference_config("cfg", FAIL))
    probed = await runs.wait_condition("cfg", "Probed", plural=CONFIGS, what="a Probed condition")
    assert (probed["status"], probed["reason"]) == ("False", "InferenceFailed")
    assert "model answered 503" in probed["message"]
    reasons = await wait_for_events(
        api_client, namespace, "cfg", "InferenceFailed", what="a Warning event on the config"
    )
    assert "InferenceFailed" in reasons
    # A run of that config says what its config's probe found.
    await runs.create(inference_run("r", "cfg", backoffLimit=0))
    warned = await runs.wait(
        "r",
        lambda r: "ConfigProbeFailed" in ((condition(r, "Warning") or {}).get("reason") or ""),
        within=30,
        what="a ConfigProbeFailed warning on the run",
    )
    assert "model answered 503" in (condition(warned, "Warning") or {})["message"]


# A cloud key planted in storage settings: upstream-style configs name it
# awsSecretAccessKey, and before the one credential rule it was accepted
# (Ready) and copied into the run's status and its contract ConfigMap.
PLANTED = "wJalrXUtnFEMIK7MDENGbPxRfiCYzEXAMPLEKEY"


async def test_a_planted_cloud_key_is_refused_and_never_copied(
    api_client: client.ApiClient, runs: Runs, namespace: str, controller: ControllerProcess
) -> None:
    storage = {
        "input": {"s3": {"bucket": "in", "awsSecretAccessKey": PLANTED}},
        "output": {"s3": {"bucket": "out", "connectionString": f"AccountKey={PLANTED};"}},
    }
    await runs.create(inference_config("cfg", OK, storage=storage))
    ready = await runs.wait_config_condition("cfg", "Ready", "False", within=30)
    assert ready["reason"] == "InlineCredentials"
    assert "storage.input.s3.awsSecretAccessKey" in ready["message"]
    assert "storage.output.s3.connectionString" in ready["message"]
    errored = await runs.create_and_wait(inference_run("r", "cfg"), "Error")
    assert status(errored)["reason"] == "InlineCredentials"
    assert "contract" not in status(errored)
    # Nowhere the controller writes: statuses, ConfigMaps, Events, its log.
    core = client.CoreV1Api(api_client)
    config_maps = (await core.list_namespaced_config_map(namespace)).items
    events = (await core.list_namespaced_event(namespace)).items
    config = await runs.get("cfg", CONFIGS)
    assert config is not None
    written = [
        json.dumps(status(config)),
        json.dumps(errored),
        *(json.dumps(cm.data or {}) for cm in config_maps),
        *(f"{e.reason} {e.message}" for e in events),
        controller.output(),
    ]
    assert events, "the controller recorded no Event"
    assert "InlineCredentials" in controller.output() or any(
        e.reason == "InlineCredentials" for e in events
    )
    for text in written:
        assert PLANTED not in text
