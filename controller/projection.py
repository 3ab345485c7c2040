"""What the caches keep of each kind: projections (client-go's ``SetTransform``).

Every object an informer caches goes through one of these first (list,
watch event, or an own write put into the cache with ``assume``), so the
controller holds only the fields something here reads, not the whole object
the API server sends (a Job is about 13 KB of parsed Python objects; what
the controller reads of it, under 1 KB). The readers, and what they read:

- **runs, configs** (``InferenceRun``/``InferenceConfig.model_validate`` in
  ``controller.reconcile``/``controller.config_reconcile``, the config index,
  the phase gauge, Events about them, status writes): ``apiVersion``,
  ``kind``, ``spec`` and ``status`` whole, and the metadata of
  :data:`OBJECT_META` (their labels, annotations and owners are never read;
  the finalizers of one being deleted are kept, because ``orphan`` among them
  says its children must stay, see ``controller.orphans``). A status write
  PUTs ``{**cached, "status": new}`` to the status subresource, where the
  API server keeps everything of the stored object but its status and checks
  ``metadata.resourceVersion``: the projection keeps name, namespace, uid
  and resourceVersion, so the write is the same.
- **Jobs, CronJobs** (``controller.plan``: children by owner, drift by the
  desired-hash annotation, ``suspend``; ``controller.status``: the Job's
  conditions, start and completion times, its ``failed`` and ``succeeded``
  counters and the pods not in them yet (``uncountedTerminatedPods``: how
  many attempts wrote the output), the CronJob's ``active`` and
  ``lastScheduleTime``; ``controller.probe``: a probe Job's conditions and
  generation annotation; the indexes): metadata with the labels of
  :data:`LABELS`, the annotations of :data:`ANNOTATIONS` and the owner
  references, ``spec.suspend`` (a Job's ``backoffLimit``,
  ``backoffLimitPerIndex`` and ``podFailurePolicy`` too: whether a failed pod
  fails it) and those status fields.
- **ConfigMaps** (found by owner, drift by the desired-hash annotation, the
  config version of the contract by its annotations (``controller.plan``);
  ``binaryData`` only for whether it is there): metadata as for Jobs and
  ``binaryData`` as an empty mapping when present. The contract
  (``data``) is rendered, never read back.
- **Pods** (``controller.status``/``controller.probe``: the runner container's
  state, the PodScheduled, Ready and DisruptionTarget conditions, whether the
  pod is being deleted, its node and memory limit; the progress reader: which
  runner runs, its namespace, name and completion index): metadata as for
  Jobs, ``spec.nodeName``, each container's ``resources.limits.memory`` (by
  name, only when set), ``status.phase``, ``status.containerStatuses`` (name
  and state: running; terminated exit code, reason (``OOMKilled``), message
  and finish time; waiting reason and message) and ``status.conditions``
  (type, status, reason, message).

Everything else a reader looks at is absent, which the readers already take
as "not set" (``.get``): a projection changes what is kept, never what a
reader concludes. Strings many objects repeat (namespaces, kinds, label keys
and values, uids, condition reasons, timestamps, contract settings) are
interned, so every cached object shares one copy. A projection never returns
its input's dicts or lists: the raw object of a watch event or a list page is
not kept alive.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from controller.naming import (
    COMPLETION_INDEX_LABEL,
    CONFIG_GENERATION_ANNOTATION,
    CONFIG_RESOURCE_VERSION_ANNOTATION,
    CONFIG_UID_LABEL,
    DESIRED_HASH_ANNOTATION,
    KUEUE_QUEUE_LABEL,
    POD_START_FAILED_ANNOTATION,
    PROBE_GENERATION_ANNOTATION,
    RUN_SPEC_HASH_ANNOTATION,
    RUN_UID_LABEL,
)
from kubeclient.resources import Obj

# metadata fields the readers of every kind use.
OBJECT_META = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
)
# Labels read from children: the indexes (run, config), the pods' Job and shard,
# and the Kueue queue a Job waits in (its status is Queued, not Suspended).
JOB_NAME_LABEL = "job-name"
LABELS = frozenset(
    {RUN_UID_LABEL, CONFIG_UID_LABEL, JOB_NAME_LABEL, COMPLETION_INDEX_LABEL, KUEUE_QUEUE_LABEL}
)
# Annotations read from children: drift, the spec a Job was made from, a probe's
# generation, the config version a run's contract was rendered from.
ANNOTATIONS = frozenset(
    {
        DESIRED_HASH_ANNOTATION,
        RUN_SPEC_HASH_ANNOTATION,
        PROBE_GENERATION_ANNOTATION,
        CONFIG_GENERATION_ANNOTATION,
        CONFIG_RESOURCE_VERSION_ANNOTATION,
        POD_START_FAILED_ANNOTATION,
    }
)
OWNER_FIELDS = ("apiVersion", "kind", "name", "uid", "controller")
CONDITION_FIELDS = ("type", "status", "reason", "message", "lastTransitionTime")
POD_CONDITION_FIELDS = ("type", "status", "reason", "message")
TERMINATED_FIELDS = ("exitCode", "reason", "message", "finishedAt")
WAITING_FIELDS = ("reason", "message")
# The counters tell how many pods a Job has run: more than one attempt wrote the output.
JOB_STATUS_FIELDS = ("startTime", "completionTime", "failed", "succeeded")
# A failed pod's fate is read from these before the Job controller writes it.
JOB_SPEC_FIELDS = ("backoffLimit", "backoffLimitPerIndex", "podFailurePolicy")

Projection = Callable[[Obj], Obj | None]


def intern(value: Any) -> Any:
    """``value`` itself, or the one shared copy of it when it is a string."""
    return sys.intern(value) if type(value) is str else value


def _pick(source: Mapping[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    """The ``fields`` that ``source`` has (the names are constants), strings interned."""
    return {
        k: sys.intern(v) if type(v) is str else v
        for k in fields
        if k in source
        for v in (source[k],)
    }


def _type_meta(obj: Obj) -> dict[str, Any]:
    return _pick(obj, ("apiVersion", "kind"))


def _strings(values: Mapping[str, Any], keep: frozenset[str]) -> dict[str, Any]:
    return {sys.intern(k): intern(v) for k, v in values.items() if k in keep}


def object_meta(metadata: Mapping[str, Any], *, children: bool) -> dict[str, Any]:
    """The metadata a reader uses; for children also the labels, annotations and owners read."""
    meta = _pick(metadata, OBJECT_META)
    if not children:
        return meta
    labels = metadata.get("labels")
    if isinstance(labels, dict):
        kept = _strings(labels, LABELS)
        if kept:
            meta["labels"] = kept
    annotations = metadata.get("annotations")
    if isinstance(annotations, dict):
        kept = _strings(annotations, ANNOTATIONS)
        if kept:
            meta["annotations"] = kept
    owners = metadata.get("ownerReferences")
    if isinstance(owners, list):
        meta["ownerReferences"] = [
            _pick(ref, OWNER_FIELDS) for ref in owners if isinstance(ref, dict)
        ]
    return meta


def _conditions(status: Mapping[str, Any], fields: tuple[str, ...]) -> list[dict[str, Any]]:
    return [_pick(c, fields) for c in status.get("conditions") or [] if isinstance(c, dict)]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# ------------------------------------------------------------------------- the kinds


def shared(value: Any) -> Any:
    """A copy of a JSON value with every string interned (and the dicts and lists new)."""
    if type(value) is str:
        return sys.intern(value)
    if type(value) is dict:
        return {sys.intern(k): shared(v) for k, v in value.items()}
    if type(value) is list:
        return [shared(v) for v in value]
    return value


def project_custom(obj: Obj) -> Obj:
    """An InferenceRun or InferenceConfig: type, the metadata read, spec and status whole.

    Spec and status are copied with their strings interned: condition types,
    reasons and times, the contract's model and storage settings, the Job's
    name and uid repeat across runs and across a run's own children.
    """
    out = _type_meta(obj)
    metadata = _dict(obj.get("metadata"))
    out["metadata"] = object_meta(metadata, children=False)
    finalizers = metadata.get("finalizers")
    if metadata.get("deletionTimestamp") and isinstance(finalizers, list) and finalizers:
        out["metadata"]["finalizers"] = [intern(f) for f in finalizers]
    for part in ("spec", "status"):
        if part in obj:
            out[part] = shared(obj[part])
    return out


def _child(obj: Obj, status: dict[str, Any] | None = None) -> Obj:
    """What every child keeps: its type, the metadata read, ``spec.suspend`` when it has
    one (Jobs, CronJobs) and ``status`` (the fields kept of it) unless nothing was."""
    out = _type_meta(obj)
    out["metadata"] = object_meta(_dict(obj.get("metadata")), children=True)
    spec = _dict(obj.get("spec"))
    if "suspend" in spec:
        out["spec"] = {"suspend": spec["suspend"]}
    if obj.get("kind") == "Job":
        # Whether a failed pod fails the Job (controller.status.job_will_fail).
        kept_spec = {k: shared(spec[k]) for k in JOB_SPEC_FIELDS if k in spec}
        if kept_spec:
            out["spec"] = {**out.get("spec", {}), **kept_spec}
    if status:
        out["status"] = status
    return out


def project_job(obj: Obj) -> Obj:
    status = _dict(obj.get("status"))
    kept = _pick(status, JOB_STATUS_FIELDS)
    uncounted = _dict(status.get("uncountedTerminatedPods"))
    if uncounted.get("failed") or uncounted.get("succeeded"):
        # Pods that ended and are not in the counters yet: counted, by uid.
        kept["uncountedTerminatedPods"] = {
            kind: [intern(uid) for uid in uncounted[kind]]
            for kind in ("failed", "succeeded")
            if isinstance(uncounted.get(kind), list) and uncounted[kind]
        }
    if status.get("conditions"):
        kept["conditions"] = _conditions(status, CONDITION_FIELDS)
    return _child(obj, kept)


def project_cronjob(obj: Obj) -> Obj:
    status = _dict(obj.get("status"))
    kept = _pick(status, ("lastScheduleTime",))
    if status.get("active"):
        # Read only for whether a Job is running: who, by name and uid.
        kept["active"] = [
            _pick(ref, ("name", "uid")) for ref in status["active"] if isinstance(ref, dict)
        ]
    return _child(obj, kept)


def project_configmap(obj: Obj) -> Obj:
    out = _child(obj)
    if "binaryData" in obj:
        # Read only for whether it is there (an update then clears it).
        out["binaryData"] = {}
    return out


def _container_status(status: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": intern(status.get("name"))}
    state = _dict(status.get("state"))
    kept: dict[str, Any] = {}
    if "running" in state:
        kept["running"] = _pick(_dict(state["running"]), ("startedAt",))
    if "terminated" in state:
        kept["terminated"] = _pick(_dict(state["terminated"]), TERMINATED_FIELDS)
    if "waiting" in state:
        kept["waiting"] = _pick(_dict(state["waiting"]), WAITING_FIELDS)
    out["state"] = kept
    return out


def _pod_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The node a pod is bound to and each container's memory limit (what an OOM kill names)."""
    out = _pick(spec, ("nodeName",))
    containers = []
    for container in spec.get("containers") or []:
        if not isinstance(container, dict):
            continue
        limits = _dict(_dict(container.get("resources")).get("limits"))
        if "memory" in limits:
            containers.append(
                {
                    "name": intern(container.get("name")),
                    "resources": {"limits": {"memory": intern(limits["memory"])}},
                }
            )
    if containers:
        out["containers"] = containers
    return out


def project_pod(obj: Obj) -> Obj:
    status = _dict(obj.get("status"))
    kept: dict[str, Any] = {}
    # Every container: a probe pod that cannot start is told by any container's waiting state.
    containers = [
        _container_status(s) for s in status.get("containerStatuses") or [] if isinstance(s, dict)
    ]
    if containers:
        kept["containerStatuses"] = containers
    if status.get("conditions"):
        kept["conditions"] = _conditions(status, POD_CONDITION_FIELDS)
    if status.get("phase"):
        kept["phase"] = intern(status["phase"])
    out = _child(obj, kept)
    spec = _pod_spec(_dict(obj.get("spec")))
    if spec:
        out["spec"] = spec
    return out


def unchanged(old: Obj, new: Obj) -> bool:
    """Whether two projections of one object differ only in ``metadata.resourceVersion``.

    Then whatever changed (a pod's IP, a Job's ``active`` count, a finalizer
    the Job controller removed) is nothing any reader of the cache reads: the
    update is no reason to reconcile.
    """
    if old.keys() != new.keys():
        return False
    for part, value in new.items():
        if part != "metadata" and old[part] != value:
            return False
    before, after = old.get("metadata"), new.get("metadata")
    if not isinstance(before, dict) or not isinstance(after, dict):
        return before == after
    if before.keys() != after.keys():
        return False
    return all(before[k] == v for k, v in after.items() if k != "resourceVersion")


PROJECTIONS: dict[str, Projection] = {
    "InferenceRun": project_custom,
    "InferenceConfig": project_custom,
    "Job": project_job,
    "CronJob": project_cronjob,
    "ConfigMap": project_configmap,
    "Pod": project_pod,
}


def projection(kind: str) -> Projection:
    """The projection of the cached ``kind``."""
    return PROJECTIONS[kind]
