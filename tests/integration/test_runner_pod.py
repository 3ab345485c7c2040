"""Shaped runner pods on the real control plane: the config's runnerPod over the
controller's RUNNER_POD_DEFAULTS, on the Job and on the pod the Job controller
makes from it; an affinity the API server refuses shows on the run in its words."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from hack.cluster import LocalCluster
from hack.controllerproc import ControllerProcess, controller_for, running
from tests.kubehelpers import eventually
from tests.runs import Runs, condition, inference_config, inference_run, status

OK = "test.local/fake-ok:1"

DEFAULTS = {
    "labels": {"cost-center": "ml-platform", "team": "platform"},
    "annotations": {"example.com/owner": "platform"},
    "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
    "env": [
        {"name": "HTTP_PROXY", "value": "http://proxy.example:3128"},
        {"name": "LOG_LEVEL", "value": "INFO"},
    ],
    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
}
GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def runner_pod(priority_class: str) -> dict[str, Any]:
    return {
        "labels": {"team": "forecasting"},
        "annotations": {"sidecar.istio.io/inject": "false"},
        # The node agent's node has it (hack/nodeagent.py); it does not schedule anyway.
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [GPU],
        "priorityClassName": priority_class,
        "env": [
            {"name": "LOG_LEVEL", "value": "DEBUG"},
            {"name": "MY_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ],
    }


@pytest.fixture
def priority_class(cluster: LocalCluster, namespace: str) -> Iterator[str]:
    name = f"ksc-test-{namespace}"[:253]
    body = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": 1000,
        "description": "tests/integration/test_runner_pod.py",
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
    try:
        yield name
    finally:
        cluster.kubectl("delete", "priorityclass", name, "--ignore-not-found")


@pytest.fixture
def shaping_controller(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> Iterator[ControllerProcess]:
    env = {"RUNNER_POD_DEFAULTS": json.dumps(DEFAULTS)}
    with running(controller_for(cluster, namespace, tmp_path, env=env)) as proc:
        yield proc


def _check_pod_shape(meta: Any, spec: Any, priority_class: str) -> None:
    """Template or pod (kubernetes_asyncio models): what the config and the defaults say."""
    assert meta.labels["team"] == "forecasting"  # the config wins
    assert meta.labels["cost-center"] == "ml-platform"  # the defaults fill in
    assert meta.labels["app.kubernetes.io/managed-by"] == "kserve-inference-controller"
    assert meta.annotations["sidecar.istio.io/inject"] == "false"
    assert meta.annotations["example.com/owner"] == "platform"
    assert spec.node_selector == {"kubernetes.io/os": "linux"}
    tolerations = [(t.key, t.operator, t.effect) for t in spec.tolerations]
    assert ("spot", "Exists", "NoSchedule") in tolerations
    assert ("nvidia.com/gpu", "Exists", "NoSchedule") in tolerations
    assert spec.priority_class_name == priority_class
    (container,) = spec.containers
    env = {e.name: e for e in container.env}
    assert list(env)[:1] == ["pod_uid"]
    assert env["LOG_LEVEL"].value == "DEBUG"
    assert env["HTTP_PROXY"].value == "http://proxy.example:3128"
    assert env["MY_NODE"].value_from.field_ref.field_path == "spec.nodeName"
    assert container.resources.requests == {"cpu": "10m", "memory": "16Mi"}
    assert container.resources.limits == {"memory": "64Mi"}


async def test_a_shaped_run_end_to_end(
    api_client: client.ApiClient,
    runs: Runs,
    namespace: str,
    priority_class: str,
    shaping_controller: ControllerProcess,
) -> None:
    await runs.create(inference_config("cfg", OK, runnerPod=runner_pod(priority_class)))
    created = await runs.create(inference_run("shaped", "cfg", timeoutSeconds=60))
    done = await runs.wait_phase("shaped", "Succeeded")
    assert status(done)["result"]["rows"] == 3

    selector = f"ai.krateo.io/run-uid={created['metadata']['uid']}"
    (job,) = (
        await client.BatchV1Api(api_client).list_namespaced_job(namespace, label_selector=selector)
    ).items
    assert job.metadata.labels["team"] == "forecasting"
    assert job.metadata.labels["cost-center"] == "ml-platform"
    assert "sidecar.istio.io/inject" not in (job.metadata.annotations or {})  # pods only
    _check_pod_shape(job.spec.template.metadata, job.spec.template.spec, priority_class)

    (pod,) = (
        await client.CoreV1Api(api_client).list_namespaced_pod(namespace, label_selector=selector)
    ).items
    _check_pod_shape(pod.metadata, pod.spec, priority_class)
    assert pod.spec.priority == 1000  # the API server resolved the PriorityClass


async def test_an_affinity_the_api_server_refuses_shows_on_the_run(
    api_client: client.ApiClient, namespace: str, controller: ControllerProcess
) -> None:
    bad = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "Sometimes"}]}
                ]
            }
        }
    }
    runs = Runs(api_client, namespace)
    await runs.create(inference_config("cfg", OK, runnerPod={"affinity": bad}))
    errored = await runs.create_and_wait(inference_run("r", "cfg"), "Error")
    st = status(errored)
    assert st["reason"] == "JobRefused"
    assert "affinity" in st["message"]
    assert '"Sometimes": not a valid selector operator' in st["message"]
    ready = condition(errored, "Ready")
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("False", "JobRefused")
    stalled = condition(errored, "Stalled")
    assert stalled is not None
    assert stalled["status"] == "True"

    # Fixed in the config: the next attempt creates the Job and the run goes on.
    await runs.patch("cfg", {"spec": {"runnerPod": {"affinity": None}}}, "inferenceconfigs")
    await runs.wait_phase("r", "Succeeded", within=90)


async def test_a_missing_priority_class_is_the_jobs_failed_create(
    runs: Runs, namespace: str, controller: ControllerProcess
) -> None:
    missing = {"priorityClassName": f"ksc-test-missing-{namespace}"}
    await runs.create(inference_config("cfg", OK, runnerPod=missing))
    await runs.create(inference_run("r", "cfg"))

    async def failed_create() -> dict[str, Any] | None:
        run = await runs.get("r")
        st = status(run or {})
        return run if st.get("phase") == "Pending" and st.get("reason") == "FailedCreate" else None

    run = await eventually(failed_create, within=60, what="the run to show FailedCreate")
    assert "no PriorityClass with name" in status(run)["message"]
