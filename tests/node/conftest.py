"""The real-node tier: the two images and the Helm chart on real kubelets.

One :class:`~hack.realnode.RealCluster` per session (a control plane of its
own, since the node agent of the shared one binds every pod itself; two
kubelets with containerd, kube-scheduler), the chart installed with ``helm
install`` as a user would, KServe's model server and the storage service as
host processes on loopback.

Where a real node cannot run (not Linux, not root, no Go or gcc) the tier
skips with one line saying what is missing; under ``CI=true`` that is a failure.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack import chart
from hack.cluster import LocalCluster, free_port, spawn, stop_process, wait_http
from hack.polling import wait_for as wait_for  # the tier's tests import it from here
from hack.realnode import (
    CONTROLLER_IMAGE,
    RUNNER_IMAGE,
    NodeUnavailable,
    RealCluster,
    missing_prerequisites,
    real_cluster,
)

REPO = Path(__file__).resolve().parents[2]
RELEASE = "ksc"
RELEASE_NAMESPACE = "ksc-system"
RUNS_NAMESPACE = "ksc-runs"
SECRET_NAMESPACE = "krateo-system"
SECRET = "finops-database-handler-endpoint"
STORAGE_USER, STORAGE_PASSWORD = "finops", "node-tier-pw-5d1e"
INPUT_TABLE, OUTPUT_TABLE = "kserve_controller_input", "kserve_controller_output"
CONFIG = "iris-inference-config"


def _unavailable(why: str) -> None:
    message = f"real-node tier: {why}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (CI=true: the tier must run)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def real() -> Iterator[RealCluster]:
    why = missing_prerequisites()
    if why:
        _unavailable(why)
    try:
        with real_cluster() as started:
            yield started
    except NodeUnavailable as e:
        _unavailable(str(e))


@pytest.fixture(scope="session")
def kube(real: RealCluster) -> LocalCluster:
    assert real.cluster is not None
    return real.cluster


@dataclass
class Storage:
    url: str
    db: Path
    process: Any

    def freeze(self) -> None:
        """Stop answering (SIGSTOP): requests wait, as on a stalled storage service."""
        os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def predictions(self) -> list[tuple[str, str, float, int]]:
        import contextlib
        import sqlite3

        with contextlib.closing(sqlite3.connect(self.db)) as conn:
            exists = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (OUTPUT_TABLE,)
            ).fetchone()
            if not exists:
                return []
            return list(
                conn.execute(f"SELECT jobuid, poduid, prediction, counter FROM {OUTPUT_TABLE}")
            )


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """KServe's own model server (iris) on loopback; its host:port/path as configs write it."""
    port = free_port()
    log = tmp_path_factory.mktemp("model") / "model-server.log"
    proc = spawn([sys.executable, "-m", "hack.model_server", "--port", str(port)], log, cwd=REPO)
    try:
        wait_http(f"http://127.0.0.1:{port}/v2/health/ready", proc, log)
        yield f"127.0.0.1:{port}/v2/models/sklearn-iris/infer"
    finally:
        stop_process(proc)


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[Storage]:
    """The finops-database-handler look-alike, seeded with iris, one per test."""
    port = free_port()
    db = tmp_path / "storage.sqlite"
    log = tmp_path / "storage.log"
    args = [
        sys.executable, "-m", "hack.storage_service", "--port", str(port), "--db", str(db),
        "--user", STORAGE_USER, "--password", STORAGE_PASSWORD, "--seed-iris", INPUT_TABLE,
    ]  # fmt: skip
    proc = spawn(args, log, cwd=REPO)
    service = Storage(f"http://127.0.0.1:{port}", db, proc)
    try:
        wait_http(f"{service.url}/", proc, log)
        yield service
    finally:
        service.thaw()
        stop_process(proc)


def release_values(**overrides: Any) -> dict[str, Any]:
    """The chart as the tier installs it: local images, never pulled, 2 replicas, election on."""
    repository, tag = CONTROLLER_IMAGE.rsplit(":", 1)
    values: dict[str, Any] = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "replicaCount": 2,
        "leaderElection": {"enabled": True},
        # Pods share the host network here (no pod network on loopback-only
        # machines): each replica binds its node's address, on ports free here.
        "hostNetwork": True,
        "ports": {"metrics": free_port(), "health": free_port()},
        "settings": {"pollingInterval": "1m", "logFormat": "json"},
        "runner": {
            "namespaces": [RUNS_NAMESPACE],
            "extraSecretAccess": [{"namespace": SECRET_NAMESPACE, "secretNames": [SECRET]}],
        },
        # One replica is disrupted on purpose by the tests.
        "podDisruptionBudget": {"enabled": False},
    }
    for key, value in overrides.items():
        values[key] = value
    return values


def helm_install(
    kube: LocalCluster, release: str, namespace: str, values: dict[str, Any], tmp: Path
) -> None:
    path = tmp / f"{release}-values.yaml"
    path.write_text(yaml.safe_dump(values))
    chart.helm(
        "install", release, str(chart.CHART_DIR), "--namespace", namespace, "--create-namespace",
        "--values", str(path), "--wait", "--timeout", "5m",
        kubeconfig=kube.kubeconfig, timeout=400,
    )  # fmt: skip


def get(kube: LocalCluster, *args: str) -> Any:
    return json.loads(kube.kubectl("get", *args, "-o", "json").stdout)


@pytest.fixture(scope="session")
def release(kube: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The chart installed once for the tier; returns its namespace."""
    for ns in (RUNS_NAMESPACE, SECRET_NAMESPACE):
        kube.kubectl("create", "namespace", ns)
    helm_install(
        kube, RELEASE, RELEASE_NAMESPACE, release_values(), tmp_path_factory.mktemp("helm")
    )
    return RELEASE_NAMESPACE


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def endpoint_secret(kube: LocalCluster, url: str) -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": SECRET_NAMESPACE},
        "data": {
            "server-url": b64(url),
            "username": b64(STORAGE_USER),
            "password": b64(STORAGE_PASSWORD),
        },
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(secret))


def iris_manifests(
    model_url: str, run: str, *, image: str = RUNNER_IMAGE, config: str = CONFIG
) -> list[dict[str, Any]]:
    """examples/iris-oneshot.yaml with this machine's addresses and image, named ``run``."""
    docs = list(yaml.safe_load_all((REPO / "examples" / "iris-oneshot.yaml").read_text()))
    out = []
    for doc in docs:
        doc["metadata"]["namespace"] = RUNS_NAMESPACE
        if doc["kind"] == "InferenceConfig":
            doc["metadata"]["name"] = config
            doc["spec"]["image"] = image
            doc["spec"]["imagePullPolicy"] = "Never" if image == RUNNER_IMAGE else "IfNotPresent"
            doc["spec"]["kserve"]["modelUrl"] = model_url
        if doc["kind"] == "InferenceRun":
            doc["metadata"]["name"] = run
            doc["spec"]["configRef"]["name"] = config
            doc["spec"]["timeoutSeconds"] = 600
        out.append(doc)
    return out
