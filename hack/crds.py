"""Install this repository's CRDs into a cluster (idempotent, once per cluster).

``install_crds(cluster)`` applies ``crds/`` server-side, waits until both CRDs
are Established, until kubectl can resolve them and until they can be listed
(discovery, the published OpenAPI and the watch cache lag the Established
condition by a moment).

``install_inferenceservice_crd(cluster)`` installs the **test stand-in** for
KServe's InferenceService CRD (``hack/kserve/``: not KServe's own, only the
fields the controller reads, with a status subresource the tests write as
KServe's controller would); ``remove_inferenceservice_crd(cluster)`` deletes
it again, for tests of a cluster without KServe.
"""

from __future__ import annotations

import time
from pathlib import Path

from hack.cluster import LocalCluster

REPO = Path(__file__).resolve().parents[1]
CRD_DIR = REPO / "crds"
CRD_NAMES = ("inferenceconfigs.ai.krateo.io", "inferenceruns.ai.krateo.io")
# The test stand-in for KServe's InferenceService CRD.
ISVC_CRD = REPO / "hack" / "kserve" / "inferenceservices.serving.kserve.io.yaml"
ISVC_CRD_NAME = "inferenceservices.serving.kserve.io"

_installed: set[str] = set()


def _apply_established(
    cluster: LocalCluster, path: Path, names: tuple[str, ...], timeout: float
) -> None:
    """Apply the CRDs at ``path`` server-side and wait until ``names`` are Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    cluster.kubectl(
        "wait",
        "--for=condition=Established",
        f"--timeout={int(timeout)}s",
        *(f"crd/{name}" for name in names),
    )


def install_crds(cluster: LocalCluster, timeout: float = 60.0) -> None:
    if cluster.server in _installed:
        return
    _apply_established(cluster, CRD_DIR, CRD_NAMES, timeout)
    deadline = time.monotonic() + timeout
    while True:
        # A list too: right after Established the API server may still answer
        # 503 "storage is (re)initializing" while its watch cache fills.
        probes = [
            *(
                cluster.kubectl("explain", f"{kind}.spec", check=False)
                for kind in ("inferencerun", "inferenceconfig")
            ),
            cluster.kubectl("get", "inferenceruns,inferenceconfigs", "-A", check=False),
        ]
        if all(p.returncode == 0 for p in probes):
            break
        if time.monotonic() > deadline:
            failed = next(p for p in probes if p.returncode != 0)
            raise AssertionError(f"CRDs not resolvable by kubectl: {failed.stderr}")
        time.sleep(0.5)
    _installed.add(cluster.server)


_isvc_installed: set[str] = set()


def install_inferenceservice_crd(cluster: LocalCluster, timeout: float = 60.0) -> None:
    """The test stand-in InferenceService CRD, Established and served (once per cluster)."""
    if cluster.server in _isvc_installed:
        return
    _apply_established(cluster, ISVC_CRD, (ISVC_CRD_NAME,), timeout)
    deadline = time.monotonic() + timeout
    while cluster.kubectl("get", "inferenceservices", "-A", check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise AssertionError("the InferenceService CRD is not served")
        time.sleep(0.5)
    _isvc_installed.add(cluster.server)


def remove_inferenceservice_crd(cluster: LocalCluster, timeout: float = 60.0) -> None:
    """Delete the InferenceService CRD (and every InferenceService), waiting until it is gone."""
    _isvc_installed.discard(cluster.server)
    cluster.kubectl(
        "delete", "crd", ISVC_CRD_NAME, "--ignore-not-found", "--wait", f"--timeout={int(timeout)}s"
    )
