"""Reading raw Kubernetes objects: keys, owners, a Job's end, times. Pure.

One home for what every part of the controller asks of an object, as
client-go and apimachinery answer it:

- :func:`object_key` / :func:`resource_version`: the cache key
  (``namespace/name``) and the version of an object;
- :func:`controller_of` / :func:`is_controlled_by`: the object's controlling
  owner reference (``metav1.GetControllerOf``, ``metav1.IsControlledBy``);
- :func:`job_outcome` / :func:`job_finished` / :func:`finished_condition`: how
  a Job ended, from its conditions (never from its pod counters). A Job whose
  ``Failed`` or ``FailureTarget`` condition is True has failed; one whose
  ``Complete`` or ``SuccessCriteriaMet`` is True has succeeded
  (``FailureTarget`` and ``SuccessCriteriaMet`` come first: the Job controller
  has decided and only waits for its pods to terminate). A failure is read
  before a success;
- :func:`parse_time`: a Kubernetes Time or MicroTime as an aware datetime.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

JobOutcome = Literal["Succeeded", "Failed"]

# The Job conditions that end it, by outcome, in the order they are read: the
# final one, then the one the Job controller sets as soon as it has decided.
JOB_FAILED = ("Failed", "FailureTarget")
JOB_SUCCEEDED = ("Complete", "SuccessCriteriaMet")


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name``, or ``name`` for a cluster-scoped object (client-go's key)."""
    metadata = obj.get("metadata") or {}
    name = metadata.get("name")
    if not name:
        raise ValueError("object has no metadata.name")
    namespace = metadata.get("namespace")
    return f"{namespace}/{name}" if namespace else str(name)


def resource_version(obj: Mapping[str, Any]) -> str | None:
    metadata = obj.get("metadata") or {}
    value = metadata.get("resourceVersion")
    return str(value) if value else None


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The object's controlling owner reference (``controller: true``), if it has one."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in refs if isinstance(r, Mapping) and r.get("controller")), None)


def is_controlled_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    """Whether the object's controlling owner is the object ``uid``."""
    ref = controller_of(obj)
    return uid is not None and ref is not None and ref.get("uid") == uid


def finished_condition(job: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The condition (status True) that ends the Job, a failure before a success; else None."""
    true = {
        c.get("type"): c
        for c in (job.get("status") or {}).get("conditions") or []
        if isinstance(c, Mapping) and c.get("status") == "True"
    }
    for kind in (*JOB_FAILED, *JOB_SUCCEEDED):
        if kind in true:
            return true[kind]
    return None


def job_outcome(job: Mapping[str, Any]) -> JobOutcome | None:
    """``Succeeded`` or ``Failed`` once the Job has ended (its conditions say so), else None."""
    condition = finished_condition(job)
    if condition is None:
        return None
    return "Failed" if condition.get("type") in JOB_FAILED else "Succeeded"


def job_finished(job: Mapping[str, Any]) -> bool:
    """Whether the Job has ended, succeeded or failed."""
    return finished_condition(job) is not None


def parse_time(value: str | None) -> datetime | None:
    """A Kubernetes Time or MicroTime (RFC 3339, ``Z`` or an offset) as an aware datetime.

    None for none (or an empty string); a time without an offset is UTC.
    Raises ValueError for text that is not a time.
    """
    if not value:
        return None
    moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
