"""An InferenceConfig's status: validity at once, and the live probe's schedule and outcome."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from controller.api import InferenceConfig
from controller.naming import PROBE_GENERATION_ANNOTATION
from controller.probe import ConfigView, plan_config, probe_outcome
from controller.render import PROBE_ARGS
from tests.unit.helpers import CONFIG_UID, NOW, config_raw


def stored_config(generation: int = 1, status: Any = None) -> dict[str, Any]:
    """The config as the API server stores it: a generation, a resourceVersion, a status."""
    return config_raw(
        typed=True,
        uid=CONFIG_UID,
        generation=generation,
        resource_version="5",
        status=status or {},
        kserve={"modelUrl": "m:1/v2/models/m/infer", "modelName": "m"},
    )


def view(raw: dict[str, Any], interval: float = 600.0, **kw: Any) -> ConfigView:
    return ConfigView(
        raw=raw,
        now=NOW,
        config=InferenceConfig.model_validate(raw),
        probe_interval=interval,
        **kw,
    )


def probe_job(outcome: str | None, generation: int = 1, name: str = "probe-1") -> dict[str, Any]:
    conditions = (
        []
        if outcome is None
        else [
            {
                "type": outcome,
                "status": "True",
                "reason": "DeadlineExceeded" if outcome == "Failed" else "Completed",
                "lastTransitionTime": "2026-11-23T11:59:00Z",
            }
        ]
    )
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "creationTimestamp": "2026-11-23T11:58:00Z",
            "annotations": {PROBE_GENERATION_ANNOTATION: str(generation)},
        },
        "status": {"conditions": conditions},
    }


def probe_pod(code: int, message: str, job: str = "probe-1") -> dict[str, Any]:
    return {
        "metadata": {"name": f"{job}-x", "labels": {"job-name": job}},
        "status": {
            "containerStatuses": [
                {
                    "name": "inference",
                    "state": {"terminated": {"exitCode": code, "message": message}},
                }
            ]
        },
    }


def cond(status: Any, type_: str) -> Any:
    return next((c for c in status.conditions if c.type == type_), None)


def test_a_valid_config_is_ready_and_gets_its_first_probe() -> None:
    out = plan_config(view(stored_config()))
    ready = cond(out.status, "Ready")
    assert (ready.status, ready.reason, ready.observed_generation) == ("True", "Valid", 1)
    assert out.status.observed_generation == 1
    assert out.status_changed
    assert out.create is not None
    configmap, job = out.create
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == PROBE_ARGS
    assert job["metadata"]["annotations"][PROBE_GENERATION_ANNOTATION] == "1"
    assert job["metadata"]["ownerReferences"][0]["kind"] == "InferenceConfig"
    assert '"jobId":"0f1e2d3c-aaaa-bbbb-cccc-000000000000"' in configmap["data"]["contract.json"]
    assert len(job["metadata"]["name"]) <= 63


def test_an_invalid_config_is_not_ready_and_is_not_probed() -> None:
    raw = stored_config()
    out = plan_config(
        ConfigView(raw=raw, now=NOW, invalid=("MissingModelUrl", "no url"), probe_interval=600)
    )
    ready = cond(out.status, "Ready")
    assert (ready.status, ready.reason, ready.message) == ("False", "MissingModelUrl", "no url")
    assert out.create is None
    assert [(e.type, e.reason) for e in out.events] == [("Warning", "MissingModelUrl")]


def test_probes_off_means_no_probe_and_no_probed_condition() -> None:
    out = plan_config(view(stored_config(), interval=0))
    assert out.create is None
    assert cond(out.status, "Probed") is None
    assert out.requeue_after is None


def test_a_finished_probe_becomes_the_condition_and_is_deleted() -> None:
    job = probe_job("Complete")
    out = plan_config(
        view(stored_config(), probe_jobs=[job], probe_pods=[probe_pod(0, '{"check":"ok"}')])
    )
    probed = cond(out.status, "Probed")
    assert (probed.status, probed.reason, probed.message) == (
        "True",
        "ProbeSucceeded",
        '{"check":"ok"}',
    )
    assert out.delete == [job]
    assert out.create is None  # the next one is due after the interval
    assert out.requeue_after is not None
    assert out.requeue_after <= 600
    assert [(e.type, e.reason) for e in out.events] == [("Normal", "ProbeSucceeded")]


def test_a_probe_the_job_controller_has_decided_on_is_read_at_once() -> None:
    # SuccessCriteriaMet and FailureTarget come before Complete and Failed
    # (the Job controller waits for the pods to terminate): the probe is over.
    decided = probe_job("SuccessCriteriaMet")
    out = plan_config(
        view(stored_config(), probe_jobs=[decided], probe_pods=[probe_pod(0, '{"check":"ok"}')])
    )
    probed = cond(out.status, "Probed")
    assert (probed.status, probed.reason) == ("True", "ProbeSucceeded")
    assert out.delete == [decided]
    assert out.status.last_probe_time == NOW - timedelta(minutes=1)

    failing = probe_job("FailureTarget")
    failing["status"]["conditions"][0]["reason"] = "DeadlineExceeded"
    out = plan_config(view(stored_config(), probe_jobs=[failing]))
    probed = cond(out.status, "Probed")
    assert (probed.status, probed.reason) == ("False", "ProbeTimedOut")
    assert out.delete == [failing]
    assert [(e.type, e.reason) for e in out.events] == [("Warning", "ProbeTimedOut")]


def test_a_failed_probe_says_why_with_the_runners_reason() -> None:
    job = probe_job("Failed")
    pod = probe_pod(7, "inference: model answered 404: model m not found")
    out = plan_config(view(stored_config(), probe_jobs=[job], probe_pods=[pod]))
    probed = cond(out.status, "Probed")
    assert (probed.status, probed.reason) == ("False", "InferenceRejected")
    assert "model m not found" in probed.message
    assert [(e.type, e.reason) for e in out.events] == [("Warning", "InferenceRejected")]


def test_a_probe_that_cannot_start_says_why() -> None:
    job = probe_job("Failed")
    pod = {
        "metadata": {"name": "probe-1-x", "labels": {"job-name": "probe-1"}},
        "status": {
            "containerStatuses": [
                {
                    "name": "inference",
                    "state": {"waiting": {"reason": "ErrImagePull", "message": "no"}},
                }
            ]
        },
    }
    passed, reason, _ = probe_outcome(job, [pod])
    assert (passed, reason) == (False, "ErrImagePull")
    assert probe_outcome(job, [])[1] == "ProbeTimedOut"


def waiting_pod(reason: str, job: str = "probe-1") -> dict[str, Any]:
    return {
        "metadata": {"name": f"{job}-x", "labels": {"job-name": job}},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "inference",
                    "state": {"waiting": {"reason": reason, "message": f"{reason}: details"}},
                }
            ],
        },
    }


def test_a_running_probe_whose_pod_cannot_pull_its_image_says_so_at_once() -> None:
    running = probe_job(None)
    out = plan_config(
        view(stored_config(), probe_jobs=[running], probe_pods=[waiting_pod("ErrImagePull")])
    )
    probed = cond(out.status, "Probed")
    assert (probed.status, probed.reason) == ("False", "ErrImagePull")
    assert probed.message == "probe pod could not start: ErrImagePull: details"
    assert [(e.type, e.reason) for e in out.events] == [("Warning", "ErrImagePull")]
    assert out.delete == [running]  # the probe is over: its Job goes
    assert out.create is None  # the next one is due a probe interval later
    assert out.requeue_after is not None
    assert out.requeue_after > 0
    # The next pass, before the cache shows the Job gone: nothing new to write or say.
    again = plan_config(
        view(
            stored_config(status=out.status.to_api()),
            probe_jobs=[running],
            probe_pods=[waiting_pod("ErrImagePull")],
        )
    )
    assert not again.status_changed
    assert again.events == []


def test_a_probe_pod_on_its_way_is_waited_for() -> None:
    running = probe_job(None)
    for reason in ("ContainerCreating", "PodInitializing"):
        out = plan_config(
            view(stored_config(), probe_jobs=[running], probe_pods=[waiting_pod(reason)])
        )
        assert cond(out.status, "Probed") is None
        assert out.delete == []


def test_a_change_is_probed_again_and_a_running_probe_is_waited_for() -> None:
    probed = {
        "type": "Probed",
        "status": "True",
        "reason": "ProbeSucceeded",
        "message": "",
        "lastTransitionTime": "2026-11-23T11:00:00Z",
        "observedGeneration": 1,
    }
    recent = (NOW - timedelta(seconds=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {"conditions": [probed], "lastProbeTime": recent, "observedGeneration": 1}
    same = plan_config(view(stored_config(1, status)))
    assert same.create is None
    changed = plan_config(view(stored_config(2, status)))
    assert changed.create is not None
    waiting = plan_config(view(stored_config(2, status), probe_jobs=[probe_job(None, 2)]))
    assert waiting.create is None
    assert waiting.requeue_after is not None


def test_a_settled_config_writes_nothing() -> None:
    first = plan_config(view(stored_config(), interval=0))
    settled = stored_config(status=first.status.to_api())
    again = plan_config(view(settled, interval=0))
    assert not again.status_changed
    assert again.events == []


def test_an_unusable_config_is_stalled_for_kstatus() -> None:
    raw = stored_config()
    out = plan_config(ConfigView(raw=raw, now=NOW, invalid=("MissingModelUrl", "no url")))
    stalled = cond(out.status, "Stalled")
    assert (stalled.status, stalled.reason) == ("True", "MissingModelUrl")
    assert cond(out.status, "Reconciling").status == "False"
    good = plan_config(view(stored_config(), interval=0))
    assert cond(good.status, "Stalled").status == "False"
