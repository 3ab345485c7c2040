"""Install this repository's CRDs into a cluster (idempotent, once per cluster).

``install_crds(cluster)`` applies ``crds/`` server-side, waits until both CRDs
are Established and until kubectl can resolve them (discovery and the
published OpenAPI lag the Established condition by a moment).
"""

from __future__ import annotations

import time
from pathlib import Path

from hack.cluster import LocalCluster

REPO = Path(__file__).resolve().parents[1]
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
