"""The runner's identity: a ServiceAccount token only where it reads a Secret through the API.

Iris runs end to end (the real runner, run by the node agent from the pod the
Job controller made and the API server admitted): with ``secretSource: API``
(the default) the runner reads the endpoint Secret with its token, which the
ServiceAccount admission plugin mounted; with ``secretSource: Volumes`` the
kubelet (the node agent) mounts the Secret and the pod holds no token at all.
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from hack.controllerproc import ControllerProcess
from tests.e2e.conftest import E2E, SECRET, iris_config, iris_run
from tests.runs import condition, status

TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
STORAGE_SECRETS = "/var/run/secrets/kserve-inference/storage"


async def runner_pod(e2e: E2E) -> Any:
    """The one pod of the test's namespace that a Job made (its run's; probes are off)."""
    pods = await client.CoreV1Api(e2e.api).list_namespaced_pod(e2e.namespace)
    owned = [
        p for p in pods.items if any(o.kind == "Job" for o in p.metadata.owner_references or [])
    ]
    assert len(owned) == 1, [p.metadata.name for p in pods.items]
    return owned[0]


def token_mounts(pod: Any) -> list[str]:
    (container,) = pod.spec.containers
    return [m.mount_path for m in container.volume_mounts or [] if m.mount_path == TOKEN_DIR]


async def test_secrets_read_through_the_api_mount_the_token(
    e2e: E2E, iris: list[list[float]], controller: ControllerProcess
) -> None:
    done = await e2e.finish(
        iris_config("cfg", e2e.model_url()), iris_run("run", "cfg"), "Succeeded"
    )
    assert status(done)["result"]["predictions"] == len(iris)
    pod = await runner_pod(e2e)
    assert pod.spec.automount_service_account_token is True
    assert token_mounts(pod) == [TOKEN_DIR]


async def test_secrets_the_kubelet_mounts_leave_the_pod_without_a_token(
    e2e: E2E, iris: list[list[float]], controller: ControllerProcess
) -> None:
    config = iris_config("cfg", e2e.model_url(), secretSource="Volumes")
    done = await e2e.finish(config, iris_run("run", "cfg"), "Succeeded")
    assert status(done)["result"]["predictions"] == len(iris)
    pod = await runner_pod(e2e)
    assert pod.spec.automount_service_account_token is False
    assert token_mounts(pod) == []
    assert not any(v.projected is not None for v in pod.spec.volumes), "no projected token"
    (container,) = pod.spec.containers
    mounts = {m.mount_path: m for m in container.volume_mounts}
    secret_volume = mounts[f"{STORAGE_SECRETS}/{SECRET}"].name
    (volume,) = [v for v in pod.spec.volumes if v.name == secret_volume]
    assert volume.secret.secret_name == SECRET


async def test_volumes_with_a_secret_of_another_namespace_are_refused_by_name(
    e2e: E2E, controller: ControllerProcess
) -> None:
    config = iris_config("cfg", e2e.model_url(), secretSource="Volumes")
    config["spec"]["storage"]["input"]["krateo"]["api"]["endpointRef"]["namespace"] = "elsewhere"
    await e2e.runs.create(config)
    ready = await e2e.runs.wait_config_condition("cfg", "Ready", "False", within=30)
    assert "elsewhere/" + SECRET in ready["message"], ready
    assert "secretSource" in ready["message"], ready
    stored = await e2e.runs.get("cfg", "inferenceconfigs")
    assert stored is not None
    assert condition(stored, "Ready") == ready
