"""docs/models.md's "From kubectl get isvc to a modelUrl" block prints what the controller resolves.

The block runs as written (bash, the cluster's kubectl) against InferenceServices
of the test stand-in CRD, and its output is compared with the URL the
controller itself puts in ``status.model.url`` of a config naming the same
service by ``inferenceServiceRef``.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from kubernetes_asyncio import client

from hack.cluster import LocalCluster
from hack.crds import install_inferenceservice_crd
from tests.chart import REPO
from tests.isvc import InferenceServices, inference_service, ready_status
from tests.kubehelpers import eventually
from tests.runs import Runs, inference_config, status

GUIDE = REPO / "docs" / "models.md"
MARKER = "<!-- isvc to modelUrl -->"
FIRST_LINE = "ISVC=sklearn-iris NS=kserve-test"
CONFIGS = "inferenceconfigs"


def recipe() -> str:
    text = GUIDE.read_text()
    assert MARKER in text, f"{GUIDE} has no {MARKER}"
    found = re.match(r"\s*```sh\n(.*?)```", text.split(MARKER, 1)[1], re.DOTALL)
    assert found is not None, f"no sh block after {MARKER}"
    assert found.group(1).startswith(FIRST_LINE + "\n"), found.group(1)
    return found.group(1)


def run_recipe(
    cluster: LocalCluster, service: str, namespace: str
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{cluster.bin_dir}:{os.environ['PATH']}",
        "KUBECONFIG": str(cluster.kubeconfig_for("admin")),
    }
    script = recipe().replace(FIRST_LINE, f"ISVC={service} NS={namespace}", 1)
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.fixture
def isvc_crd(cluster: LocalCluster) -> None:
    """The stand-in CRD, before the controller starts (it watches services only if it exists)."""
    install_inferenceservice_crd(cluster)


@pytest.mark.usefixtures("isvc_crd", "controller")
async def test_the_recipe_prints_the_url_the_controller_resolves(
    api_client: client.ApiClient, runs: Runs, namespace: str, cluster: LocalCluster
) -> None:
    services = InferenceServices(api_client, namespace)
    for name, protocol in (("iris-v2", "v2"), ("iris-v1", "v1")):
        await services.create(inference_service(name, protocol))
        await services.set_status(
            name, ready_status(f"http://{name}-predictor.{namespace}.svc.cluster.local")
        )
        config = inference_config(name, "runner:1")
        config["spec"]["kserve"] = {"inferenceServiceRef": {"name": name}}
        await runs.create(config)

        async def resolved(config: str = name) -> str | None:
            got = await runs.get(config, CONFIGS)
            return (status(got).get("model") or {}).get("url") if got else None

        url = await eventually(resolved, within=60, what=f"config {name}'s resolved model")
        done = run_recipe(cluster, name, namespace)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == url, (protocol, done.stdout, url)
    # A protocol with no HTTP path of its own: the recipe says so and fails.
    await services.create(inference_service("grpc", "grpc-v2"))
    await services.set_status("grpc", ready_status(f"http://grpc.{namespace}.svc"))
    refused = run_recipe(cluster, "grpc", namespace)
    assert refused.returncode == 1, refused
    assert "use inferenceServiceRef" in refused.stderr
