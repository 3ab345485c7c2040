"""A run whose runner's node is lost, on real kubelets: ``NodeLost``, then the remedy.

The runner pod runs on node A, writing keyed output (paged input); mid-run
node A's kubelet stops. Its containers keep running, as on a node cut off from
the API server, and nothing confirms anything about its pods: the node
lifecycle controller calls the node NotReady and taints it ``unreachable``, the
taint-eviction-controller evicts the runner pod after its toleration (the
config tolerates 5 s instead of the default 300 s), and the pod stays
Terminating, so the Job starts no other. The run must say ``NodeLost``, naming
the node and the ``out-of-service`` taint. The operator applies that taint: the
pod garbage collector deletes the pod, the Job starts another on node B, and
the run succeeds with every row stored exactly once, though the runner on node
A may go on writing meanwhile.

Node A is restored at the end, whatever happened: its kubelet back (it stops
the containers of the pods deleted meanwhile), the taint removed, the node
Ready, and the chart's two controller replicas Ready again, so the rest of the
tier finds the cluster as it was.
"""

from __future__ import annotations

import contextlib
import copy
import json
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest

from hack.cluster import LocalCluster
from hack.realnode import RealCluster
from tests.node.conftest import (
    INPUT_TABLE,
    OUTPUT_TABLE,
    RELEASE,
    RELEASE_NAMESPACE,
    Storage,
    endpoint_secret,
    get,
    iris_manifests,
    wait_for,
)
from tests.node.test_real_node import apply, run_status, runner_pods, wait_phase

RUN = "iris-lost-node"
CONFIG = "lost-node-config"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
OUT_OF_SERVICE_TAINT = f"{OUT_OF_SERVICE}=nodeshutdown:NoExecute"
NODE_TAINTS = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
# The iris table doubled this many times: enough pages that the run is cut mid-way.
DOUBLINGS = 5
PAGE_SIZE = 20
CONTROLLER = f"{RELEASE}-kserve-inference-controller"

pytestmark = pytest.mark.timeout(1200)


def grow_input(storage: Storage) -> int:
    """Double the seeded iris input ``DOUBLINGS`` times (rowids stay dense); its row count."""
    with contextlib.closing(sqlite3.connect(storage.db)) as conn:
        for _ in range(DOUBLINGS):
            conn.execute(f"INSERT INTO {INPUT_TABLE} SELECT * FROM {INPUT_TABLE}")
        conn.commit()
        (rows,) = conn.execute(f"SELECT COUNT(*) FROM {INPUT_TABLE}").fetchone()
    return int(rows)


def keyed_output(storage: Storage) -> tuple[int, int, set[int], int]:
    """``(rows, distinct keys, counters, rows without a key)`` of the output table."""
    with contextlib.closing(sqlite3.connect(storage.db)) as conn:
        exists = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (OUTPUT_TABLE,)
        ).fetchone()
        if not exists:
            return 0, 0, set(), 0
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({OUTPUT_TABLE})")}
        if "rowkey" not in columns:
            (rows,) = conn.execute(f"SELECT COUNT(*) FROM {OUTPUT_TABLE}").fetchone()
            return int(rows), 0, set(), int(rows)
        rows, keys, unkeyed = conn.execute(
            f"SELECT COUNT(*), COUNT(DISTINCT rowkey), SUM(rowkey IS NULL) FROM {OUTPUT_TABLE}"
        ).fetchone()
        counters = {int(c) for (c,) in conn.execute(f"SELECT counter FROM {OUTPUT_TABLE}")}
    return int(rows), int(keys), counters, int(unkeyed or 0)


def lost_node_manifests(model: str) -> list[dict[str, Any]]:
    """The iris example, streaming (keyed output), tolerating a lost node for 5 s only."""
    docs = copy.deepcopy(iris_manifests(model, RUN, config=CONFIG))
    for doc in docs:
        if doc["kind"] == "InferenceConfig":
            storage = doc["spec"]["storage"]
            storage["input"]["krateo"]["paging"] = {"pageSize": PAGE_SIZE}
            storage["output"]["krateo"]["resumePath"] = "/compute/sklearnoutput"
            doc["spec"]["runnerPod"] = {
                "tolerations": [
                    {
                        "key": key,
                        "operator": "Exists",
                        "effect": "NoExecute",
                        "tolerationSeconds": 5,
                    }
                    for key in NODE_TAINTS
                ]
            }
        if doc["kind"] == "InferenceRun":
            doc["spec"]["backoffLimit"] = 2
    return docs


def taint_keys(kube: LocalCluster, node: str) -> set[str]:
    taints = get(kube, "node", node)["spec"].get("taints") or []
    return {str(t.get("key")) for t in taints}


def restore(real: RealCluster, kube: LocalCluster, node: str) -> None:
    """Node ``node`` back as the tier had it; the chart's replicas Ready on both nodes."""
    kube.kubectl("taint", "node", node, f"{OUT_OF_SERVICE}-", check=False)
    real.restore_node(node)

    def untainted() -> bool:
        return not (taint_keys(kube, node) & {OUT_OF_SERVICE, *NODE_TAINTS})

    wait_for(untainted, within=180, what=f"node {node} without the lost-node taints")

    def replicas_ready() -> bool:
        deployment = get(kube, "deployment", CONTROLLER, "-n", RELEASE_NAMESPACE)
        want = deployment["spec"].get("replicas") or 1
        st = deployment.get("status") or {}
        pods = get(kube, "pods", "-A", "--field-selector", f"spec.nodeName={node}")["items"]
        leftover = [p for p in pods if p["metadata"].get("deletionTimestamp")]
        return st.get("readyReplicas") == want and st.get("replicas") == want and not leftover

    wait_for(replicas_ready, within=300, what="the chart's replicas Ready, no pod Terminating")


@pytest.fixture
def lost(real: RealCluster, kube: LocalCluster) -> Iterator[list[str]]:
    """Append a node's name to lose it; whatever happens, it is restored afterwards."""
    names: list[str] = []
    try:
        yield names
    finally:
        for name in names:
            restore(real, kube, name)


def test_a_run_on_a_lost_node_is_node_lost_then_goes_on_after_the_out_of_service_taint(
    real: RealCluster,
    kube: LocalCluster,
    release: str,
    model: str,
    storage: Storage,
    lost: list[str],
) -> None:
    total = grow_input(storage)
    assert total == 150 * 2**DOUBLINGS
    endpoint_secret(kube, storage.url)
    apply(kube, lost_node_manifests(model))

    # Mid-run: the runner has stored some rows, then the storage stalls (SIGSTOP)
    # so that the run is still mid-way when its node is lost.
    def writing() -> dict[str, Any] | None:
        st = run_status(kube, RUN)
        if st.get("phase") in ("Succeeded", "Failed", "Error"):
            raise AssertionError(f"run {RUN} ended before it was cut: {json.dumps(st)[:2000]}")
        keys = keyed_output(storage)[1]
        return {"stored": keys} if keys else None

    wait_for(writing, within=300, what="the runner's first keyed rows", every=0.05)
    storage.freeze()
    stored_before = keyed_output(storage)[1]
    assert 0 < stored_before < total, f"{stored_before} of {total} rows stored when cut"
    pods = [p for p in runner_pods(kube, RUN) if not p["metadata"].get("deletionTimestamp")]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    first = pods[0]
    node_a = first["spec"]["nodeName"]
    (node_b,) = [n for n in real.node_names() if n != node_a]

    def pod_states() -> list[tuple[str, str, bool, list[Any]]]:
        return [
            (
                p["metadata"]["name"],
                p["spec"].get("nodeName", ""),
                bool(p["metadata"].get("deletionTimestamp")),
                [
                    (c["type"], c["status"], c.get("reason"))
                    for c in p["status"].get("conditions") or []
                ],
            )
            for p in runner_pods(kube, RUN)
        ]

    lost.append(node_a)
    real.lose_node(node_a)

    # NotReady, the unreachable taint, the eviction after 5 s: the pod stays
    # Terminating (no kubelet confirms), and the run says so and what to do.
    seen: list[tuple[str, str]] = []  # the run's (phase, reason) as they came

    def node_lost() -> dict[str, Any] | None:
        st = run_status(kube, RUN)
        now = (str(st.get("phase")), str(st.get("reason")))
        if not seen or seen[-1] != now:
            seen.append(now)
        return st if st.get("reason") == "NodeLost" else None

    try:
        st = wait_for(node_lost, within=420, what=f"run {RUN} NodeLost", every=2)
    except TimeoutError as e:
        raise AssertionError(f"{e}; the run was {seen}; its pods: {pod_states()}") from None
    assert st["phase"] == "Running"
    message = st["message"]
    assert node_a in message
    assert first["metadata"]["name"] in message
    assert f"kubectl taint node {node_a} {OUT_OF_SERVICE_TAINT}" in message
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NodeLost")
    (stuck,) = runner_pods(kube, RUN)
    assert stuck["metadata"]["uid"] == first["metadata"]["uid"]
    assert stuck["metadata"].get("deletionTimestamp"), "the lost pod is not being deleted"
    conditions = {c["type"]: c["status"] for c in get(kube, "node", node_a)["status"]["conditions"]}
    assert conditions.get("Ready") != "True", conditions

    # The remedy the message names.
    kube.kubectl("taint", "node", node_a, OUT_OF_SERVICE_TAINT)
    storage.thaw()

    def replaced() -> dict[str, Any] | None:
        for pod in runner_pods(kube, RUN):
            if pod["metadata"]["uid"] != first["metadata"]["uid"]:
                return pod
        return None

    second = wait_for(replaced, within=300, what="the Job's runner pod after the taint")
    assert second["spec"]["nodeName"] == node_b
    st = wait_phase(kube, RUN, "Succeeded", within=600)
    # The runner counts the rows an earlier attempt stored among its predictions.
    assert st["result"]["predictions"] == total, st["result"]

    # Every prediction stored exactly once: one key per row, every row's position.
    rows, keys, counters, unkeyed = keyed_output(storage)
    assert rows > 0, "the output table is empty"
    assert (rows, keys, unkeyed) == (total, total, 0)
    assert counters == set(range(total))
