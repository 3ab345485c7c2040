"""``make demo-node``: the demo on real nodes, as users run it.

Like ``make demo`` (:mod:`hack.demo`), but nothing is imitated: both images
are built from the repository's Dockerfiles, the controller is the Helm
chart's Deployment (two replicas, leader election) on real kubelets with
containerd, and the run executes the runner image in a real container
(:mod:`hack.realnode`). KServe's model server and the storage service stay
host processes on loopback. Needs root (containerd, the kubelet).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

from hack import chart
from hack.cluster import free_port
from hack.demo import (
    NAMESPACE,
    SECRET,
    SECRET_NAMESPACE,
    apply_and_complete,
    demo_manifests,
    demo_servers,
    endpoint_secret,
    print_predictions,
    step,
)
from hack.realnode import CONTROLLER_IMAGE, RUNNER_IMAGE, NodeUnavailable, RealCluster, real_cluster

RELEASE, RELEASE_NAMESPACE = "kserve-inference-controller", "kserve-system"


def chart_values() -> dict[str, object]:
    repository, tag = CONTROLLER_IMAGE.rsplit(":", 1)
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "replicaCount": 2,
        # No pod network on a loopback-only machine: each replica binds its node's address.
        "hostNetwork": True,
        "ports": {"metrics": free_port(), "health": free_port()},
        "runner": {
            "namespaces": [NAMESPACE],
            "extraSecretAccess": [{"namespace": SECRET_NAMESPACE, "secretNames": [SECRET]}],
        },
    }


def run_node_demo(real: RealCluster, workdir: Path, keep: bool) -> None:
    assert real.cluster is not None
    kubectl = real.cluster.kubectl
    print(kubectl("get", "nodes", "-o", "wide").stdout)
    with demo_servers(workdir) as servers:
        model_port, db = servers.model_port, servers.db
        for ns in (NAMESPACE, SECRET_NAMESPACE):
            kubectl("create", "namespace", ns)
        kubectl("apply", "-f", "-", input=json.dumps(endpoint_secret(servers.storage_port)))

        step(
            f"helm install {RELEASE} deploy/kserve-inference-controller (images {CONTROLLER_IMAGE})"
        )
        values = workdir / "values.yaml"
        values.write_text(yaml.safe_dump(chart_values()))
        installed = chart.helm(
            "install", RELEASE, str(chart.CHART_DIR), "--namespace", RELEASE_NAMESPACE,
            "--create-namespace", "--values", str(values), "--wait", "--timeout", "5m",
            kubeconfig=real.cluster.kubeconfig, timeout=400,
        )  # fmt: skip
        print(installed.stdout.split("NOTES:")[0])
        print(kubectl("get", "pods", "-n", RELEASE_NAMESPACE, "-o", "wide").stdout)

        step(f"kubectl apply -f examples/iris-oneshot.yaml (image {RUNNER_IMAGE})")
        manifests = demo_manifests(model_port)
        for doc in manifests:
            if doc["kind"] == "InferenceConfig":
                doc["spec"]["image"] = RUNNER_IMAGE
                doc["spec"]["imagePullPolicy"] = "Never"
        apply_and_complete(real.cluster, manifests, timeout="300s")
        step("kubectl get infrun,jobs,pods")
        print(kubectl("get", "infrun,jobs,pods", "-n", NAMESPACE, "-o", "wide").stdout)
        step("kubectl logs job/<the run's Job> (the runner in its container)")
        run = json.loads(
            kubectl("get", "infrun", "iris-once", "-n", NAMESPACE, "-o", "json").stdout
        )
        logs = kubectl("logs", "-n", NAMESPACE, f"job/{run['status']['jobStatus']['name']}").stdout
        print("\n".join(logs.splitlines()[-5:]))
        step("the run's result (the runner's termination message, read by the kubelet)")
        print(
            yaml.safe_dump({"phase": run["status"]["phase"], "result": run["status"].get("result")})
        )
        step("stored predictions (the storage service's database)")
        print_predictions(db)
        if keep:
            step("still running: try it yourself (Ctrl-C stops everything)")
            print(f"  export KUBECONFIG={real.cluster.kubeconfig}")
            print(f"  alias kubectl={real.cluster.bin_dir / 'kubectl'}")
            print(
                "  kubectl get pods -A -o wide; "
                f"kubectl logs -n {RELEASE_NAMESPACE} deploy/{RELEASE}"
            )
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(1)
                    real.check_alive()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hack.demo_node", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--keep", action="store_true", help="keep everything running until Ctrl-C")
    args = parser.parse_args(argv)
    started = time.monotonic()
    step("preparing real nodes: packages, kubelet, base image, both images (cached after once)")
    try:
        with tempfile.TemporaryDirectory(prefix="ksc-demo-node-") as tmp, real_cluster() as real:
            print(
                f"control plane and {len(real.nodes)} real nodes up "
                f"in {time.monotonic() - started:.1f}s"
            )
            run_node_demo(real, Path(tmp), args.keep)
    except NodeUnavailable as e:
        print(f"make demo-node cannot run here: {e}", file=sys.stderr)
        return 1
    print(f"\ndemo finished in {time.monotonic() - started:.1f}s; everything stopped and removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
