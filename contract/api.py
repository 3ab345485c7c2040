"""The names a client of the API reads: what the controller and ``kubectl infer`` share.

The labels the controller puts on every child of a run (so a client finds a
run's Jobs and pods by label, never by recomputing their names) and the name
of the runner's container in a run's pods. The controller defines its objects
with these (``controller.naming``, ``controller.render`` re-export them); the
kubectl plugin reads the objects with them. The two custom resources
themselves (group, version, kinds, plurals, the ``RUNS``/``CONFIGS``
descriptors) are the API client's, ``kubeclient.resources``, which both
import and which imports nothing of this package.
"""

from __future__ import annotations

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "kserve-inference-controller"
RUN_UID_LABEL = "ai.krateo.io/run-uid"
# Not ours: the label the Job controller puts on each pod of an Indexed Job.
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"

# The runner's container in a run's (and a probe's) pod.
CONTAINER_NAME = "inference"


def managed_selector() -> str:
    """Label selector matching every child of every run (for the informers)."""
    return f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"


def run_selector(run_uid: str) -> str:
    """Label selector matching the children of one run."""
    return f"{managed_selector()},{RUN_UID_LABEL}={run_uid}"
