"""What ``kubectl infer`` builds, shows and decides: pure functions, no I/O.

The plugin itself (:mod:`kubectl_infer.cli`) only talks to the API
server; everything it sends (a new run, a re-run, a Job started from a
CronJob) and everything it prints (status lines, events, the runs table, the
exit code) comes from here, so it is tested without a cluster.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

from contract.api import COMPLETION_INDEX_LABEL
from kubeclient import objects
from kubeclient.resources import RUNS

Obj = dict[str, Any]

RERUN_OF_ANNOTATION = "ai.krateo.io/rerun-of"
# What kubectl create job --from=cronjob/... puts on the Job it makes.
INSTANTIATE_ANNOTATION = "cronjob.kubernetes.io/instantiate"
FINISHED_PHASES = ("Succeeded", "Failed")


class Exit(enum.IntEnum):
    """The plugin's exit code, by the outcome of what it followed."""

    SUCCEEDED = 0
    FAILED = 1
    USAGE = 2  # argparse's own code for a bad command line
    ERROR = 3  # the run cannot go on as it is (invalid spec, missing or bad config, refused)
    TIMEOUT = 4  # --timeout passed before the run finished
    DELETED = 5  # the run (or the Job followed) was deleted while followed
    NOT_FOUND = 6  # nothing of that name, or the wrong kind of run for the command
    NO_KUBECONFIG = 7  # --kubeconfig (or every file of $KUBECONFIG) does not exist
    BAD_KUBECONFIG = 8  # a kubeconfig that cannot be read: not YAML, or not a kubeconfig
    NO_CONTEXT = 9  # --context (or the current context) is not in the kubeconfig


# What ``kubectl infer`` calls a run on the command line and in ``-o name``.
RESOURCE = f"{RUNS.kind.lower()}.{RUNS.group}"
OUTPUT_FORMATS = ("json", "yaml", "name")


class UsageError(ValueError):
    """A command line that names something impossible; the message says what to do."""


# ------------------------------------------------------------------------- building


def parse_parameters(pairs: Sequence[str]) -> dict[str, str]:
    """``["k=v", ...]`` as a dict; a pair without ``=``, an empty or repeated key is an error."""
    parameters: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"parameter {pair!r} is not KEY=VALUE")
        if key in parameters:
            raise UsageError(f"parameter {key!r} is given twice")
        parameters[key] = value
    return parameters


def new_run(
    *,
    config: str,
    name: str | None = None,
    config_namespace: str | None = None,
    parameters: Mapping[str, str] | None = None,
    timeout_seconds: int | None = None,
    parallelism: int | None = None,
    backoff_limit: int | None = None,
    schedule: str | None = None,
) -> Obj:
    """An InferenceRun of ``config``; unnamed, the API server names it ``<config>-xxxxx``."""
    config_ref: Obj = {"name": config}
    if config_namespace:
        config_ref["namespace"] = config_namespace
    spec: Obj = {"configRef": config_ref}
    if parameters:
        spec["parameters"] = dict(parameters)
    optional = {
        "timeoutSeconds": timeout_seconds,
        "parallelism": parallelism,
        "backoffLimit": backoff_limit,
        "schedule": schedule,
    }
    spec.update({key: value for key, value in optional.items() if value is not None})
    metadata: Obj = {"name": name} if name else {"generateName": f"{config[:57]}-"}
    return {
        "apiVersion": RUNS.api_version,
        "kind": RUNS.kind,
        "metadata": metadata,
        "spec": spec,
    }


def rerun_of(run: Mapping[str, Any], name: str | None = None) -> Obj:
    """A new run doing what ``run`` did: its spec, labels and a note of where it came from."""
    meta = run.get("metadata") or {}
    original = str(meta.get("name", ""))
    metadata: Obj = {"name": name} if name else {"generateName": f"{original[:57]}-"}
    labels = meta.get("labels")
    if labels:
        metadata["labels"] = dict(labels)
    metadata["annotations"] = {RERUN_OF_ANNOTATION: original}
    spec = dict(run.get("spec") or {})  # everything the run says about what to do
    return {
        "apiVersion": run.get("apiVersion", RUNS.api_version),
        "kind": RUNS.kind,
        "metadata": metadata,
        "spec": spec,
    }


def suspend_patch(suspend: bool) -> Obj:
    """The merge patch ``kubectl infer suspend``/``resume`` sends."""
    return {"spec": {"suspend": suspend}}


def manual_job_name(cronjob_name: str, token: str) -> str:
    """``<cronjob>-m<token>``: at most 63 characters, apart from the CronJob's own Job names."""
    suffix = f"-m{token}"
    return f"{cronjob_name[: 63 - len(suffix)]}{suffix}"


def job_from_cronjob(cronjob: Mapping[str, Any], name: str) -> Obj:
    """The Job ``kubectl create job NAME --from=cronjob/...`` makes, owned by the CronJob."""
    meta = cronjob.get("metadata") or {}
    template = (cronjob.get("spec") or {}).get("jobTemplate") or {}
    template_meta = template.get("metadata") or {}
    annotations = {**(template_meta.get("annotations") or {}), INSTANTIATE_ANNOTATION: "manual"}
    metadata: Obj = {
        "name": name,
        "namespace": meta.get("namespace"),
        "annotations": annotations,
        "ownerReferences": [
            {
                "apiVersion": "batch/v1",
                "kind": "CronJob",
                "name": meta.get("name"),
                "uid": meta.get("uid"),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if template_meta.get("labels"):
        metadata["labels"] = dict(template_meta["labels"])
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": template.get("spec") or {},
    }


# ------------------------------------------------------------------------- deciding


def is_scheduled(run: Mapping[str, Any]) -> bool:
    return bool((run.get("spec") or {}).get("schedule"))


def run_outcome(run: Mapping[str, Any]) -> Exit | None:
    """How following a one-shot run ends: None while it may still go on.

    ``Error`` is final for the plugin: the controller says the run cannot go on
    until someone changes it (its ``Stalled`` condition), so waiting longer
    would only hide that.
    """
    status = run.get("status") or {}
    phase = status.get("phase")
    if phase == "Succeeded":
        return Exit.SUCCEEDED
    if phase == "Failed":
        return Exit.FAILED
    if phase == "Error":
        return Exit.ERROR
    return None


def is_suspended(run: Mapping[str, Any]) -> bool:
    return bool((run.get("spec") or {}).get("suspend"))


def shard_count(run: Mapping[str, Any]) -> int:
    """How many shards (pods at a time) the run asks for: ``spec.parallelism``, else 1."""
    value = (run.get("spec") or {}).get("parallelism")
    return value if isinstance(value, int) and value > 0 else 1


def check_shard(run: Mapping[str, Any], shard: int | None) -> None:
    """``--shard N`` must name one of the run's shards (0 to parallelism - 1)."""
    if shard is None:
        return
    count = shard_count(run)
    if not 0 <= shard < count:
        name = (run.get("metadata") or {}).get("name")
        raise UsageError(
            f"--shard {shard}: {name!r} has {count} shard{'s' if count > 1 else ''} "
            f"(0 to {count - 1})"
        )


def pod_shard(pod: Mapping[str, Any]) -> int:
    """The shard a runner pod works on (the Indexed Job's completion index; 0 if not indexed)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = labels.get(COMPLETION_INDEX_LABEL) or annotations.get(COMPLETION_INDEX_LABEL)
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def log_pods(
    pods: Iterable[Mapping[str, Any]], *, shard: int | None = None
) -> list[Mapping[str, Any]]:
    """The pods whose logs ``kubectl infer logs`` prints, in order: by shard, then oldest first;
    only ``shard``'s when one is given."""
    chosen = [p for p in pods if shard is None or pod_shard(p) == shard]
    return sorted(
        chosen,
        key=lambda p: (
            pod_shard(p),
            (p.get("metadata") or {}).get("creationTimestamp") or "",
            (p.get("metadata") or {}).get("name") or "",
        ),
    )


def job_outcome(job: Mapping[str, Any]) -> Exit | None:
    """A Job's end from its conditions (kubeclient.objects.job_outcome), None while it runs."""
    outcome = objects.job_outcome(job)
    if outcome is None:
        return None
    return Exit.SUCCEEDED if outcome == "Succeeded" else Exit.FAILED


def newest_job(jobs: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The Job created last (name breaks ties, so the choice is stable)."""
    ordered = sorted(
        jobs,
        key=lambda j: (
            (j.get("metadata") or {}).get("creationTimestamp") or "",
            (j.get("metadata") or {}).get("name") or "",
        ),
    )
    return ordered[-1] if ordered else None


# -------------------------------------------------------------------------- showing


def status_line(run: Mapping[str, Any]) -> str:
    """One line of what a run is doing: phase, progress, and why when something is wrong."""
    status = run.get("status") or {}
    parts = [f"phase={status.get('phase') or 'Pending'}"]
    progress = status.get("progress") or {}
    if progress:
        parts.append(f"progress={_progress(progress)}")
    reason = status.get("reason")
    if reason and reason not in (status.get("phase"), "Completed"):
        parts.append(f"reason={reason}")
    execution = status.get("lastExecution") or {}
    if execution:
        parts.append(f"last={execution.get('name')}:{execution.get('phase')}")
    line = " ".join(parts)
    if status.get("message"):
        line += f": {status['message']}"
    return line


def result_line(run: Mapping[str, Any]) -> str:
    """The final word on a finished run."""
    status = run.get("status") or {}
    result = status.get("result")
    if status.get("phase") == "Succeeded" and result:
        return (
            f"succeeded: {result.get('rows', 0)} rows, {result.get('predictions', 0)} "
            f"predictions in {_seconds(result.get('durationSeconds'))}"
        )
    reason = status.get("reason") or status.get("phase") or "unknown"
    message = status.get("message")
    return f"{str(status.get('phase') or 'ended').lower()}: {reason}" + (
        f": {message}" if message else ""
    )


def event_line(event: Mapping[str, Any]) -> str:
    """``Warning  Reason  message`` as kubectl describe lists Events."""
    kind = event.get("type") or "Normal"
    count = event.get("count") or (event.get("series") or {}).get("count")
    times = f" (x{count})" if isinstance(count, int) and count > 1 else ""
    return f"event: {kind:<7} {event.get('reason', '')}{times}: {event.get('message', '')}"


def check_output(output: str | None, *, following: bool) -> None:
    """``-o json|yaml`` prints one document: it cannot be mixed with following lines."""
    if output in ("json", "yaml") and following:
        raise UsageError(f"-o {output} prints the run, not its progress: leave out --watch")


def render(objects: Sequence[Mapping[str, Any]], output: str, *, as_list: bool) -> str:
    """Runs as ``kubectl get -o json|yaml|name`` prints them.

    ``as_list``: a ``List`` document (what ``list`` prints, even of no runs), else the one
    object. Objects read from a list have no ``apiVersion``/``kind``; they get them back.
    """
    if output not in OUTPUT_FORMATS:
        raise UsageError(f"-o {output}: the formats are {', '.join(OUTPUT_FORMATS)}")
    full = [{"apiVersion": RUNS.api_version, "kind": RUNS.kind, **dict(obj)} for obj in objects]
    if output == "name":
        return "\n".join(f"{RESOURCE}/{obj['metadata']['name']}" for obj in full)
    document: Any
    if as_list:
        document = {
            "apiVersion": "v1",
            "kind": "List",
            "items": full,
            "metadata": {"resourceVersion": ""},
        }
    else:
        (document,) = full
    if output == "json":
        return json.dumps(document, indent=4)
    return str(yaml.safe_dump(document, default_flow_style=False, sort_keys=True)).rstrip("\n")


def runs_table(runs: Sequence[Mapping[str, Any]], *, now: dt.datetime, all_namespaces: bool) -> str:
    """``kubectl infer list``: one row per run, with its last result."""
    header = ["NAME", "CONFIG", "PHASE", "PROGRESS", "LAST RESULT", "AGE"]
    if all_namespaces:
        header.insert(0, "NAMESPACE")
    rows = [header]
    ordered = sorted(
        runs,
        key=lambda r: ((r.get("metadata") or {}).get("namespace") or "", r["metadata"]["name"]),
    )
    for run in ordered:
        meta = run.get("metadata") or {}
        status = run.get("status") or {}
        row = [
            str(meta.get("name")),
            str(((run.get("spec") or {}).get("configRef") or {}).get("name", "")),
            str(status.get("phase") or "Pending"),
            _progress(status.get("progress") or {}) or "-",
            _last_result(run),
            _age(meta.get("creationTimestamp"), now),
        ]
        if all_namespaces:
            row.insert(0, str(meta.get("namespace", "")))
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _last_result(run: Mapping[str, Any]) -> str:
    status = run.get("status") or {}
    if is_scheduled(run):
        execution = status.get("lastExecution") or {}
        if not execution:
            return "no execution yet"
        return f"{execution.get('name')} {execution.get('phase')}"
    phase = status.get("phase")
    result = status.get("result")
    if phase == "Succeeded" and result:
        return (
            f"{result.get('rows', 0)} rows, {result.get('predictions', 0)} predictions, "
            f"{_seconds(result.get('durationSeconds'))}"
        )
    if phase in ("Failed", "Error"):
        return str(status.get("reason") or phase)
    return "-"


def _progress(progress: Mapping[str, Any]) -> str:
    if not progress:
        return ""
    if progress.get("summary"):
        return str(progress["summary"])
    done, total = progress.get("rowsDone", 0), progress.get("rowsTotal")
    return f"{done}/{total}" if total else str(done)


def _seconds(value: Any) -> str:
    try:
        return f"{float(value):.1f}s"
    except (TypeError, ValueError):
        return "?"


def _age(timestamp: Any, now: dt.datetime) -> str:
    """kubectl's short age: ``42s``, ``7m``, ``3h``, ``2d``."""
    try:
        created = objects.parse_time(timestamp) if isinstance(timestamp, str) else None
    except ValueError:
        created = None
    if created is None:
        return "?"
    seconds = max(0, int((now - created).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
