"""CRD helpers for tests: :func:`hack.crds.install_crds` and ways to create objects."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from hack.cluster import LocalCluster
from hack.crds import CRD_DIR, CRD_NAMES, install_crds

__all__ = ["CRD_DIR", "CRD_NAMES", "install_crds"]


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
