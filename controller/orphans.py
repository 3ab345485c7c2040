"""Which workloads a deleted run leaves behind (pure: no I/O).

A run's workloads are the Jobs and CronJobs the controller made for it. An
object counts as one only when both of these hold:

- it carries the run's uid in the ``ai.krateo.io/run-uid`` label (the
  controller's caches select and index its children by it), and
- its **controlling** owner reference names an ``InferenceRun`` of the
  ``ai.krateo.io`` group with that same uid.

The label alone can be copied by anyone, and an owner reference alone names
objects the controller did not make: nothing else is ever deleted. A scheduled
run's executions (the Jobs its CronJob made) carry the run's label and are
controlled by the CronJob: they are the run's too, found through a CronJob
that is (:func:`owner_cronjob`).

:func:`workloads_of` answers "what must go now that this run is gone";
:func:`orphans` answers the sweep's question, "which runs that own something
are not among the living", for a live read to confirm before anything is
deleted (the caches may lag).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.naming import RUN_UID_LABEL
from kubeclient.objects import controller_of
from kubeclient.resources import GROUP, RUN_KIND, Obj

CRONJOB_KIND = "CronJob"
# A run deleted with propagationPolicy=Orphan carries this finalizer until the
# garbage collector has taken its owner references off the children: the user
# asked for the children to stay.
ORPHAN_FINALIZER = "orphan"


@dataclass(frozen=True, order=True)
class RunRef:
    """A run as its workloads name it: namespace, name (owner reference) and uid."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


def _label_uid(obj: Mapping[str, Any]) -> str | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    uid = labels.get(RUN_UID_LABEL)
    return str(uid) if uid else None


def owning_run(obj: Mapping[str, Any]) -> RunRef | None:
    """The run ``obj`` is a workload of (label and controlling owner agree), else None."""
    uid = _label_uid(obj)
    ref = controller_of(obj)
    if uid is None or ref is None:
        return None
    group = str(ref.get("apiVersion") or "").partition("/")[0]
    if ref.get("kind") != RUN_KIND or group != GROUP or ref.get("uid") != uid:
        return None
    name = ref.get("name")
    namespace = (obj.get("metadata") or {}).get("namespace")
    if not name or not namespace:
        return None
    return RunRef(str(namespace), str(name), uid)


def owner_cronjob(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The controlling owner reference of ``obj`` when it is a CronJob (an execution's)."""
    ref = controller_of(obj)
    if ref is None or ref.get("kind") != CRONJOB_KIND or not ref.get("name"):
        return None
    return ref


def workloads_of(run_uid: str, jobs: Iterable[Obj], cronjobs: Iterable[Obj]) -> list[Obj]:
    """The run's CronJobs, their executions, then its Jobs: what to delete, in that order.

    CronJobs first, so that no execution starts while the others are deleted.
    """
    crons = [c for c in cronjobs if (owner := owning_run(c)) is not None and owner.uid == run_uid]
    cron_uids = {c["metadata"].get("uid") for c in crons}
    jobs = list(jobs)
    executions = [
        j
        for j in jobs
        if _label_uid(j) == run_uid
        and (ref := controller_of(j)) is not None
        and ref.get("kind") == CRONJOB_KIND
        and ref.get("uid") in cron_uids
    ]
    own = [j for j in jobs if (owner := owning_run(j)) is not None and owner.uid == run_uid]
    return [*crons, *executions, *own]


def orphans(workloads: Iterable[Obj], alive: Callable[[str], bool]) -> dict[RunRef, list[Obj]]:
    """The workloads whose run is not ``alive`` (by uid), by run, in a stable order.

    Only the workloads :func:`owning_run` recognises are considered; what is
    returned is a suspicion, to confirm with a live read of each run.
    """
    found: dict[RunRef, list[Obj]] = {}
    for obj in workloads:
        run = owning_run(obj)
        if run is not None and not alive(run.uid):
            found.setdefault(run, []).append(obj)
    return dict(sorted(found.items()))


def keeps_children(run: Mapping[str, Any]) -> bool:
    """Whether a run being deleted asked for its children to stay (``propagationPolicy=Orphan``)."""
    finalizers = (run.get("metadata") or {}).get("finalizers") or []
    return ORPHAN_FINALIZER in finalizers


def is_being_deleted(run: Mapping[str, Any]) -> bool:
    return bool((run.get("metadata") or {}).get("deletionTimestamp"))
