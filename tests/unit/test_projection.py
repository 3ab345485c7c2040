"""The cache projections keep exactly what the controller reads.

Objects are built as the API server serves them (managedFields, server
defaults, the Job controller's labels, finalizers and status counters, full
pod specs and container statuses); the real readers (``plan``,
``derive_status``, ``plan_config``, the indexes, the reconciler's helpers,
Events) run on the full objects and on their projections, and must conclude
the same, field for field.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from controller.api import InferenceConfig, InferenceRun
from controller.caches import config_index, config_uid_index, run_uid_index, uid_index
from controller.naming import (
    COMPLETION_INDEX_LABEL,
    DESIRED_HASH_ANNOTATION,
    POD_START_FAILED_ANNOTATION,
    PROBE_GENERATION_ANNOTATION,
    RUN_SPEC_HASH_ANNOTATION,
)
from controller.orphans import owning_run
from controller.plan import Plan, View, plan, run_spec_hash, wants_job_events
from controller.probe import ConfigView, plan_config
from controller.projection import (
    PROJECTIONS,
    project_configmap,
    project_cronjob,
    project_custom,
    project_job,
    project_pod,
    projection,
)
from controller.reconcile import _runner_running
from controller.render import desired_configmap, desired_probe, desired_workload
from kubeclient.events import InvolvedObject
from kubeclient.informer import LAST_APPLIED, slim
from kubeclient.objects import controller_of, is_controlled_by, object_key, resource_version
from tests.unit.helpers import CONFIG_UID, NOW
from tests.unit.helpers import UID as RUN_UID

CREATED = "2026-11-23T11:58:00Z"

Obj = dict[str, Any]


def managed_fields(manager: str) -> list[Obj]:
    return [
        {
            "manager": manager,
            "operation": "Update",
            "apiVersion": "v1",
            "time": CREATED,
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:a": {}}}, "f:spec": {}},
        }
    ]


def served_config(**status: Any) -> Obj:
    spec = {
        "image": "runner:1",
        "autoDeletePolicy": "None",
        "kserve": {"modelUrl": "127.0.0.1:1/v2/models/m/infer", "modelName": "m"},
        "storage": {"input": {"http": {"url": "http://in"}}},
    }
    return {
        "apiVersion": "ai.krateo.io/v1",
        "kind": "InferenceConfig",
        "metadata": {
            "name": "cfg",
            "namespace": "ns",
            "uid": CONFIG_UID,
            "generation": 2,
            "resourceVersion": "41",
            "creationTimestamp": "2026-11-23T11:00:00Z",
            "labels": {"team": "ml"},
            "annotations": {LAST_APPLIED: orjson.dumps({"spec": spec}).decode(), "note": "x"},
            "managedFields": managed_fields("kubectl-client-side-apply"),
        },
        "spec": spec,
        "status": status,
    }


def served_run(status: Obj | None = None, **spec: Any) -> Obj:
    full_spec = {"configRef": {"name": "cfg"}, "suspend": False, "parameters": {"k": "v"}, **spec}
    return {
        "apiVersion": "ai.krateo.io/v1",
        "kind": "InferenceRun",
        "metadata": {
            "name": "r",
            "namespace": "ns",
            "uid": RUN_UID,
            "generation": 1,
            "resourceVersion": "77",
            "creationTimestamp": "2026-11-23T11:57:00Z",
            "labels": {"app": "demo"},
            "annotations": {LAST_APPLIED: orjson.dumps({"spec": full_spec}).decode()},
            "finalizers": ["example.com/keep"],
            "managedFields": managed_fields("kubectl") + managed_fields("controller"),
        },
        "spec": full_spec,
        "status": status or {},
    }


def served(obj: Obj, uid: str, *, status: Obj | None = None, labels: Obj | None = None) -> Obj:
    """A rendered child as the API server returns it: defaults, bookkeeping, status."""
    out = copy.deepcopy(obj)
    meta = out["metadata"]
    meta.update(
        uid=uid,
        resourceVersion="101",
        generation=1,
        creationTimestamp=CREATED,
        managedFields=managed_fields("kserve-inference-controller"),
    )
    meta["labels"] = {**meta.get("labels", {}), **(labels or {})}
    for ref in meta.get("ownerReferences", []):
        ref.setdefault("blockOwnerDeletion", True)
    if out["kind"] in ("Job", "CronJob"):
        meta.setdefault("annotations", {})["batch.kubernetes.io/job-tracking"] = ""
        meta["finalizers"] = ["batch.kubernetes.io/job-tracking"]
        spec = out["spec"]
        if out["kind"] == "Job":
            spec.setdefault("completionMode", "NonIndexed")
            spec.update(
                manualSelector=False,
                podReplacementPolicy="TerminatingOrFailed",
                selector={"matchLabels": {"batch.kubernetes.io/controller-uid": uid}},
            )
            pod = spec["template"]["spec"]
        else:
            pod = spec["jobTemplate"]["spec"]["template"]["spec"]
        pod.update(
            dnsPolicy="ClusterFirst",
            restartPolicy=pod.get("restartPolicy", "Never"),
            schedulerName="default-scheduler",
            terminationGracePeriodSeconds=30,
        )
    if status is not None:
        out["status"] = status
    return out


def job_status(*conditions: tuple[str, str, str], **extra: Any) -> Obj:
    return {
        "active": 0,
        "ready": 0,
        "terminating": 0,
        "uncountedTerminatedPods": {},
        "startTime": "2026-11-23T11:58:05Z",
        "conditions": [
            {
                "type": t,
                "status": "True",
                "reason": reason,
                "message": message,
                "lastProbeTime": "2026-11-23T11:59:00Z",
                "lastTransitionTime": "2026-11-23T11:59:00Z",
            }
            for t, reason, message in conditions
        ],
        **extra,
    }


def served_pod(job: str, state: Obj, *, index: str | None = None, **status: Any) -> Obj:
    labels = {
        "app.kubernetes.io/managed-by": "kserve-inference-controller",
        "ai.krateo.io/run-uid": RUN_UID,
        "batch.kubernetes.io/controller-uid": "job-uid",
        "batch.kubernetes.io/job-name": job,
        "controller-uid": "job-uid",
        "job-name": job,
    }
    if index is not None:
        labels[COMPLETION_INDEX_LABEL] = index
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-{index or 'x'}abcd",
            "generateName": f"{job}-",
            "namespace": "ns",
            "uid": f"pod-uid-{index}",
            "resourceVersion": "300",
            "creationTimestamp": CREATED,
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job,
                    "uid": "job-uid",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "finalizers": ["batch.kubernetes.io/job-tracking"],
            "managedFields": managed_fields("kube-controller-manager"),
        },
        "spec": {
            "containers": [{"name": "inference", "image": "runner:1", "args": []}],
            "nodeName": "node-1",
            "restartPolicy": "Never",
        },
        "status": {
            "phase": "Running",
            "hostIP": "10.0.0.1",
            "podIP": "10.1.0.5",
            "qosClass": "Burstable",
            "startTime": CREATED,
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": CREATED},
                *status.pop("conditions", []),
            ],
            "containerStatuses": [
                {
                    "name": "inference",
                    "image": "runner:1",
                    "imageID": "docker.io/runner@sha256:abc",
                    "containerID": "containerd://0123",
                    "ready": "running" in state,
                    "restartCount": 0,
                    "started": "running" in state,
                    "state": state,
                    "lastState": {},
                }
            ],
            **status,
        },
    }


def running() -> Obj:
    return {"running": {"startedAt": "2026-11-23T11:58:10Z"}}


def terminated(code: int, message: str = "") -> Obj:
    return {
        "terminated": {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "message": message,
            "startedAt": "2026-11-23T11:58:10Z",
            "finishedAt": "2026-11-23T11:59:00Z",
            "containerID": "containerd://0123",
        }
    }


def waiting(reason: str) -> Obj:
    return {"waiting": {"reason": reason, "message": f"{reason}: details"}}


def oom_killed() -> Obj:
    state = terminated(137)
    state["terminated"]["reason"] = "OOMKilled"
    return state


def disruption(reason: str) -> Obj:
    return {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": reason,
        "message": f"{reason}: details",
        "lastTransitionTime": CREATED,
    }


def deleted(pod: Obj) -> Obj:
    """``pod`` being deleted, its grace period not over at NOW."""
    pod["metadata"]["deletionTimestamp"] = "2026-11-23T12:30:00Z"
    pod["metadata"]["deletionGracePeriodSeconds"] = 30
    return pod


def with_memory_limit(pod: Obj, limit: str) -> Obj:
    pod["spec"]["containers"][0]["resources"] = {
        "limits": {"cpu": "1", "memory": limit},
        "requests": {"cpu": "100m", "memory": limit},
    }
    return pod


# --------------------------------------------------------------------- scenarios


def config_model() -> InferenceConfig:
    return InferenceConfig.model_validate(served_config())


def children(run_raw: Obj, **job_kw: Any) -> tuple[Obj, Obj]:
    """The run's ConfigMap and Job (or CronJob), as served."""
    run = InferenceRun.model_validate(run_raw)
    config = config_model()
    configmap = served(desired_configmap(run, config), "cm-uid")
    workload = desired_workload(run, config)
    if not run.spec.scheduled:
        workload["metadata"]["annotations"][RUN_SPEC_HASH_ANNOTATION] = run_spec_hash(run)
    return configmap, served(workload, "job-uid", **job_kw)


def with_status(run_raw: Obj, **kw: Any) -> Obj:
    """The run with the status the controller would have written for these children."""
    first = plan(view(run_raw, **kw))
    assert first.status is not None
    return {**run_raw, "status": first.status.to_api()}


def view(run_raw: Obj, config: Obj | None = None, **kw: Any) -> View:
    return View(
        run=InferenceRun.model_validate(run_raw),
        now=NOW,
        config=InferenceConfig.model_validate(config or served_config()),
        **kw,
    )


Scenario = Callable[[], tuple[Obj, dict[str, Any]]]


def one_shot(job_kw: dict[str, Any], pods: list[Obj], **run_kw: Any) -> Scenario:
    def build() -> tuple[Obj, dict[str, Any]]:
        run = served_run(**run_kw)
        configmap, job = children(run, **job_kw)
        kw: dict[str, Any] = {"configmaps": [configmap], "jobs": [job], "pods": pods}
        return run, kw

    return build


def pod_start_cut_scenario() -> tuple[Obj, dict[str, Any]]:
    """The controller cut the Job's deadline for a pod that could not pull its image."""
    run, kw = one_shot(
        {"status": job_status(("Failed", "DeadlineExceeded", "Job was active longer"))}, []
    )()
    kw["jobs"][0]["metadata"]["annotations"][POD_START_FAILED_ANNOTATION] = (
        "ErrImagePull: runner pod p could not start within 600s: no such image"
    )
    return run, kw


RESULT = orjson.dumps({"rows": 10, "predictions": 10, "durationSeconds": 1.5}).decode()
JOB = "inf-r-5be07ada"

SCENARIOS: dict[str, Scenario] = {
    "suspended": one_shot({"status": job_status(("Suspended", "JobSuspended", "suspended"))}, []),
    "pending, no pod": one_shot({"status": job_status()}, []),
    "running": one_shot({"status": job_status(active=1)}, [served_pod(JOB, running())]),
    "succeeded": one_shot(
        {
            "status": job_status(
                ("SuccessCriteriaMet", "CompletionsReached", ""),
                ("Complete", "CompletionsReached", ""),
                completionTime="2026-11-23T11:59:01Z",
                succeeded=1,
            )
        },
        [served_pod(JOB, terminated(0, RESULT))],
    ),
    "succeeded after a retry": one_shot(
        {
            "status": job_status(
                ("SuccessCriteriaMet", "CompletionsReached", ""),
                ("Complete", "CompletionsReached", ""),
                completionTime="2026-11-23T11:59:01Z",
                succeeded=0,
                failed=1,
                # Complete comes before the last pod is counted.
                uncountedTerminatedPods={"succeeded": ["pod-uid-2"]},
            )
        },
        [served_pod(JOB, terminated(5, "output: cut off")), served_pod(JOB, terminated(0, RESULT))],
    ),
    "failed by the runner": one_shot(
        {"status": job_status(("Failed", "PodFailurePolicy", "Container inference failed"))},
        [served_pod(JOB, terminated(3, "the model refused the request"))],
    ),
    "deadline": one_shot(
        {"status": job_status(("Failed", "DeadlineExceeded", "Job was active longer"))},
        [served_pod(JOB, terminated(137))],
    ),
    "retrying": one_shot({"status": job_status(active=1)}, [served_pod(JOB, terminated(1, "x"))]),
    "ended for a pod that could not start": pod_start_cut_scenario,
    # Exit 7: the Job's podFailurePolicy fails it; its controller has not said so yet.
    "rejected, the Job not failed yet": one_shot(
        {"status": job_status(active=1)},
        [served_pod(JOB, terminated(7, "inference: 422"), phase="Failed")],
    ),
    "last retry spent, the Job not failed yet": one_shot(
        {"status": job_status()},
        [served_pod(JOB, terminated(4, "inference: 503"), phase="Failed")],
        backoffLimit=0,
    ),
    "image pull": one_shot({"status": job_status()}, [served_pod(JOB, waiting("ErrImagePull"))]),
    "unschedulable": one_shot(
        {"status": job_status()},
        [
            served_pod(
                JOB,
                waiting("ContainerCreating"),
                conditions=[
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/1 nodes are available",
                        "lastProbeTime": None,
                        "lastTransitionTime": CREATED,
                    }
                ],
            )
        ],
    ),
    "node lost": one_shot(
        {"status": job_status(active=1)},
        [
            deleted(
                served_pod(
                    JOB,
                    running(),
                    conditions=[
                        {"type": "Ready", "status": "False", "lastTransitionTime": CREATED},
                        disruption("DeletionByTaintManager"),
                    ],
                )
            )
        ],
    ),
    "node not ready": one_shot(
        {"status": job_status(active=1)},
        [
            served_pod(
                JOB,
                running(),
                conditions=[{"type": "Ready", "status": "False", "lastTransitionTime": CREATED}],
            )
        ],
    ),
    "evicted": one_shot(
        {"status": job_status(active=1)},
        [served_pod(JOB, running(), conditions=[disruption("EvictionByEvictionAPI")])],
    ),
    "oom killed": one_shot(
        {"status": job_status(("Failed", "BackoffLimitExceeded", "Job has reached the limit"))},
        [with_memory_limit(served_pod(JOB, oom_killed()), "512Mi")],
    ),
    "sharded": one_shot(
        {"status": job_status(active=2)},
        [served_pod(JOB, running(), index="0"), served_pod(JOB, terminated(0, RESULT), index="1")],
        parallelism=2,
    ),
}


def unsuspend() -> tuple[Obj, dict[str, Any]]:
    """The run was unsuspended: its suspended Job gets a patch."""
    run = served_run(suspend=True)
    configmap, job = children(run, status=job_status())
    return {**run, "spec": {**run["spec"], "suspend": False}}, {
        "configmaps": [configmap],
        "jobs": [job],
    }


def edited() -> tuple[Obj, dict[str, Any]]:
    """The run's spec changed after its Job was made: a Warning, no replacement."""
    run = served_run()
    configmap, job = children(run, status=job_status(active=1))
    return {**run, "spec": {**run["spec"], "parameters": {"k": "w"}}}, {
        "configmaps": [configmap],
        "jobs": [job],
    }


def scheduled_drift() -> tuple[Obj, dict[str, Any]]:
    """A scheduled run whose config changed: its ConfigMap and CronJob get patched."""
    run = served_run(schedule="*/5 * * * *")
    configmap, cronjob = children(
        run,
        status={
            "active": [{"kind": "Job", "name": "inf-r-1", "namespace": "ns", "uid": "e-1"}],
            "lastScheduleTime": "2026-11-23T11:55:00Z",
            "lastSuccessfulTime": "2026-11-23T11:50:30Z",
        },
    )
    configmap["metadata"]["annotations"][DESIRED_HASH_ANNOTATION] = "old"
    configmap["binaryData"] = {"contract.json": "e30="}
    cronjob["metadata"]["annotations"][DESIRED_HASH_ANNOTATION] = "old"
    executions = []
    for n, (conds, pod_state) in enumerate(
        [
            ((("Complete", "CompletionsReached", ""),), terminated(0, RESULT)),
            ((("Failed", "BackoffLimitExceeded", "failed"),), terminated(4, "no storage")),
            ((), running()),
        ]
    ):
        name = f"inf-r-{n}"
        execution = served(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {
                    "name": name,
                    "namespace": "ns",
                    "labels": {"ai.krateo.io/run-uid": RUN_UID},
                    "ownerReferences": [
                        {
                            "apiVersion": "batch/v1",
                            "kind": "CronJob",
                            "name": cronjob["metadata"]["name"],
                            "uid": "job-uid",
                            "controller": True,
                        }
                    ],
                },
                "spec": copy.deepcopy(cronjob["spec"]["jobTemplate"]["spec"]),
            },
            f"e-{n}",
            status=job_status(*conds, completionTime=f"2026-11-23T11:5{n}:00Z"),
        )
        execution["metadata"]["creationTimestamp"] = f"2026-11-23T11:5{n}:00Z"
        executions.append((execution, served_pod(name, pod_state)))
    return run, {
        "configmaps": [configmap],
        "cronjobs": [cronjob],
        "executions": [e for e, _ in executions],
        "pods": [p for _, p in executions],
    }


def queued() -> tuple[Obj, dict[str, Any]]:
    """A Job waiting in a Kueue queue (suspended by Kueue, the run is not)."""
    run = served_run()
    configmap, job = children(
        run,
        status=job_status(("Suspended", "JobSuspended", "suspended")),
        labels={"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority": "1"},
    )
    job["spec"]["suspend"] = True
    return run, {"configmaps": [configmap], "jobs": [job]}


def wrong_kind() -> tuple[Obj, dict[str, Any]]:
    run = served_run()
    _, job = children(run, status=job_status())
    return {**run, "spec": {**run["spec"], "schedule": "0 * * * *"}}, {"jobs": [job]}


SCENARIOS |= {
    "unsuspended": unsuspend,
    "edited": edited,
    "scheduled drift": scheduled_drift,
    "schedule added": wrong_kind,
    "queued": queued,
}


def controller_ref_of(obj: Obj) -> tuple[Any, ...] | None:
    """What the reconcilers read of an object's controlling owner reference."""
    ref = controller_of(obj)
    return None if ref is None else tuple(ref.get(k) for k in ("apiVersion", "kind", "name", "uid"))


CHILD_FIELDS = ("configmaps", "jobs", "cronjobs", "executions", "pods")


def project_view_kw(kw: dict[str, Any]) -> dict[str, Any]:
    return {
        k: [projection(o["kind"])(slim(o)) for o in v] if k in CHILD_FIELDS else v
        for k, v in kw.items()
    }


def same_plan(full: Plan, projected: Plan) -> None:
    assert projected.writes == full.writes
    assert projected.confirm == full.confirm
    assert projected.status is not None
    assert full.status is not None
    assert projected.status.to_api() == full.status.to_api()
    assert projected.status_changed == full.status_changed
    assert projected.events == full.events
    assert projected.delete_run == full.delete_run
    assert projected.requeue_after == full.requeue_after


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("recorded", [False, True])
def test_plan_and_status_are_the_same_on_projected_objects(name: str, recorded: bool) -> None:
    run_raw, kw = SCENARIOS[name]()
    if recorded:  # the second pass: the run carries the status the first wrote
        run_raw = with_status(run_raw, **kw)
    config = served_config()
    full = plan(view(run_raw, config, **kw))
    projected = plan(
        view(project_custom(slim(run_raw)), project_custom(slim(config)), **project_view_kw(kw))
    )
    same_plan(full, projected)
    if recorded and name != "unsuspended":
        assert not projected.status_changed  # nothing new: no write, as before


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("rejected, the Job not failed yet", "InferenceRejected"),
        ("last retry spent, the Job not failed yet", "InferenceFailed"),
        ("ended for a pod that could not start", "ErrImagePull"),
    ],
)
def test_a_pod_the_job_fails_on_is_failed_from_projected_objects(name: str, reason: str) -> None:
    # The projection keeps what tells it: the pod's phase, the Job's policy and backoffLimit.
    run_raw, kw = SCENARIOS[name]()
    projected = plan(view(project_custom(slim(run_raw)), **project_view_kw(kw)))
    assert projected.status is not None
    assert (projected.status.phase, projected.status.reason) == ("Failed", reason)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_reconcilers_helpers_read_the_same_from_projected_children(name: str) -> None:
    _, kw = SCENARIOS[name]()
    for field in CHILD_FIELDS:
        for obj in kw.get(field, []):
            small = projection(obj["kind"])(slim(obj))
            for read in (
                object_key,
                resource_version,
                controller_ref_of,
                owning_run,
                run_uid_index,
                config_uid_index,
                uid_index,
            ):
                assert read(small) == read(obj), read
            assert is_controlled_by(small, RUN_UID) == is_controlled_by(obj, RUN_UID)
            if obj["kind"] == "Pod":
                assert _runner_running(small) == _runner_running(obj)
            if obj["kind"] == "Job":
                pods = [projection("Pod")(p) for p in kw.get("pods", [])]
                for now in (NOW, datetime(2026, 11, 23, 11, 58, 1, tzinfo=UTC)):
                    assert wants_job_events(small, pods, now) == wants_job_events(
                        obj, kw.get("pods", []), now
                    )
            assert InvolvedObject.of(small) == InvolvedObject.of(obj)


def test_a_projected_run_or_config_parses_to_the_same_model_but_its_labels() -> None:
    run_raw = with_status(served_run(), **SCENARIOS["running"]()[1])
    for raw in (run_raw, served_config(conditions=[{"type": "Ready", "status": "True"}])):
        small = project_custom(slim(raw))
        model = type_of(raw).model_validate(raw)
        again = type_of(raw).model_validate(small)
        assert again.model_dump(exclude={"metadata": {"labels", "annotations"}}) == (
            model.model_dump(exclude={"metadata": {"labels", "annotations"}})
        )
        assert InvolvedObject.of(small) == InvolvedObject.of(raw)
        # What a status write sends as its base: the key, the precondition, the type.
        for field in ("name", "namespace", "uid", "resourceVersion"):
            assert small["metadata"][field] == raw["metadata"][field]
        assert (small["apiVersion"], small["kind"]) == (raw["apiVersion"], raw["kind"])
    assert config_index(project_custom(run_raw)) == config_index(run_raw) == ["ns/cfg"]


def type_of(raw: Obj) -> type[InferenceRun] | type[InferenceConfig]:
    return InferenceRun if raw["kind"] == "InferenceRun" else InferenceConfig


def probe_children(outcome: str | None, state: Obj | None) -> tuple[list[Obj], list[Obj]]:
    config = config_model()
    _, job = desired_probe(config, "probe-1")
    job["metadata"] = {**job["metadata"], "annotations": {PROBE_GENERATION_ANNOTATION: "2"}}
    conditions = [] if outcome is None else [(outcome, "Done", "the probe finished")]
    served_job = served(job, "probe-job-uid", status=job_status(*conditions))
    pods = [] if state is None else [served_pod("probe-1", state)]
    for pod in pods:
        pod["metadata"]["labels"]["ai.krateo.io/config-uid"] = CONFIG_UID
    return [served_job], pods


@pytest.mark.parametrize(
    ("outcome", "state"),
    [
        (None, None),
        (None, running()),
        (None, waiting("ImagePullBackOff")),
        ("Complete", terminated(0, "all good")),
        ("Failed", terminated(5, "no such model")),
        ("Failed", None),
    ],
)
def test_a_config_probe_is_planned_the_same_on_projected_objects(
    outcome: str | None, state: Obj | None
) -> None:
    raw = served_config(
        conditions=[
            {
                "type": "Probed",
                "status": "True",
                "reason": "ProbeSucceeded",
                "message": "",
                "lastTransitionTime": "2026-11-23T10:00:00Z",
                "observedGeneration": 1,
            }
        ],
        lastProbeTime="2026-11-23T10:00:00Z",
    )
    jobs, pods = probe_children(outcome, state)

    def config_view(raw: Obj, jobs: list[Obj], pods: list[Obj]) -> ConfigView:
        return ConfigView(
            raw=raw,
            now=NOW,
            config=InferenceConfig.model_validate(raw),
            probe_interval=600.0,
            probe_jobs=jobs,
            probe_pods=pods,
        )

    full = plan_config(config_view(raw, jobs, pods))
    small = plan_config(
        config_view(
            project_custom(slim(raw)),
            [project_job(slim(j)) for j in jobs],
            [project_pod(slim(p)) for p in pods],
        )
    )
    assert small.status.to_api() == full.status.to_api()
    assert small.status_changed == full.status_changed
    assert small.events == full.events
    assert small.requeue_after == full.requeue_after
    assert [object_key(j) for j in small.delete] == [object_key(j) for j in full.delete]
    assert small.create == full.create


# ------------------------------------------------------------------- the shapes


def every_served_object() -> list[Obj]:
    objs: list[Obj] = [served_run(), served_config()]
    for build in SCENARIOS.values():
        run, kw = build()
        objs.append(run)
        for field in CHILD_FIELDS:
            objs.extend(kw.get(field, []))
    return objs


def test_projections_drop_what_nobody_reads() -> None:
    run_raw, kw = SCENARIOS["succeeded"]()
    job = project_job(kw["jobs"][0])
    assert set(job) == {"apiVersion", "kind", "metadata", "spec", "status"}
    assert set(job["spec"]) == {"suspend", "backoffLimit", "podFailurePolicy"}
    assert set(job["status"]) == {"startTime", "completionTime", "conditions", "succeeded"}
    assert set(job["metadata"]["labels"]) == {"ai.krateo.io/run-uid"}
    assert set(job["metadata"]["annotations"]) == {
        DESIRED_HASH_ANNOTATION,
        RUN_SPEC_HASH_ANNOTATION,
    }
    assert "managedFields" not in job["metadata"]
    assert "finalizers" not in job["metadata"]
    assert job["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "ai.krateo.io/v1",
            "kind": "InferenceRun",
            "name": "r",
            "uid": RUN_UID,
            "controller": True,
        }
    ]
    configmap = project_configmap(kw["configmaps"][0])
    assert set(configmap) == {"apiVersion", "kind", "metadata"}  # the contract is not kept
    pod = project_pod(kw["pods"][0])
    assert set(pod) == {"apiVersion", "kind", "metadata", "spec", "status"}
    assert pod["spec"] == {"nodeName": "node-1"}  # no memory limit: no containers kept
    assert pod["status"]["containerStatuses"] == [
        {
            "name": "inference",
            "state": {
                "terminated": {
                    "exitCode": 0,
                    "reason": "Completed",
                    "message": RESULT,
                    "finishedAt": "2026-11-23T11:59:00Z",
                }
            },
        }
    ]
    run = project_custom(run_raw)
    assert set(run["metadata"]) == {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
    }
    cronjob = project_cronjob(scheduled_drift()[1]["cronjobs"][0])
    assert cronjob["status"] == {
        "lastScheduleTime": "2026-11-23T11:55:00Z",
        "active": [{"name": "inf-r-1", "uid": "e-1"}],
    }
    assert project_configmap(scheduled_drift()[1]["configmaps"][0])["binaryData"] == {}


@pytest.mark.parametrize("obj", every_served_object(), ids=lambda o: o["kind"])
def test_a_projection_is_smaller_stable_and_keeps_no_dict_of_its_input(obj: Obj) -> None:
    project = projection(obj["kind"])
    small = project(slim(obj))
    assert small is not None
    assert project(copy.deepcopy(small)) == small  # a projection of a projection: the same
    assert len(orjson.dumps(small)) < len(orjson.dumps(obj))
    # The raw object (a watch event's, a list page's) is not kept alive through
    # the projection: no dict or list of it is reused.
    assert not {id(v) for v in containers(small)} & {id(v) for v in containers(obj)}


def containers(value: Any) -> list[Any]:
    found: list[Any] = []
    if isinstance(value, dict):
        found.append(value)
        for v in value.values():
            found += containers(v)
    elif isinstance(value, list):
        found.append(value)
        for v in value:
            found += containers(v)
    return found


def test_repeated_strings_are_shared_between_cached_objects() -> None:
    _, kw = SCENARIOS["running"]()
    job = project_job(orjson.loads(orjson.dumps(kw["jobs"][0])))
    configmap = project_configmap(orjson.loads(orjson.dumps(kw["configmaps"][0])))
    pod = project_pod(orjson.loads(orjson.dumps(kw["pods"][0])))
    assert job["metadata"]["namespace"] is configmap["metadata"]["namespace"]
    assert job["metadata"]["name"] is configmap["metadata"]["name"]
    uid = job["metadata"]["labels"]["ai.krateo.io/run-uid"]
    assert uid is pod["metadata"]["labels"]["ai.krateo.io/run-uid"]
    assert uid is configmap["metadata"]["ownerReferences"][0]["uid"]
    run_raw, children_kw = SCENARIOS["running"]()
    run_raw = with_status(run_raw, **children_kw)
    run = project_custom(orjson.loads(orjson.dumps(run_raw)))
    again = project_custom(orjson.loads(orjson.dumps(run_raw)))
    assert run["status"]["contract"]["jobId"] is uid
    first, second = run["status"]["conditions"][0], again["status"]["conditions"][0]
    assert first == second
    assert all(first[k] is second[k] for k in first if isinstance(first[k], str))


def test_every_cached_kind_has_a_projection() -> None:
    assert set(PROJECTIONS) == {
        "InferenceRun",
        "InferenceConfig",
        "Job",
        "CronJob",
        "ConfigMap",
        "Pod",
    }


def test_a_run_that_succeeded_after_a_retry_warns_that_its_output_may_hold_rows_twice() -> None:
    run_raw, kw = SCENARIOS["succeeded after a retry"]()
    kw = project_view_kw(kw)
    first = plan(view(run_raw, **kw))
    assert first.status is not None
    assert first.status.phase == "Succeeded"
    assert first.status.result is not None
    assert first.status.result.attempts == 2
    assert first.status.to_api()["result"]["attempts"] == 2
    warning = next(c for c in first.status.conditions if c.type == "Warning")
    assert (warning.status, warning.reason) == ("True", "OutputMayHoldDuplicates")
    assert "output may hold rows twice: attempt 2 restarted from row 0" in warning.message
    said = [(e.type, e.reason) for e in first.events]
    assert ("Warning", "OutputMayHoldDuplicates") in said
    assert ("Normal", "Succeeded") in said
    # Said once: the next pass, with the status written, has no new Event.
    again = plan(view({**run_raw, "status": first.status.to_api()}, **kw))
    assert [e.reason for e in again.events] == []
    assert again.status is not None
    assert [c.reason for c in again.status.conditions if c.type == "Warning"] == [
        "OutputMayHoldDuplicates"
    ]
    # A run that succeeded at the first attempt: one attempt, no warning.
    run_raw, kw = SCENARIOS["succeeded"]()
    once = plan(view(run_raw, **project_view_kw(kw)))
    assert once.status is not None
    assert once.status.result is not None
    assert once.status.result.attempts == 1
    assert not [c for c in once.status.conditions if c.type == "Warning"]
