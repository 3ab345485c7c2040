"""The CRDs against the real API server: what they accept, what they refuse and why,
what kubectl shows, and that the rendered children pass Pod Security "restricted"."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from controller.api import (
    MAX_DEADLINE_SECONDS,
    MAX_PARAMETER_VALUE_LENGTH,
    MAX_PARAMETERS_TOTAL_LENGTH,
    Condition,
    Execution,
    InferenceConfig,
    InferenceConfigStatus,
    InferenceRun,
    InferenceRunStatus,
    ObjectReference,
    Progress,
    RunOutcome,
)
from controller.cron import CRON_DESCRIPTORS
from controller.naming import RUN_UID_LABEL, managed_selector
from controller.render import desired_configmap, desired_workload, render_contract
from hack.cluster import LocalCluster
from tests.integration.crds_helpers import create, get_json, install_crds
from tests.kubehelpers import eventually

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

CONFIG_SPEC: dict[str, Any] = {
    "image": "ghcr.io/krateoplatformops/kserve-krateo-runner:0.1.0",
    "kserve": {"modelUrl": "sklearn-iris-predictor.kserve-test.svc/v2/models/sklearn-iris/infer"},
    "storage": {"input": {"krateo": {"api": {"path": "/compute/sklearninput", "verb": "POST"}}}},
}
RUN_SPEC: dict[str, Any] = {"configRef": {"name": "cfg"}, "timeoutSeconds": 60}


def obj(kind: str, name: str, spec: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "ai.krateo.io/v1",
        "kind": kind,
        "metadata": {"name": name},
    }
    if spec is not None:
        body["spec"] = spec
    return body


@pytest.fixture(scope="session")
def crds(cluster: LocalCluster) -> LocalCluster:
    install_crds(cluster)
    return cluster


@pytest.fixture(scope="module")
def scratch(crds: LocalCluster) -> Iterator[str]:
    """One namespace for the many objects that are only validated, never kept."""
    name = f"crds-scratch-{uuid.uuid4().hex[:6]}"
    crds.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        crds.kubectl("delete", "namespace", name, "--wait=false")


def apply(cluster: LocalCluster, namespace: str, text: str) -> str:
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", input=text).stdout


def patch_status(
    cluster: LocalCluster, namespace: str, resource: str, name: str, status: dict[str, Any]
) -> None:
    cluster.kubectl(
        "patch", "-n", namespace, resource, name, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


def table(output: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in output.strip().splitlines()]


# --------------------------------------------------------------------------------------------
# kubectl teaches the API


def explain(cluster: LocalCluster, field: str) -> str:
    # kubectl wraps descriptions at 80 columns: compare words, not lines.
    return " ".join(cluster.kubectl("explain", field).stdout.split())


async def test_explain_teaches_the_api(crds: LocalCluster) -> None:
    schedule = explain(crds, "inferencerun.spec.schedule")
    assert "Cron schedule" in schedule
    assert "minute hour day-of-month month day-of-week" in schedule
    assert "@hourly" in schedule
    assert "Quote it in YAML" in schedule
    assert "use timeZone" in schedule
    storage = explain(crds, "infcfg.spec.storage")
    assert "each map key names a storage provider" in storage.lower()
    assert "reaches the runner unmodified" in storage
    assert "upstream's field name" in explain(crds, "infrun.status.jobStatus")
    assert "0 or unset means no deadline" in explain(crds, "infrun.spec.timeoutSeconds")
    assert "POD_START_TIMEOUT" in explain(crds, "infrun.spec.podStartTimeoutSeconds")
    conditions = explain(crds, "infrun.status.conditions")
    assert "a one-shot run: True once it succeeded" in conditions
    assert "both False in every other phase, Error included" in conditions


async def test_get_shows_the_printer_columns(crds: LocalCluster, namespace: str) -> None:
    apply(crds, namespace, json.dumps(obj("InferenceConfig", "cfg", CONFIG_SPEC)))
    apply(crds, namespace, json.dumps(obj("InferenceRun", "run", RUN_SPEC)))
    run_status = InferenceRunStatus(
        phase="Running",
        job_status=ObjectReference(kind="Job", api_version="batch/v1", name="inf-run-12345678"),
        progress=Progress(rows_done=120, rows_total=500),
        reason="Running",
        message="batch 3 of 10",
    )
    patch_status(crds, namespace, "infrun", "run", run_status.to_api())
    ready = Condition(
        type="Ready", status="True", reason="Valid", last_transition_time="2026-01-01T00:00:00Z"
    )
    patch_status(
        crds, namespace, "infcfg", "cfg", InferenceConfigStatus(conditions=[ready]).to_api()
    )

    # REASON by default; a one-shot run has no LAST SCHEDULE or NEXT: -o wide has them.
    shown = crds.kubectl("get", "-n", namespace, "infrun")
    assert shown.returncode == 0
    runs = table(shown.stdout)
    assert runs[0] == ["NAME", "PHASE", "CONFIG", "PROGRESS", "JOB", "REASON", "AGE"]
    assert runs[1][:6] == ["run", "Running", "cfg", "120/500 (24%)", "inf-run-12345678", "Running"]
    wide = table(crds.kubectl("get", "-n", namespace, "infrun", "-o", "wide").stdout)
    assert wide[0] == [
        "NAME", "PHASE", "CONFIG", "PROGRESS", "JOB", "REASON", "LAST SCHEDULE", "NEXT",
        "SCHEDULE", "TIME ZONE", "MESSAGE", "AGE",
    ]  # fmt: skip
    assert "batch 3 of 10" in wide[1]

    configs = table(crds.kubectl("get", "-n", namespace, "infcfg").stdout)
    assert configs[0] == ["NAME", "READY", "PROBED", "IMAGE", "AGE"]
    # No probe yet: PROBED is empty, so the row has one column fewer.
    assert configs[1][:3] == ["cfg", "True", CONFIG_SPEC["image"]]

    both = crds.kubectl("get", "-n", namespace, "inference", "-o", "name").stdout.split()
    assert sorted(both) == ["inferenceconfig.ai.krateo.io/cfg", "inferencerun.ai.krateo.io/run"]


# --------------------------------------------------------------------------------------------
# Accepted: examples, upstream's manifests, defaults, full status


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
async def test_example_applies_unchanged(crds: LocalCluster, namespace: str, path: Path) -> None:
    crds.kubectl("apply", "-n", namespace, "-f", str(path))
    items = get_json(crds, namespace, "inferenceconfigs,inferenceruns")["items"]
    assert len(items) == len(list(yaml.safe_load_all(path.read_text())))
    for item in items:
        # What the API server stored is a usable object for the controller.
        model = InferenceConfig if item["kind"] == "InferenceConfig" else InferenceRun
        model.model_validate(item)


README_CONFIG = """
apiVersion: ai.krateo.io/v1
kind: InferenceConfig
metadata:
  name: iris-inference-config
  namespace: kserve-controller-system
spec:
  autoDeletePolicy: None # None | DeleteOnCompletion | DeleteOnSuccess
  image: ghcr.io/krateoplatformops/kserve-krateo-runner:0.1.0
  modelName: sklearn-iris
  modelUrl: sklearn-iris-predictor.kserve-test.svc.cluster.local/v2/models/sklearn-iris/infer
  modelVersion: v2
  storage:
    input:
      krateo:
        api:
          endpointRef:
            name: finops-database-handler-endpoint
            namespace: kserve-controller-system
          path: /compute/kserveinput
          verb: POST
          headers:
          - 'Accept: application/json'
          - 'Content-Type: application/json'
    output:
      krateo:
        api:
          endpointRef:
            name: finops-database-handler-endpoint
            namespace: kserve-controller-system
          path: /compute/kserveoutput
          verb: POST
          headers:
          - 'Accept: application/json'
          - 'Content-Type: application/json'
"""

# The README's run, with its schedule quoted (unquoted, "* * * * *" is not YAML).
README_RUN = """
apiVersion: ai.krateo.io/v1
kind: InferenceRun
metadata:
  name: iris-run-january
  namespace: kserve-controller-system
spec:
  configRef:
    name: example-inference-config
    namespace: kserve-controller-system
  timeoutSeconds: 3600
  schedule: "* * * * *"
  parameters:
    input_table_name: kserve_controller_input
    output_table_name: kserve_controller_output
"""


async def test_upstream_readme_manifests_apply_unchanged(crds: LocalCluster) -> None:
    ns = "kserve-controller-system"
    created = crds.kubectl("create", "namespace", ns, check=False)
    try:
        crds.kubectl("apply", "-f", "-", input=README_CONFIG + "---" + README_RUN)
        config = get_json(crds, ns, "infcfg", "iris-inference-config")
        # The flat model fields survive (upstream's own CRD pruned them).
        assert config["spec"]["modelName"] == "sklearn-iris"
        kserve = InferenceConfig.model_validate(config).spec.effective_kserve()
        assert kserve.model_url == (
            "sklearn-iris-predictor.kserve-test.svc.cluster.local/v2/models/sklearn-iris/infer"
        )
        assert kserve.model_version == "v2"
        run = InferenceRun.model_validate(get_json(crds, ns, "infrun", "iris-run-january"))
        assert run.spec.schedule == "* * * * *"
        assert run.config_key == (ns, "example-inference-config")
        contract = json.loads(render_contract(run, InferenceConfig.model_validate(config)))
        assert contract["kserve"]["modelName"] == "sklearn-iris"
        assert contract["input"]["krateo"]["api"]["path"] == "/compute/kserveinput"
    finally:
        if created.returncode == 0:
            crds.kubectl("delete", "namespace", ns, "--wait=false")
        else:
            crds.kubectl("delete", "-n", ns, "infrun,infcfg", "--all")


# Upstream testdata's shapes (not its files): nested kserve, a custom provider
# nesting another level, configRef with a namespace, an unquoted schedule that
# is valid YAML, quoted numeric parameters.
TESTDATA_SHAPES = """
apiVersion: ai.krateo.io/v1
kind: InferenceConfig
metadata:
  name: shapes-custom
spec:
  autoDeletePolicy: DeleteOnCompletion
  image: ghcr.io/krateoplatformops/kserve-krateo-runner-test:0.1.0
  kserve:
    modelName: sklearn-iris
    modelUrl: kserve-krateo-ttm-predictor.kserve-test.svc.cluster.local/v2/models/ttm/infer
    modelVersion: v2
    modelInputName: past_values
  storage:
    input:
      krateo:
        api:
          endpointRef:
            name: finops-database-handler-endpoint
            namespace: kserve-controller-system
          path: /compute/tritoninput
          verb: POST
          headers:
          - 'Accept: application/json'
    output:
      custom:
        s3:
          endpointRef:
            name: finops-database-handler-endpoint
            namespace: kserve-controller-system
          moreCustom: data
---
apiVersion: ai.krateo.io/v1
kind: InferenceRun
metadata:
  name: shapes-schedule
spec:
  configRef:
    name: shapes-custom
    namespace: NAMESPACE
  timeoutSeconds: 3600
  schedule: 1 * * * *
  parameters:
    key_value: "sample-vm"
    input_data_length: "512"
"""


async def test_upstream_testdata_shapes_apply(crds: LocalCluster, namespace: str) -> None:
    apply(crds, namespace, TESTDATA_SHAPES.replace("NAMESPACE", namespace))
    config = InferenceConfig.model_validate(get_json(crds, namespace, "infcfg", "shapes-custom"))
    run = InferenceRun.model_validate(get_json(crds, namespace, "infrun", "shapes-schedule"))
    assert run.spec.schedule == "1 * * * *"
    assert run.spec.parameters == {"key_value": "sample-vm", "input_data_length": "512"}
    contract = json.loads(render_contract(run, config))
    assert contract["output"] == {
        "custom": {
            "s3": {
                "endpointRef": {
                    "name": "finops-database-handler-endpoint",
                    "namespace": "kserve-controller-system",
                },
                "moreCustom": "data",
            }
        }
    }


async def test_storage_passes_through_the_api_server_unmodified(
    crds: LocalCluster, namespace: str
) -> None:
    odd: dict[str, Any] = {
        "zeta": {"b": 1, "a": [{"y": 2.5, "x": None}, True, "<b>&</b>"]},
        "alpha": {"float": 1.5, "big": 12345678901234, "neg": -0.001, "empty": {}, "list": []},
        "utf8": {"é": "naïve — 日本", "ctl": "tab\tnl\n"},
    }
    spec = {**CONFIG_SPEC, "storage": {"input": odd, "output": {"http": {"n": 0}}}}
    apply(crds, namespace, json.dumps(obj("InferenceConfig", "cfg", spec)))
    apply(crds, namespace, json.dumps(obj("InferenceRun", "run", RUN_SPEC)))
    config = InferenceConfig.model_validate(get_json(crds, namespace, "infcfg", "cfg"))
    run = InferenceRun.model_validate(get_json(crds, namespace, "infrun", "run"))
    text = render_contract(run, config)
    contract = json.loads(text)
    # The API server drops nulls from schemaless objects (upstream saw the same).
    del odd["zeta"]["a"][0]["x"]
    assert contract["input"] == odd
    assert contract["output"] == {"http": {"n": 0}}
    assert '"a":[{"y":2.5},true,"\\u003cb\\u003e\\u0026\\u003c/b\\u003e"]' in text
    assert '"é":"naïve — 日本"' in text


async def test_a_full_runner_pod_is_kept_as_written(crds: LocalCluster, scratch: str) -> None:
    runner_pod = {
        "labels": {"cost-center": "ml-42", "example.com/team": "a", "empty": ""},
        "annotations": {"sidecar.istio.io/inject": "false", "example.com/note": "any text: ok"},
        "nodeSelector": {"cloud.google.com/gke-nodepool": "gpu-pool"},
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute",
             "tolerationSeconds": 30},
            {"operator": "Exists"},
        ],
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "preference": {"matchExpressions": [
                        {"key": "zone", "operator": "In", "values": ["a"]}
                    ]}}
                ]
            }
        },
        "priorityClassName": "batch-high",
        "env": [
            {"name": "LOG_LEVEL", "value": "DEBUG"},
            {"name": "MY_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ],
    }  # fmt: skip
    body = obj("InferenceConfig", "shaped", {**CONFIG_SPEC, "runnerPod": runner_pod})
    body["spec"]["queueName"] = "team-a"
    done = create(crds, scratch, body)
    assert done.returncode == 0, done.stderr
    stored = get_json(crds, scratch, "infcfg", "shaped")
    assert stored["spec"]["runnerPod"] == runner_pod
    assert stored["spec"]["queueName"] == "team-a"
    config = InferenceConfig.model_validate(stored)
    assert config.spec.runner_pod is not None
    assert config.spec.runner_pod.to_api() == runner_pod


async def test_defaults_are_applied(crds: LocalCluster, namespace: str) -> None:
    apply(
        crds, namespace, json.dumps(obj("InferenceConfig", "cfg", {**CONFIG_SPEC, "batching": {}}))
    )
    apply(crds, namespace, json.dumps(obj("InferenceRun", "run", {"configRef": {"name": "cfg"}})))
    config = get_json(crds, namespace, "infcfg", "cfg")["spec"]
    assert config["autoDeletePolicy"] == "None"
    assert config["imagePullPolicy"] == "IfNotPresent"
    assert config["batching"] == {
        "batchSize": 256,
        "concurrency": 4,
        "requestTimeoutSeconds": 60,
        "maxRetries": 5,
    }
    run = get_json(crds, namespace, "infrun", "run")["spec"]
    assert run == {
        "configRef": {"name": "cfg"},
        "suspend": False,
        "backoffLimit": 2,
        "parallelism": 1,
    }
    # timeoutSeconds is optional: no deadline, as upstream's 0.
    assert (
        InferenceRun.model_validate(
            get_json(crds, namespace, "infrun", "run")
        ).spec.deadline_seconds
        is None
    )


async def test_full_status_round_trips_through_the_schema(
    crds: LocalCluster, namespace: str
) -> None:
    apply(
        crds, namespace, json.dumps(obj("InferenceRun", "run", {**RUN_SPEC, "schedule": "@daily"}))
    )
    when = "2026-03-04T05:06:07Z"
    status = InferenceRunStatus.model_validate(
        {
            "phase": "Scheduled",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Scheduled",
                    "message": "",
                    "lastTransitionTime": when,
                    "observedGeneration": 1,
                },
                {
                    "type": "Warning",
                    "status": "True",
                    "reason": "AutoDeleteIgnored",
                    "message": "scheduled runs are kept",
                    "lastTransitionTime": when,
                },
            ],
            "observedGeneration": 1,
            "contract": {"jobId": "u", "kserve": {"modelUrl": "m"}, "parameters": {}},
            "jobStatus": {
                "kind": "CronJob",
                "apiVersion": "batch/v1",
                "namespace": namespace,
                "name": "inf-run-u0000000",
                "uid": "c",
            },
            "startTime": when,
            "completionTime": when,
            "lastScheduleTime": when,
        }
    )
    status = status.model_copy(
        update={
            "progress": Progress(rows_done=5, rows_total=10),
            "result": RunOutcome(rows=10, predictions=10, duration_seconds=2.25, attempts=2),
            "reason": "OutputFailed",
            "message": "output: storage answered 200 with an error text",
            "last_execution": Execution(
                name="inf-run-u0000000-29000000",
                phase="Failed",
                reason="OutputFailed",
                message="boom",
                start_time=when,
                completion_time=when,
            ),
        }
    )
    patch_status(crds, namespace, "infrun", "run", status.to_api())
    stored = get_json(crds, namespace, "infrun", "run")["status"]
    assert stored == status.to_api()
    assert InferenceRunStatus.model_validate(stored) == status


# --------------------------------------------------------------------------------------------
# Refused, with a message naming the field


def config_with(**spec: Any) -> dict[str, Any]:
    return obj("InferenceConfig", "bad", {**CONFIG_SPEC, **spec})


def config_without(field: str) -> dict[str, Any]:
    return obj("InferenceConfig", "bad", {k: v for k, v in CONFIG_SPEC.items() if k != field})


def run_with(**spec: Any) -> dict[str, Any]:
    return obj("InferenceRun", "bad", {**RUN_SPEC, **spec})


# (object, what the API server's message must contain, whether the model refuses it too)
INVALID: list[tuple[str, dict[str, Any], list[str], bool]] = [
    ("run-no-spec", obj("InferenceRun", "bad", None), ["spec: Required value"], True),
    (
        "run-no-configref",
        obj("InferenceRun", "bad", {"timeoutSeconds": 5}),
        ["spec.configRef: Required value"],
        True,
    ),
    (
        "configref-no-name",
        run_with(configRef={"namespace": "x"}),
        ["spec.configRef.name: Required value"],
        True,
    ),
    (
        "configref-bad-name",
        run_with(configRef={"name": "Not_A_Name"}),
        ["spec.configRef.name: Invalid value"],
        False,
    ),
    (
        "configref-bad-namespace",
        run_with(configRef={"name": "c", "namespace": "a.b"}),
        ["spec.configRef.namespace: Invalid value"],
        False,
    ),
    (
        "negative-timeout",
        run_with(timeoutSeconds=-1),
        ["spec.timeoutSeconds", "0 (no deadline)"],
        True,
    ),
    ("string-timeout", run_with(timeoutSeconds="1h"), ["spec.timeoutSeconds"], True),
    (
        "four-field-cron",
        run_with(schedule="* * * *"),
        ["spec.schedule", "5 space-separated fields"],
        True,
    ),
    (
        "minute-61",
        run_with(schedule="61 * * * *"),
        ["spec.schedule", "5 space-separated fields"],
        True,
    ),
    (
        "six-field-cron",
        run_with(schedule="0 0 * * * *"),
        ["spec.schedule", "5 space-separated fields"],
        True,
    ),
    (
        "cron-tz-prefix",
        run_with(schedule="CRON_TZ=UTC 0 * * * *"),
        ["spec.schedule", "set spec.timeZone"],
        True,
    ),
    ("every-descriptor", run_with(schedule="@every 1h"), ["spec.schedule", "@hourly"], True),
    (
        "timezone-without-schedule",
        run_with(timeZone="UTC"),
        ["timeZone", "only apply to scheduled runs"],
        True,
    ),
    (
        "local-timezone",
        run_with(schedule="@daily", timeZone="Local"),
        ["spec.timeZone", "not Local"],
        True,
    ),
    (
        "unknown-concurrency",
        run_with(schedule="@daily", concurrencyPolicy="Sometimes"),
        ["spec.concurrencyPolicy: Unsupported value"],
        True,
    ),
    ("zero-parallelism", run_with(parallelism=0), ["spec.parallelism: Invalid value"], True),
    ("huge-backoff", run_with(backoffLimit=101), ["spec.backoffLimit: Invalid value"], True),
    (
        "negative-deadline",
        run_with(schedule="@daily", startingDeadlineSeconds=-1),
        ["spec.startingDeadlineSeconds: Invalid value"],
        True,
    ),
    (
        "numeric-parameter",
        run_with(parameters={"rows": 5}),
        ["spec.parameters.rows: Invalid value"],
        True,
    ),
    ("config-no-image", config_without("image"), ["spec.image: Required value"], True),
    ("config-empty-image", config_with(image=""), ["spec.image: Invalid value"], True),
    ("config-no-storage", config_without("storage"), ["spec.storage: Required value"], True),
    (
        "storage-not-object",
        config_with(storage={"input": {"krateo": "text"}}),
        ["spec.storage.input.krateo: Invalid value"],
        True,
    ),
    (
        "unknown-policy",
        config_with(autoDeletePolicy="Always"),
        ["spec.autoDeletePolicy: Unsupported value"],
        True,
    ),
    (
        "unknown-pull-policy",
        config_with(imagePullPolicy="Sometimes"),
        ["spec.imagePullPolicy: Unsupported value"],
        True,
    ),
    (
        "credentials-no-name",
        config_with(credentialsRef={"namespace": "x"}),
        ["spec.credentialsRef.name: Required value"],
        True,
    ),
    (
        "zero-batch",
        config_with(batching={"batchSize": 0}),
        ["spec.batching.batchSize: Invalid value"],
        True,
    ),
    (
        "zero-request-timeout",
        config_with(batching={"requestTimeoutSeconds": 0}),
        ["spec.batching.requestTimeoutSeconds: Invalid value"],
        True,
    ),
    (
        "bad-quantity",
        config_with(resources={"limits": {"cpu": "lots"}}),
        ["spec.resources.limits.cpu: Invalid value"],
        False,
    ),
    (
        "bad-service-account",
        config_with(serviceAccountName="Runner_SA"),
        ["spec.serviceAccountName: Invalid value"],
        False,
    ),
    # What the API server or the Job/CronJob controllers would refuse at child creation.
    (
        "timeout-int64-max",
        run_with(timeoutSeconds=2**63 - 1),
        ["spec.timeoutSeconds", "at most 315360000 (10 years)"],
        True,
    ),
    (
        "timeout-1000-years",
        run_with(timeoutSeconds=1000 * 365 * 86400),
        ["spec.timeoutSeconds", "at most 315360000 (10 years)"],
        True,
    ),
    (
        "starting-deadline-int64-max",
        run_with(schedule="@daily", startingDeadlineSeconds=2**63 - 1),
        ["spec.startingDeadlineSeconds", "at most 315360000 (10 years)"],
        True,
    ),
    (
        "model-url-password",
        config_with(kserve={"modelUrl": "http://user:s3cr3t@model.ns.svc/v2/models/m/infer"}),
        ["spec.kserve.modelUrl", "must not carry a password"],
        True,
    ),
    (
        "model-url-password-no-scheme",
        config_with(kserve={"modelUrl": "user:s3cr3t@model.ns.svc/v2/models/m/infer"}),
        ["spec.kserve.modelUrl", "must not carry a password"],
        True,
    ),
    (
        "model-url-and-inferenceservice",
        config_with(
            kserve={"modelUrl": "m.ns.svc/v2/models/m/infer", "inferenceServiceRef": {"name": "m"}}
        ),
        ["spec.kserve.inferenceServiceRef or a modelUrl", "not both"],
        True,
    ),
    (
        "flat-model-url-and-inferenceservice",
        config_with(
            kserve={"inferenceServiceRef": {"name": "m"}}, modelUrl="m.ns.svc/v2/models/m/infer"
        ),
        ["spec.kserve.inferenceServiceRef or a modelUrl", "not both"],
        True,
    ),
    (
        "no-model",
        config_with(kserve={"modelName": "m"}),
        ["a model is required", "inferenceServiceRef"],
        True,
    ),
    (
        "inferenceservice-no-name",
        config_with(kserve={"inferenceServiceRef": {"namespace": "x"}}),
        ["spec.kserve.inferenceServiceRef.name: Required value"],
        True,
    ),
    (
        "inferenceservice-bad-address",
        config_with(kserve={"inferenceServiceRef": {"name": "m", "preferAddress": "public"}}),
        ["spec.kserve.inferenceServiceRef.preferAddress: Unsupported value"],
        True,
    ),
    (
        "model-auth-two-sources",
        config_with(
            kserve={
                "modelUrl": "m.ns.svc/v2/models/m/infer",
                "auth": {
                    "bearerTokenSecretRef": {"name": "t"},
                    "serviceAccountToken": {"audience": "a"},
                },
            }
        ),
        ["spec.kserve.auth", "exactly one of bearerTokenSecretRef and serviceAccountToken"],
        True,
    ),
    (
        "model-auth-short-token",
        config_with(
            kserve={
                "modelUrl": "m.ns.svc/v2/models/m/infer",
                "auth": {"serviceAccountToken": {"audience": "a", "expirationSeconds": 60}},
            }
        ),
        ["spec.kserve.auth.serviceAccountToken.expirationSeconds"],
        True,
    ),
    (
        "model-ca-two-sources",
        config_with(
            kserve={
                "modelUrl": "m.ns.svc/v2/models/m/infer",
                "tls": {"caBundle": {"secretRef": {"name": "a"}, "configMapRef": {"name": "b"}}},
            }
        ),
        ["spec.kserve.tls.caBundle", "exactly one of secretRef and configMapRef"],
        True,
    ),
    (
        "flat-model-url-password",
        config_with(modelUrl="https://user:s3cr3t@model.ns.svc/v2/models/m/infer"),
        ["spec.modelUrl", "must not carry a password"],
        True,
    ),
    (
        "negative-cpu",
        config_with(resources={"limits": {"cpu": "-1"}}),
        ["spec.resources.limits[cpu]", "not negative"],
        True,
    ),
    (
        "negative-memory-int",
        config_with(resources={"requests": {"memory": -1}}),
        ["spec.resources.requests[memory]", "not negative"],
        True,
    ),
    (
        "request-above-limit",
        config_with(resources={"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}),
        ["spec.resources", "requests must not exceed their limits"],
        True,
    ),
    (
        "unknown-resource-name",
        config_with(resources={"limits": {"gpu": 1}}),
        ["spec.resources.limits", "resource names must be cpu, memory"],
        True,
    ),
    (
        "invalid-resource-name",
        config_with(resources={"requests": {"Example.com/GPU!": 1}}),
        ["spec.resources.requests", "resource names must be cpu, memory"],
        True,
    ),
    (
        "fractional-gpu",
        config_with(resources={"limits": {"nvidia.com/gpu": "0.5"}}),
        ["spec.resources.limits", "must be whole numbers"],
        True,
    ),
    (
        "gpu-request-without-limit",
        config_with(resources={"requests": {"nvidia.com/gpu": 1}}),
        ["spec.resources", "need a limit equal to the request"],
        True,
    ),
    (
        "hugepages-without-cpu-or-memory",
        config_with(resources={"limits": {"hugepages-2Mi": "4Mi"}}),
        ["spec.resources", "hugepages need a cpu or memory request or limit"],
        True,
    ),
    (
        "hugepages-partial-page",
        config_with(resources={"limits": {"hugepages-2Mi": "3Mi", "memory": "1Gi"}}),
        ["spec.resources.limits", "whole multiple"],
        True,
    ),
    (
        "too-many-parameters",
        run_with(parameters={f"p{i}": "v" for i in range(65)}),
        ["spec.parameters: Too many: 65: must have at most 64 items"],
        True,
    ),
    (
        "long-parameter-value",
        run_with(parameters={"query": "v" * 4097}),
        ["spec.parameters.query: Too long", "4096"],
        True,
    ),
    (
        "long-parameter-name",
        run_with(parameters={"k" * 254: "v"}),
        ["spec.parameters", "parameter names must be at most 253 characters"],
        True,
    ),
    (
        "parameters-too-large",
        run_with(parameters={f"p{i:02}": "v" * 4093 for i in range(9)}),
        ["spec.parameters", "must total at most 32768 characters"],
        True,
    ),
    (
        "cron-step-overflow",
        run_with(schedule="*/99999999999999999999 * * * *"),
        ["spec.schedule", "steps of at most 3 digits"],
        True,
    ),
    (
        "image-whitespace",
        config_with(image="ghcr.io/krateoplatformops/kserve-krateo-runner:0.1.0 "),
        ["spec.image", "must not have leading or trailing whitespace"],
        True,
    ),
    (
        "time-zone-part-too-long",
        run_with(schedule="@daily", timeZone="America/Abcdefghijklmno"),
        ["spec.timeZone: Invalid value"],
        True,
    ),
    (
        "queue-name-not-a-label",
        config_with(queueName="Team A"),
        ["spec.queueName", "should match"],
        True,
    ),
    *[
        (f"runner-pod-{name}", config_with(runnerPod=pod), expected, True)
        for name, pod, expected in [
            (
                "label-key",
                {"labels": {"team name!": "a"}},
                ["spec.runnerPod.labels", "keys must be qualified names"],
            ),
            (
                "label-key-name-too-long",
                {"labels": {"example.com/" + "n" * 64: "a"}},
                ["spec.runnerPod.labels", "keys must be qualified names"],
            ),
            (
                "label-value",
                {"labels": {"team": "a b"}},
                ["spec.runnerPod.labels.team", "should match"],
            ),
            (
                "reserved-label",
                {"labels": {"ai.krateo.io/run-uid": "x"}},
                ["spec.runnerPod.labels", "are set by the controller and cannot be overridden"],
            ),
            (
                "job-name-label",
                {"labels": {"job-name": "x"}},
                ["spec.runnerPod.labels", "are set by the controller and cannot be overridden"],
            ),
            (
                "queue-label",
                {"labels": {"kueue.x-k8s.io/queue-name": "q"}},
                ["spec.runnerPod.labels", "set from spec.queueName; use that"],
            ),
            (
                "reserved-annotation",
                {"annotations": {"batch.kubernetes.io/job-tracking": ""}},
                ["spec.runnerPod.annotations", "are set by the controller"],
            ),
            (
                "node-selector-key",
                {"nodeSelector": {"/gpu": "yes"}},
                ["spec.runnerPod.nodeSelector", "keys must be qualified names"],
            ),
            (
                "toleration-exists-with-value",
                {"tolerations": [{"key": "gpu", "operator": "Exists", "value": "x"}]},
                ["spec.runnerPod.tolerations[0]", "operator Exists must not have a value"],
            ),
            (
                "toleration-without-key",
                {"tolerations": [{"operator": "Equal", "value": "x"}]},
                ["spec.runnerPod.tolerations[0]", "without a key must have operator Exists"],
            ),
            (
                "toleration-seconds",
                {"tolerations": [{"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 5}]},
                ["spec.runnerPod.tolerations[0]", "tolerationSeconds needs effect NoExecute"],
            ),
            (
                "toleration-effect",
                {"tolerations": [{"key": "gpu", "effect": "Never"}]},
                ["spec.runnerPod.tolerations[0].effect", "Unsupported value"],
            ),
            (
                "toleration-key",
                {"tolerations": [{"key": "gpu type", "operator": "Exists"}]},
                ["spec.runnerPod.tolerations[0].key", "must be a qualified name"],
            ),
            (
                "reserved-env",
                {"env": [{"name": "pod_uid", "value": "x"}]},
                ["spec.runnerPod.env[0].name", "is set by the controller or read by the runner"],
            ),
            (
                "contract-path-env",
                {"env": [{"name": "CONTRACT_PATH", "value": "/x"}]},
                ["spec.runnerPod.env[0].name", "is set by the controller or read by the runner"],
            ),
            (
                "duplicate-env",
                {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
                ["spec.runnerPod.env[1]", "Duplicate value"],
            ),
            (
                "env-value-and-value-from",
                {
                    "env": [
                        {
                            "name": "A",
                            "value": "1",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                        }
                    ]
                },
                ["spec.runnerPod.env[0]", "value and valueFrom are exclusive"],
            ),
            (
                "env-name",
                {"env": [{"name": "1A", "value": "1"}]},
                ["spec.runnerPod.env[0].name", "should match"],
            ),
            (
                "priority-class-name",
                {"priorityClassName": "High"},
                ["spec.runnerPod.priorityClassName", "should match"],
            ),
        ]
    ],
]


@pytest.mark.parametrize(
    ("body", "expected", "model_refuses"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
async def test_invalid_object_is_refused(
    crds: LocalCluster, scratch: str, body: dict[str, Any], expected: list[str], model_refuses: bool
) -> None:
    done = create(crds, scratch, body)
    assert done.returncode != 0, f"accepted: {done.stdout}"
    for fragment in expected:
        assert fragment in done.stderr, done.stderr
    if model_refuses:
        model = InferenceConfig if body["kind"] == "InferenceConfig" else InferenceRun
        with pytest.raises(ValidationError):
            model.model_validate({**body, "metadata": {"name": "bad", "namespace": scratch}})


def test_the_table_is_large_enough() -> None:
    assert len(INVALID) >= 15


# The Python check is stricter than CEL where a regex cannot tell (ranges that
# run backwards, dates that never come); the API server's CronJob validation
# (robfig/cron) is the reference for what a CronJob accepts.
ACCEPTED_SCHEDULES = [
    "0 * * * *",
    "*/15 8-18 * * MON-FRI",
    "*/999 * * * *",
    "0 0 */31 * *",
    "0 0 ? JAN-MAR sun",
    "5/10 * * * *",
    "0,30 1 1 1 0",
    " 0 1  2 3 4 ",
    # Every descriptor the grammar names: the CronJob validation must accept each.
    *(f"@{name}" for name in CRON_DESCRIPTORS),
]
REFUSED_BY_CEL = [
    "",
    "* * * *",
    "60 * * * *",
    "0 0 * * 7",
    "*/0 * * * *",
    "@every 5m",
    "@HOURLY",
    "TZ=UTC @daily",
    "*/1000 * * * *",
]
# Schedules croniter runs but robfig/cron (strconv.Atoi) cannot parse.
REFUSED_BY_CRONJOB = ["*/99999999999999999999 * * * *", "0 0 1/9223372036854775808 * *"]


def cronjob(name: str, schedule: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name},
        "spec": {
            "schedule": schedule,
            "jobTemplate": {
                "spec": {
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [{"name": "c", "image": "example.com/idle:1"}],
                        }
                    }
                }
            },
        },
    }


async def test_schedules_agree_with_cronjob_validation(crds: LocalCluster, scratch: str) -> None:
    for i, schedule in enumerate(ACCEPTED_SCHEDULES):
        InferenceRun.model_validate({**run_with(schedule=schedule), "metadata": {"name": "r"}})
        run = create(
            crds,
            scratch,
            obj("InferenceRun", f"ok-{i}", {**RUN_SPEC, "schedule": schedule}),
            dry_run=True,
        )
        assert run.returncode == 0, (schedule, run.stderr)
        cron = create(crds, scratch, cronjob(f"ok-{i}", schedule), dry_run=True)
        assert cron.returncode == 0, (schedule, cron.stderr)
    for i, schedule in enumerate(REFUSED_BY_CEL):
        run = create(
            crds,
            scratch,
            obj("InferenceRun", f"no-{i}", {**RUN_SPEC, "schedule": schedule}),
            dry_run=True,
        )
        assert run.returncode != 0, schedule
        assert "spec.schedule" in run.stderr
    for i, schedule in enumerate(REFUSED_BY_CRONJOB):
        assert create(crds, scratch, cronjob(f"overflow-{i}", schedule), dry_run=True).returncode
        run = create(
            crds,
            scratch,
            obj("InferenceRun", f"overflow-{i}", {**RUN_SPEC, "schedule": schedule}),
            dry_run=True,
        )
        assert run.returncode != 0, schedule
        assert "steps of at most 3 digits" in run.stderr
        with pytest.raises(ValidationError, match="steps of at most 3 digits"):
            InferenceRun.model_validate({**run_with(schedule=schedule), "metadata": {"name": "r"}})
    # A backwards range passes any regex; the CronJob would be refused, so the model refuses it.
    assert create(crds, scratch, cronjob("backwards", "5-1 * * * *"), dry_run=True).returncode != 0
    with pytest.raises(ValidationError, match="runs backwards"):
        InferenceRun.model_validate({**run_with(schedule="5-1 * * * *"), "metadata": {"name": "r"}})


def job_with(name: str, resources: dict[str, Any], **spec: Any) -> dict[str, Any]:
    container = {"name": "c", "image": "example.com/idle:1", "resources": resources}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            **spec,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
        },
    }


# Runner resources the API server's Pod validation accepts or refuses; the CRD
# and the model must say the same (the CRD and the model are stricter only on
# absurd inputs: a GPU count of 0.9999999, quantities past 10^15 written with a
# fraction, or more than 16 resources).
RESOURCES_POD_ACCEPTS: list[dict[str, Any]] = [
    {"limits": {"cpu": "500m", "memory": "1Gi"}},
    {"limits": {"cpu": 1, "memory": "512Mi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
    {"limits": {"cpu": "1"}, "requests": {"cpu": "1000m", "ephemeral-storage": "2Gi"}},
    {"requests": {"cpu": "-0"}},
    {"limits": {"nvidia.com/gpu": 1}},
    {"limits": {"nvidia.com/gpu": "1000m"}},
    {"limits": {"nvidia.com/gpu": "1.0"}},
    {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": 2}},
    {"limits": {"example.com/foo_bar": "1k", "kubernetes.io/native": "0.5"}},
    {"limits": {"a" * 244 + "/x": 1, "example.com/" + "x" * 63: 1}},
    {"limits": {"hugepages-2Mi": "4Mi", "memory": "1Gi"}},
    {"limits": {"hugepages-2Mi": "2048Ki", "hugepages-1Gi": "0"}, "requests": {"cpu": "1"}},
    {"limits": {"hugepages-512Mi": "0.5Gi", "memory": "1Gi"}},
    {"limits": {"memory": "1E", "cpu": "1e3"}},
    {"limits": {"cpu": "0.0000000001"}},
    {"limits": {}},
]
RESOURCES_POD_REFUSES: list[dict[str, Any]] = [
    {"limits": {"cpu": "-1"}},
    {"limits": {"cpu": -1}},
    {"limits": {"cpu": "1e1.5"}},
    {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}},
    {"requests": {"memory": "1025Mi"}, "limits": {"memory": "1Gi"}},
    {"requests": {"kubernetes.io/native": "2"}, "limits": {"kubernetes.io/native": "1"}},
    {"limits": {"gpu": 1}},
    {"limits": {"storage": "1Gi"}},
    {"limits": {"pods": "1"}},
    {"limits": {"Nvidia.com/gpu": 1}},
    {"limits": {"requests.example.com/x": 1}},
    {"limits": {"a/b/c": 1}},
    {"limits": {"example.com/": 1}},
    {"limits": {"a" * 245 + "/x": 1}},
    {"limits": {"example.com/" + "x" * 64: 1}},
    {"limits": {"nvidia.com/gpu": "0.5"}},
    {"limits": {"nvidia.com/gpu": "1500m"}},
    {"requests": {"nvidia.com/gpu": 1}},
    {"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 2}},
    {"limits": {"hugepages-2Mi": "4Mi"}},
    {"limits": {"hugepages-2Mi": "3Mi", "memory": "1Gi"}},
    {"limits": {"hugepages-2Mi": "4Mi", "memory": "1Gi"}, "requests": {"hugepages-2Mi": "2Mi"}},
    {"limits": {"memory": "1Gi"}, "requests": {"hugepages-2Mi": "2Mi"}},
    {"limits": {"hugepages-foo": "4Mi", "memory": "1Gi"}},
    {"limits": {"hugepages-0": "0", "memory": "1Gi"}},
    {"limits": {"hugepages-1.5": "3", "memory": "1Gi"}},
]


async def test_resources_agree_with_pod_validation(crds: LocalCluster, scratch: str) -> None:
    cases = [(r, True) for r in RESOURCES_POD_ACCEPTS] + [(r, False) for r in RESOURCES_POD_REFUSES]
    for i, (resources, accepted) in enumerate(cases):
        job = create(crds, scratch, job_with(f"res-{i}", resources), dry_run=True)
        assert (job.returncode == 0) is accepted, (resources, job.stderr)
        config = create(crds, scratch, config_with(resources=resources), dry_run=True)
        assert (config.returncode == 0) is accepted, (resources, config.stderr)
        if not accepted:
            assert "spec.resources" in config.stderr, config.stderr
        body = {**config_with(resources=resources), "metadata": {"name": "c", "namespace": scratch}}
        if accepted:
            InferenceConfig.model_validate(body)
        else:
            with pytest.raises(ValidationError, match="InvalidResources"):
                InferenceConfig.model_validate(body)


async def test_model_url_password_is_not_echoed(crds: LocalCluster, scratch: str) -> None:
    nested = config_with(kserve={"modelUrl": "http://user:s3cr3t@model/v2/models/m/infer"})
    flat = config_with(modelUrl="user:s3cr3t@model/v2/models/m/infer")
    for body in (nested, flat):
        done = create(crds, scratch, body, dry_run=True)
        assert done.returncode != 0
        assert "must not carry a password" in done.stderr
        assert "s3cr3t" not in done.stderr


async def test_a_credential_env_value_is_refused_and_not_echoed(
    crds: LocalCluster, scratch: str
) -> None:
    secret = "wJalrXUtnFEMIK7MDENGbPxRfiCYzEXAMPLEKEY"
    for name in ("AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "db.password", "OPENAI_API_KEY"):
        body = config_with(runnerPod={"env": [{"name": name, "value": secret}]})
        done = create(crds, scratch, body, dry_run=True)
        assert done.returncode != 0, f"{name} accepted: {done.stdout}"
        assert "spec.runnerPod.env[0].value" in done.stderr
        assert "holds a credential" in done.stderr
        assert secret not in done.stderr
    # From a Secret, or under a name that is not a credential's: accepted.
    from_secret = {"secretKeyRef": {"name": "aws", "key": "secret"}}
    for env in (
        {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": from_secret},
        {"name": "AWS_ACCESS_KEY_ID", "value": "my-access-key-id"},
        {"name": "TOKENIZERS_PARALLELISM", "value": "false"},
        {"name": "SECRET_NAME", "value": "aws"},
    ):
        done = create(crds, scratch, config_with(runnerPod={"env": [env]}), dry_run=True)
        assert done.returncode == 0, done.stderr


async def test_longest_deadline_is_one_a_job_accepts(crds: LocalCluster, scratch: str) -> None:
    longest = run_with(
        timeoutSeconds=MAX_DEADLINE_SECONDS,
        schedule="@daily",
        startingDeadlineSeconds=MAX_DEADLINE_SECONDS,
    )
    run = create(crds, scratch, longest, dry_run=True)
    assert run.returncode == 0, run.stderr
    job_body = job_with("deadline", {}, activeDeadlineSeconds=MAX_DEADLINE_SECONDS)
    job = create(crds, scratch, job_body, dry_run=True)
    assert job.returncode == 0, job.stderr


async def test_largest_parameters_fit_the_run_and_its_configmap(
    crds: LocalCluster, namespace: str
) -> None:
    # Every character one Go's JSON writes as \u003c, filling the total bound;
    # applied client-side, so kubectl's last-applied annotation holds it too.
    width = MAX_PARAMETER_VALUE_LENGTH - 3
    count = MAX_PARAMETERS_TOTAL_LENGTH // MAX_PARAMETER_VALUE_LENGTH
    params = {f"<{i:02}": "<" * width for i in range(count)}
    assert sum(len(k) + len(v) for k, v in params.items()) == MAX_PARAMETERS_TOTAL_LENGTH
    apply(crds, namespace, json.dumps(obj("InferenceConfig", "cfg", CONFIG_SPEC)))
    apply(
        crds, namespace, json.dumps(obj("InferenceRun", "run", {**RUN_SPEC, "parameters": params}))
    )
    config = InferenceConfig.model_validate(get_json(crds, namespace, "infcfg", "cfg"))
    run = InferenceRun.model_validate(get_json(crds, namespace, "infrun", "run"))
    assert run.spec.parameters == params
    done = create(crds, namespace, desired_configmap(run, config))
    assert done.returncode == 0, done.stderr
    # The run's status carries the same contract next to spec.parameters.
    contract = json.loads(render_contract(run, config))
    patch_status(crds, namespace, "infrun", "run", {"contract": contract})
    stored = get_json(crds, namespace, "infrun", "run")["status"]["contract"]
    assert stored["parameters"] == params


# --------------------------------------------------------------------------------------------
# The rendered children are created for real under Pod Security "restricted"


def read_pairs(cluster: LocalCluster, namespace: str) -> list[tuple[InferenceRun, InferenceConfig]]:
    configs = {
        item["metadata"]["name"]: InferenceConfig.model_validate(item)
        for item in get_json(cluster, namespace, "inferenceconfigs")["items"]
    }
    runs = [
        InferenceRun.model_validate(i)
        for i in get_json(cluster, namespace, "inferenceruns")["items"]
    ]
    return [
        (run, configs[run.spec.config_ref.name])
        for run in runs
        if run.spec.config_ref.name in configs
    ]


def create_children(cluster: LocalCluster, namespace: str, children: list[dict[str, Any]]) -> None:
    done = create(cluster, namespace, *children)
    assert done.returncode == 0, done.stderr
    # Pod Security only warns about a Job/CronJob template; a warning here
    # would mean the pods themselves are refused later.
    assert "would violate PodSecurity" not in done.stderr, done.stderr


async def pods_of(
    cluster: LocalCluster, namespace: str, selector: str, count: int
) -> list[dict[str, Any]]:
    async def probe() -> list[dict[str, Any]] | None:
        pods = get_json(cluster, namespace, "pods", "-l", selector)["items"]
        return pods if len(pods) >= count else None

    return await eventually(probe, within=60, what=f"{count} pod(s) with {selector}")


async def test_rendered_children_are_created_in_a_restricted_namespace(
    crds: LocalCluster, restricted_namespace: str
) -> None:
    ns = restricted_namespace
    # custom-storage.yaml names its own runner identity: the user creates it.
    crds.kubectl("create", "serviceaccount", "-n", ns, "parquet-runner")
    for path in ("iris-oneshot.yaml", "iris-scheduled.yaml", "custom-storage.yaml"):
        crds.kubectl("apply", "-n", ns, "-f", str(REPO / "examples" / path))
    pairs = read_pairs(crds, ns)
    assert {run.metadata.name for run, _ in pairs} == {"iris-once", "iris-hourly", "churn-daily"}
    seen: list[dict[str, Any]] = []
    for run, config in pairs:
        workload = desired_workload(run, config, runner_service_account="default")
        create_children(crds, ns, [desired_configmap(run, config), workload])
        selector = f"{RUN_UID_LABEL}={run.metadata.uid}"
        if workload["kind"] == "CronJob":
            # What the CronJob controller would do at the next tick, now.
            job = f"{workload['metadata']['name']}-2900000000"
            crds.kubectl(
                "create", "job", "-n", ns, job, f"--from=cronjob/{workload['metadata']['name']}"
            )
            selector = f"batch.kubernetes.io/job-name={job}"
        pods = await pods_of(crds, ns, selector, run.spec.parallelism)
        for pod in pods:
            assert pod["metadata"]["labels"][RUN_UID_LABEL] == run.metadata.uid
        seen += pods
    # The controller's informers find every runner pod by one selector. Judged
    # on the pods as they were seen: a finished one may be gone by now (a
    # relisting after the last run found 4 of the 6 under load).
    key, value = managed_selector().split("=")
    assert len(seen) >= 1 + 1 + 4
    assert all(pod["metadata"]["labels"].get(key) == value for pod in seen)


async def test_longest_names_make_valid_sharded_pods(
    crds: LocalCluster, restricted_namespace: str
) -> None:
    ns = restricted_namespace
    idle = {**CONFIG_SPEC, "image": "example.com/idle:1"}  # the node agent runs nothing for it
    apply(crds, ns, json.dumps(obj("InferenceConfig", "cfg", idle)))
    long_name = "a-very-long-inference-run-name-" + "x" * 60
    apply(crds, ns, json.dumps(obj("InferenceRun", long_name, {**RUN_SPEC, "parallelism": 12})))
    apply(
        crds,
        ns,
        json.dumps(
            obj(
                "InferenceRun",
                long_name[:-1],
                {**RUN_SPEC, "parallelism": 12, "schedule": "@yearly"},
            )
        ),
    )
    for run, config in read_pairs(crds, ns):
        workload = desired_workload(run, config)
        create_children(crds, ns, [desired_configmap(run, config), workload])
        name = workload["metadata"]["name"]
        selector = f"{RUN_UID_LABEL}={run.metadata.uid}"
        if workload["kind"] == "CronJob":
            assert len(name) <= 52 - 3
            # The longest Job name the CronJob controller can make: 11 more characters.
            job = f"{name}-9999999999"
            assert len(job) <= 63
            crds.kubectl("create", "job", "-n", ns, job, f"--from=cronjob/{name}")
            selector = f"batch.kubernetes.io/job-name={job}"
        # Index 11 gives the longest hostname "<job>-11"; all 12 pods must exist.
        await pods_of(crds, ns, selector, 12)


@pytest.mark.parametrize(
    ("before", "after"),
    [({}, {"schedule": "0 * * * *"}), ({"schedule": "0 * * * *"}, {"schedule": None})],
)
async def test_a_schedule_cannot_be_added_to_or_removed_from_a_run(
    crds: LocalCluster, namespace: str, before: dict[str, Any], after: dict[str, Any]
) -> None:
    body = run_with(**before)
    created = create(crds, namespace, body)
    assert created.returncode == 0, created.stderr
    edited = crds.kubectl(
        "patch", "-n", namespace, "inferencerun", "bad", "--type=merge",
        "-p", json.dumps({"spec": after}), check=False,
    )  # fmt: skip
    assert edited.returncode != 0
    assert "spec.schedule cannot be added to or removed from an existing run" in edited.stderr
    # Other edits stay possible.
    crds.kubectl(
        "patch", "-n", namespace, "inferencerun", "bad", "--type=merge",
        "-p", json.dumps({"spec": {"timeoutSeconds": 7}}),
    )  # fmt: skip
