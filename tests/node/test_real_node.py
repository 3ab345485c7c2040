"""The images and the chart on real kubelets, as users run them.

The controller runs as the chart's two pods (leader election on) under the
chart's RBAC; runs execute the real runner image in real containers with the
chart's runner ServiceAccount. KServe's model server and the storage service
are host processes on loopback.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from hack.cluster import LocalCluster
from hack.realnode import RUNNER_IMAGE
from tests.node.conftest import (
    RUNS_NAMESPACE,
    SECRET,
    SECRET_NAMESPACE,
    Storage,
    endpoint_secret,
    get,
    iris_manifests,
    wait_for,
)

RUN_LABEL = "ai.krateo.io/run-uid"


def apply(kube: LocalCluster, docs: list[dict[str, Any]]) -> None:
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))


# The first test of the tier also builds both images and starts the nodes.
pytestmark = pytest.mark.timeout(900)


def run_status(kube: LocalCluster, name: str) -> dict[str, Any]:
    return get(kube, "infrun", name, "-n", RUNS_NAMESPACE).get("status") or {}


def wait_phase(kube: LocalCluster, name: str, phase: str, within: float = 180) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        st = run_status(kube, name)
        if st.get("phase") in ("Failed", "Error") and phase not in ("Failed", "Error"):
            raise AssertionError(f"run {name} ended {st.get('phase')}: {json.dumps(st)[:2000]}")
        return st if st.get("phase") == phase else None

    result: dict[str, Any] = wait_for(probe, within=within, what=f"run {name} {phase}")
    return result


def iris_succeeded(kube: LocalCluster, model: str, storage: Storage, run: str) -> dict[str, Any]:
    """Run ``run`` (examples/iris-oneshot.yaml) against ``storage``: its status once Succeeded."""
    endpoint_secret(kube, storage.url)
    apply(kube, iris_manifests(model, run))
    return wait_phase(kube, run, "Succeeded")


def runner_pods(kube: LocalCluster, run: str) -> list[dict[str, Any]]:
    uid = get(kube, "infrun", run, "-n", RUNS_NAMESPACE)["metadata"]["uid"]
    pods: list[dict[str, Any]] = get(
        kube, "pods", "-n", RUNS_NAMESPACE, "-l", f"{RUN_LABEL}={uid}"
    )["items"]
    return pods


def running_pod(kube: LocalCluster, run: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        for pod in runner_pods(kube, run):
            statuses = pod.get("status", {}).get("containerStatuses") or []
            if pod["metadata"].get("deletionTimestamp") is None and any(
                "running" in (s.get("state") or {}) for s in statuses
            ):
                return pod
        return None

    pod: dict[str, Any] = wait_for(probe, within=120, what=f"a running runner pod of {run}")
    return pod


def test_iris_end_to_end_in_real_containers(
    kube: LocalCluster, release: str, model: str, storage: Storage
) -> None:
    st = iris_succeeded(kube, model, storage, "iris-real")

    # The runner's termination message, read by the real kubelet, is the result.
    assert st["result"]["rows"] == 150
    assert st["result"]["predictions"] == 150
    stored = storage.predictions()
    assert len(stored) == 150
    assert sorted(counter for *_, counter in stored) == list(range(150))
    assert {value for _, _, value, _ in stored} == {0.0, 1.0, 2.0}

    job = st["jobStatus"]["name"]
    logs = kube.kubectl("logs", "-n", RUNS_NAMESPACE, f"job/{job}").stdout
    progress = [json.loads(line) for line in logs.splitlines() if '"progress"' in line]
    assert progress, f"no progress lines in the container's log:\n{logs[-2000:]}"
    assert progress[-1]["rowsDone"] == 150
    # Ran where the chart says: its runner ServiceAccount, the real image.
    (pod,) = runner_pods(kube, "iris-real")
    assert pod["spec"]["serviceAccountName"] == "ksc-kserve-inference-controller-runner"
    # It read the endpoint Secret through the API: the one reason for its token.
    assert pod["spec"]["automountServiceAccountToken"] is True
    assert TOKEN_DIR in [m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]]
    assert pod["status"]["containerStatuses"][0]["image"].endswith(RUNNER_IMAGE.split("/")[-1])
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0
    assert json.loads(terminated["message"])["rows"] == 150


TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def test_kubelet_mounted_secrets_leave_the_runner_without_a_token(
    kube: LocalCluster, release: str, model: str, storage: Storage
) -> None:
    """``secretSource: Volumes``: the real kubelet mounts the endpoint Secret, the pod has no
    ServiceAccount token, and the run succeeds; the API-read run of the same config has one."""
    # The endpoint Secret, copied into the runs' namespace: the kubelet mounts no other.
    endpoint_secret(kube, storage.url)
    data = get(kube, "secret", SECRET, "-n", SECRET_NAMESPACE)["data"]
    assert data["server-url"]
    local = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": RUNS_NAMESPACE},
        "data": data,
    }
    docs = iris_manifests(model, "iris-volumes", config="volumes-config")
    for doc in docs:
        if doc["kind"] == "InferenceConfig":
            doc["spec"]["secretSource"] = "Volumes"
            for side in ("input", "output"):
                doc["spec"]["storage"][side]["krateo"]["api"]["endpointRef"].pop("namespace")
    apply(kube, [local, *docs])
    st = wait_phase(kube, "iris-volumes", "Succeeded")
    assert st["result"]["predictions"] == 150
    (pod,) = runner_pods(kube, "iris-volumes")
    assert pod["spec"]["automountServiceAccountToken"] is False
    (container,) = pod["spec"]["containers"]
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    assert TOKEN_DIR not in mounts
    assert f"/var/run/secrets/kserve-inference/storage/{SECRET}" in mounts
    assert not any("projected" in v for v in pod["spec"]["volumes"])


# What the check prints from inside the runner's container (rendered template, real runtime).
_INSPECT = """
import json, os, pathlib
root = pathlib.Path("/probe-write")
try:
    root.write_text("x"); root_writable = True
except OSError:
    root_writable = False
tmp = pathlib.Path("/tmp/probe-write"); tmp.write_text("x")
contract = pathlib.Path("/tmp/contract.json")
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "root_writable": root_writable,
    "tmp_writable": tmp.read_text() == "x",
    "contract": json.loads(contract.read_text()) if contract.exists() else None,
}))
"""


def test_runner_container_is_non_root_read_only_with_writable_tmp(
    kube: LocalCluster, release: str, model: str, storage: Storage
) -> None:
    """The Job's own pod template, run with a command that reports what the container sees."""
    st = iris_succeeded(kube, model, storage, "iris-inspect")
    job = get(kube, "job", st["jobStatus"]["name"], "-n", RUNS_NAMESPACE)
    template = job["spec"]["template"]
    container = template["spec"]["containers"][0]
    container["command"] = ["python", "-c", _INSPECT]
    container.pop("args", None)
    template["spec"]["restartPolicy"] = "Never"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "inspect-runner", "namespace": RUNS_NAMESPACE},
        "spec": template["spec"],
    }
    apply(kube, [pod])

    def finished() -> dict[str, Any] | None:
        got = get(kube, "pod", "inspect-runner", "-n", RUNS_NAMESPACE)
        return got if got["status"].get("phase") in ("Succeeded", "Failed") else None

    done = wait_for(finished, within=120, what="the inspection pod")
    out = kube.kubectl("logs", "-n", RUNS_NAMESPACE, "inspect-runner").stdout
    assert done["status"]["phase"] == "Succeeded", out
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["uid"] == 65532
    assert seen["gid"] == 65532
    assert seen["root_writable"] is False
    assert seen["tmp_writable"] is True
    # Upstream's path: /tmp/contract.json, the ConfigMap's contract.
    assert seen["contract"]["kserve"]["modelName"] == "sklearn-iris"


def test_runner_pod_deleted_mid_run_is_retried_and_the_run_succeeds(
    kube: LocalCluster, release: str, model: str, storage: Storage
) -> None:
    endpoint_secret(kube, storage.url)
    storage.freeze()  # the runner waits on its input: the run is really mid-way
    apply(kube, iris_manifests(model, "iris-podkill"))
    first = running_pod(kube, "iris-podkill")
    kube.kubectl("delete", "pod", "-n", RUNS_NAMESPACE, first["metadata"]["name"], "--wait=false")

    def replaced() -> dict[str, Any] | None:
        pod = running_pod(kube, "iris-podkill")
        return pod if pod["metadata"]["uid"] != first["metadata"]["uid"] else None

    wait_for(replaced, within=120, what="the Job's next runner pod")
    storage.thaw()
    st = wait_phase(kube, "iris-podkill", "Succeeded")
    job = get(kube, "job", st["jobStatus"]["name"], "-n", RUNS_NAMESPACE)
    # SIGTERM (143) is not a permanent exit code: the pod failure policy lets
    # the Job retry, and the retry's success is the run's.
    assert job["status"].get("succeeded") == 1
    assert job["status"].get("failed", 0) <= 1
    assert st["result"]["predictions"] == 150
    assert len(storage.predictions()) == 150


def test_missing_image_says_why_the_run_is_pending(
    kube: LocalCluster, release: str, model: str, storage: Storage
) -> None:
    endpoint_secret(kube, storage.url)
    # A registry on a closed loopback port: the pull fails at once, on loopback.
    image = "127.0.0.1:9/ksc/no-such-runner:1"
    apply(kube, iris_manifests(model, "iris-noimage", image=image, config="no-image-config"))

    def stuck() -> dict[str, Any] | None:
        st = run_status(kube, "iris-noimage")
        return st if st.get("reason") in ("ErrImagePull", "ImagePullBackOff") else None

    st = wait_for(stuck, within=120, what="the run to say its image cannot be pulled")
    assert st["phase"] == "Pending"
    assert "127.0.0.1:9/ksc/no-such-runner:1" in st["message"]
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"
    assert ready["reason"] in ("ErrImagePull", "ImagePullBackOff")
    kube.kubectl("delete", "infrun", "iris-noimage", "-n", RUNS_NAMESPACE)
