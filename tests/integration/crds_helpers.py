"""Install this repository's CRDs into the test cluster (idempotent, once per cluster).

Any integration test that creates InferenceConfigs or InferenceRuns can call
``install_crds(cluster)`` first; it applies ``crds/`` server-side, waits until
both CRDs are Established and until kubectl can resolve them (discovery and the
published OpenAPI lag the Established condition by a moment).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from hack.cluster import LocalCluster

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "crds"
CRD_NAMES = ("inferenceconfigs.ai.krateo.io", "inferenceruns.ai.krateo.io")

_installed: set[str] = set()


def install_crds(cluster: LocalCluster, timeout: float = 60.0) -> None:
    if cluster.server in _installed:
        return
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_DIR))
    cluster.kubectl(
        "wait",
        "--for=condition=Established",
        f"--timeout={int(timeout)}s",
        *(f"crd/{name}" for name in CRD_NAMES),
    )
    deadline = time.monotonic() + timeout
    while True:
        probes = [
            cluster.kubectl("explain", f"{kind}.spec", check=False)
            for kind in ("inferencerun", "inferenceconfig")
        ]
        if all(p.returncode == 0 for p in probes):
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"CRDs not resolvable by kubectl: {probes[-1].stderr}")
        time.sleep(0.5)
    _installed.add(cluster.server)


def create(
    cluster: LocalCluster, namespace: str, *objects: dict[str, Any], dry_run: bool = False
) -> subprocess.CompletedProcess[str]:
    """``kubectl create`` the objects in ``namespace``; the result is not checked."""
    # One object goes alone: kubectl validates a List client-side, and the
    # point is what the API server says.
    payload = (
        objects[0]
        if len(objects) == 1
        else {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    )
    body = json.dumps(payload)
    args = ["create", "-n", namespace, "-f", "-", "-o", "name"]
    if dry_run:
        args.append("--dry-run=server")
    return cluster.kubectl(*args, input=body, check=False)


def get_json(cluster: LocalCluster, namespace: str, *what: str) -> dict[str, Any]:
    done = cluster.kubectl("get", "-n", namespace, "-o", "json", *what)
    result: dict[str, Any] = json.loads(done.stdout)
    return result
