"""Shaping runner pods: spec.runnerPod, RUNNER_POD_DEFAULTS, how they merge and render."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from controller.api import ResourceRequirements, RunnerPod, RunnerPodDefaults, merge_runner_pod
from controller.invalid import describe_invalid
from controller.naming import KUEUE_QUEUE_LABEL, RUN_UID_LABEL
from controller.render import desired_cronjob, desired_job, desired_probe
from controller.settings import SettingsError, load_settings
from controller.validation import (
    DNS_SUBDOMAIN_PATTERN,
    ENV_NAME_PATTERN,
    LABEL_VALUE_PATTERN,
    QUALIFIED_NAME_PATTERN,
    RESERVED_ENV_NAMES,
    RESERVED_METADATA_KEYS,
)
from tests.chart import REPO
from tests.unit.helpers import UID, make_config, make_run


def refusal(**runner_pod: Any) -> tuple[str, str]:
    with pytest.raises(ValidationError) as err:
        make_config(runnerPod=runner_pod)
    return describe_invalid(err.value)


GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SPOT = {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute"}

# ------------------------------------------------------------------------ merge


def test_the_config_wins_maps_merge_key_by_key() -> None:
    defaults = RunnerPodDefaults.model_validate(
        {
            "labels": {"cost-center": "ml", "team": "platform"},
            "annotations": {"sidecar.istio.io/inject": "false"},
            "nodeSelector": {"pool": "batch"},
        }
    )
    own = RunnerPod.model_validate(
        {"labels": {"team": "forecasting"}, "nodeSelector": {"pool": "gpu", "zone": "a"}}
    )
    merged = merge_runner_pod(own, defaults)
    assert merged.labels == {"cost-center": "ml", "team": "forecasting"}
    assert merged.annotations == {"sidecar.istio.io/inject": "false"}
    assert merged.node_selector == {"pool": "gpu", "zone": "a"}


def test_env_merges_by_name_defaults_first() -> None:
    defaults = RunnerPodDefaults.model_validate(
        {"env": [{"name": "LOG_LEVEL", "value": "INFO"}, {"name": "HTTP_PROXY", "value": "p:1"}]}
    )
    own = RunnerPod.model_validate(
        {"env": [{"name": "LOG_LEVEL", "value": "DEBUG"}, {"name": "EXTRA", "value": "1"}]}
    )
    merged = merge_runner_pod(own, defaults)
    assert [(e.name, e.value) for e in merged.env or []] == [
        ("LOG_LEVEL", "DEBUG"),
        ("HTTP_PROXY", "p:1"),
        ("EXTRA", "1"),
    ]


def test_tolerations_add_up_each_once() -> None:
    defaults = RunnerPodDefaults.model_validate({"tolerations": [SPOT, GPU]})
    own = RunnerPod.model_validate({"tolerations": [GPU, {**GPU, "effect": "NoExecute"}]})
    merged = merge_runner_pod(own, defaults)
    assert [t.to_api() for t in merged.tolerations or []] == [
        SPOT,
        GPU,
        {**GPU, "effect": "NoExecute"},
    ]


def test_affinity_priority_and_resources_are_the_configs_when_set() -> None:
    affinity: dict[str, Any] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}
    }
    defaults = RunnerPodDefaults.model_validate(
        {
            "affinity": affinity,
            "priorityClassName": "batch-low",
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        }
    )
    unset = merge_runner_pod(None, defaults)
    assert unset.affinity == affinity
    assert unset.priority_class_name == "batch-low"
    assert unset.resources is not None
    assert unset.resources.requests == {"cpu": "100m", "memory": "128Mi"}
    own = RunnerPod.model_validate({"affinity": {}, "priorityClassName": "batch-high"})
    resources = ResourceRequirements.model_validate({"limits": {"memory": "1Gi"}})
    merged = merge_runner_pod(own, defaults, resources)
    assert merged.affinity == {}  # set, even empty: the config's
    assert merged.priority_class_name == "batch-high"
    assert merged.resources == resources  # whole, not merged with the defaults'


def test_nothing_set_is_nothing() -> None:
    assert merge_runner_pod(None, None).to_api() == {}


# ----------------------------------------------------------------------- render


SHAPE = {
    "labels": {"cost-center": "ml-42"},
    "annotations": {"sidecar.istio.io/inject": "false"},
    "nodeSelector": {"pool": "gpu"},
    "tolerations": [GPU],
    "affinity": {"podAntiAffinity": {}},
    "priorityClassName": "batch-high",
    "env": [
        {"name": "HTTP_PROXY", "value": "http://proxy:3128"},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ],
}


def _check_pod(template: dict[str, Any]) -> None:
    meta, pod = template["metadata"], template["spec"]
    assert meta["labels"]["cost-center"] == "ml-42"
    assert meta["labels"][RUN_UID_LABEL] == UID  # the controller's labels are all there
    assert meta["annotations"] == {
        "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes": "tmp",
        "sidecar.istio.io/inject": "false",
    }
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == [GPU]
    assert pod["affinity"] == {"podAntiAffinity": {}}
    assert pod["priorityClassName"] == "batch-high"
    (container,) = pod["containers"]
    assert [e["name"] for e in container["env"]] == [
        "pod_uid",
        "POD_NAMESPACE",
        "HTTP_PROXY",
        "NODE",
    ]
    assert container["env"][3]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert container["resources"] == {"requests": {"cpu": "250m"}}


def test_a_shaped_job() -> None:
    defaults = RunnerPodDefaults.model_validate({"resources": {"requests": {"cpu": "250m"}}})
    job = desired_job(make_run(), make_config(runnerPod=SHAPE), pod_defaults=defaults)
    assert job["metadata"]["labels"]["cost-center"] == "ml-42"
    assert "sidecar.istio.io/inject" not in job["metadata"]["annotations"]  # pods only
    _check_pod(job["spec"]["template"])


def test_a_shaped_cronjob_labels_its_job_template() -> None:
    defaults = RunnerPodDefaults.model_validate({"resources": {"requests": {"cpu": "250m"}}})
    config = make_config(runnerPod=SHAPE, queueName="team-a")
    cron = desired_cronjob(make_run(schedule="@hourly"), config, pod_defaults=defaults)
    labels = cron["spec"]["jobTemplate"]["metadata"]["labels"]
    assert labels["cost-center"] == "ml-42"
    assert labels[KUEUE_QUEUE_LABEL] == "team-a"
    _check_pod(cron["spec"]["jobTemplate"]["spec"]["template"])


def test_the_probe_pod_is_shaped_too() -> None:
    defaults = RunnerPodDefaults.model_validate({"resources": {"requests": {"cpu": "250m"}}})
    _, job = desired_probe(make_config(runnerPod=SHAPE), "probe", pod_defaults=defaults)
    template = job["spec"]["template"]
    assert template["metadata"]["labels"]["ai.krateo.io/config-uid"] == "cfg-uid"
    assert template["metadata"]["labels"]["cost-center"] == "ml-42"
    assert template["spec"]["priorityClassName"] == "batch-high"
    assert template["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "250m"}}


def test_an_unshaped_job_is_unchanged() -> None:
    job = desired_job(make_run(), make_config())
    pod = job["spec"]["template"]["spec"]
    assert not {"nodeSelector", "tolerations", "affinity", "priorityClassName"} & set(pod)
    # The one annotation of every runner pod: its emptyDir may go (see "drains").
    assert job["spec"]["template"]["metadata"]["annotations"] == {
        "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes": "tmp"
    }
    assert [e["name"] for e in pod["containers"][0]["env"]] == ["pod_uid", "POD_NAMESPACE"]
    assert "resources" not in pod["containers"][0]


# ------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("runner_pod", "fragment"),
    [
        ({"labels": {"team name!": "a"}}, "'team name!' is not a qualified name"),
        ({"labels": {"example.com/" + "n" * 64: "a"}}, "at most 63 characters"),
        ({"labels": {"team": "a b"}}, "the value of 'team' is not a label value"),
        ({"labels": {"ai.krateo.io/run-uid": "x"}}, "label 'ai.krateo.io/run-uid' is set by"),
        ({"labels": {"batch.kubernetes.io/job-name": "x"}}, "is set by the controller"),
        ({"labels": {"controller-uid": "x"}}, "is set by the controller"),
        ({"labels": {KUEUE_QUEUE_LABEL: "q"}}, "use spec.queueName"),
        ({"annotations": {"app.kubernetes.io/managed-by": "me"}}, "annotation 'app.kubernetes"),
        ({"nodeSelector": {"pool": "a b"}}, "the value of 'pool' is not a label value"),
        ({"tolerations": [{"operator": "Equal", "value": "x"}]}, "without a key must have"),
        ({"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]}, "must not have a"),
        ({"tolerations": [{"key": "a", "tolerationSeconds": 5}]}, "needs effect NoExecute"),
        ({"env": [{"name": "pod_uid", "value": "x"}]}, "env pod_uid is set by the controller"),
        ({"env": [{"name": "JOB_COMPLETION_INDEX", "value": "0"}]}, "JOB_COMPLETION_INDEX is"),
        ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "unique: A"),
        (
            {"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {}}}]},
            "has both value and valueFrom",
        ),
    ],
)
def test_refused_with_a_clear_message(runner_pod: dict[str, Any], fragment: str) -> None:
    reason, message = refusal(**runner_pod)
    assert reason == "InvalidRunnerPod"
    assert message.startswith("spec.runnerPod.")
    assert fragment in message


def test_field_syntax_is_refused_as_invalid_spec() -> None:
    reason, message = refusal(priorityClassName="High")
    assert (reason, message.split(":")[0]) == ("InvalidSpec", "spec.runnerPod.priorityClassName")
    reason, message = refusal(tolerations=[{"key": "a", "effect": "Never"}])
    assert message.startswith("spec.runnerPod.tolerations[0].effect")


def test_the_crd_holds_the_same_rules() -> None:
    crd = yaml.safe_load((REPO / "crds/inferenceconfigs.ai.krateo.io.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    pod = spec["properties"]["runnerPod"]["properties"]
    for field in ("labels", "annotations", "nodeSelector"):
        rule = pod[field]["x-kubernetes-validations"][0]["rule"]
        assert f"k.matches('{QUALIFIED_NAME_PATTERN}')" in rule
    for field in ("labels", "annotations"):
        reserved = pod[field]["x-kubernetes-validations"][1]["rule"]
        for key in RESERVED_METADATA_KEYS:
            assert f"'{key}'" in reserved or key == KUEUE_QUEUE_LABEL
        assert "'ai.krateo.io/'" in reserved
        assert "'batch.kubernetes.io/'" in reserved
    assert pod["labels"]["additionalProperties"]["pattern"] == LABEL_VALUE_PATTERN
    assert pod["nodeSelector"]["additionalProperties"]["pattern"] == LABEL_VALUE_PATTERN
    assert pod["priorityClassName"]["pattern"].replace("\\.", "[.]") == DNS_SUBDOMAIN_PATTERN
    env_name = pod["env"]["items"]["properties"]["name"]
    assert env_name["pattern"] == ENV_NAME_PATTERN
    for name in RESERVED_ENV_NAMES:
        assert f"'{name}'" in env_name["x-kubernetes-validations"][0]["rule"]


# ------------------------------------------------------------ drains and autoscalers

SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes"


def _templates(defaults: RunnerPodDefaults | None = None, **config: Any) -> list[Any]:
    """The pod templates of a one-shot run's Job, a scheduled run's CronJob and a probe."""
    cfg = make_config(**config)
    job = desired_job(make_run(), cfg, pod_defaults=defaults)
    cron = desired_cronjob(make_run(schedule="*/5 * * * *"), cfg, pod_defaults=defaults)
    _, probe = desired_probe(cfg, "probe", pod_defaults=defaults)
    return [
        job["spec"]["template"],
        cron["spec"]["jobTemplate"]["spec"]["template"],
        probe["spec"]["template"],
    ]


def test_runner_pods_name_their_emptydirs_safe_to_evict_and_bound_tmp() -> None:
    """kubectl drain and the cluster autoscaler refuse pods with local storage unless told."""
    for template in _templates():
        volumes = template["spec"]["volumes"]
        empty_dirs = [v["name"] for v in volumes if "emptyDir" in v]
        assert empty_dirs == ["tmp"]
        assert template["metadata"]["annotations"][SAFE_TO_EVICT] == ",".join(empty_dirs)
        tmp = next(v for v in volumes if v["name"] == "tmp")
        assert tmp["emptyDir"] == {"sizeLimit": "1Gi"}


def test_tmp_size_limit_comes_from_the_controllers_defaults() -> None:
    defaults = RunnerPodDefaults.model_validate({"tmpSizeLimit": "8Gi"})
    # A config's own runnerPod (which has no tmpSizeLimit) keeps the defaults' limit.
    for template in _templates(defaults, runnerPod={"labels": {"team": "a"}}):
        tmp = next(v for v in template["spec"]["volumes"] if v["name"] == "tmp")
        assert tmp["emptyDir"] == {"sizeLimit": "8Gi"}
    assert merge_runner_pod(None, defaults).tmp_size_limit == "8Gi"


def test_a_runner_pod_annotation_wins_over_the_safe_to_evict_one() -> None:
    """An operator who wants the node kept for a runner says so in runnerPod.annotations."""
    (job, *_) = _templates(runnerPod={"annotations": {SAFE_TO_EVICT: ""}})
    assert job["metadata"]["annotations"] == {SAFE_TO_EVICT: ""}


# --------------------------------------------------------------------- settings


def test_runner_pod_defaults_setting() -> None:
    assert load_settings([], {}).runner_pod_defaults is None
    assert load_settings([], {"RUNNER_POD_DEFAULTS": ""}).runner_pod_defaults is None
    settings = load_settings(
        [],
        {
            "RUNNER_POD_DEFAULTS": '{"labels": {"team": "a"}, '
            '"resources": {"requests": {"cpu": "100m"}}}'
        },
    )
    defaults = settings.runner_pod_defaults
    assert defaults is not None
    assert defaults.labels == {"team": "a"}
    assert defaults.resources is not None
    assert defaults.resources.requests == {"cpu": "100m"}


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("{labels", "not JSON"),
        ("[1]", "expected a JSON object"),
        ('{"labels": {"job-name": "x"}}', "labels: label 'job-name' is set by the controller"),
        ('{"tolerations": [{"operator": "Nope"}]}', "tolerations[0].operator"),
        ('{"resources": {"requests": {"cpu": "-1"}}}', "cpu must not be negative"),
        ('{"env": [{"name": "CONTRACT_PATH", "value": "/x"}]}', "env CONTRACT_PATH is set"),
        ('{"tmpSizeLimit": "lots"}', "tmpSizeLimit must be a positive quantity"),
        ('{"tmpSizeLimit": "0"}', "tmpSizeLimit must be a positive quantity"),
        ('{"tmpSizeLimit": "-1Gi"}', "tmpSizeLimit must be a positive quantity"),
    ],
)
def test_bad_runner_pod_defaults_are_a_clear_error(value: str, fragment: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings([], {"RUNNER_POD_DEFAULTS": value})
    assert str(err.value).startswith("invalid setting RUNNER_POD_DEFAULTS=")
    assert fragment in str(err.value)


# ------------------------------------------------------------------------ chart


def test_the_chart_passes_runner_pod_defaults_to_the_controller() -> None:
    from tests.chart import CONTROLLER_SERVICE_ACCOUNT, HelmError, one, render

    def settings_of(values: dict[str, Any]) -> Any:
        objects = render(values, namespace="ksc")
        data = one(objects, "ConfigMap", f"{CONTROLLER_SERVICE_ACCOUNT}-settings")["data"]
        return load_settings([], {**data, "POD_NAMESPACE": "ksc"}, namespace_file=Path("/x"))

    assert settings_of({}).runner_pod_defaults is None
    pod_defaults = {
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
        "labels": {"cost-center": "ml-platform"},
        "annotations": {"sidecar.istio.io/inject": "false"},
        "tolerations": [GPU],
        "env": [{"name": "HTTP_PROXY", "value": "http://proxy:3128"}],
        "tmpSizeLimit": "4Gi",
    }
    defaults = settings_of({"runner": {"podDefaults": pod_defaults}}).runner_pod_defaults
    assert defaults is not None
    assert defaults.to_api() == pod_defaults
    with pytest.raises(HelmError, match=r"extraEnv\.RUNNER_POD_DEFAULTS is set by the chart"):
        render({"extraEnv": {"RUNNER_POD_DEFAULTS": "{}"}})
    with pytest.raises(HelmError, match="podDefaults"):
        render({"runner": {"podDefaults": {"nodeSelecter": {"pool": "gpu"}}}})
