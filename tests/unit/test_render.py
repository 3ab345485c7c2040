"""The contract (byte for byte as upstream renders it) and the desired children."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pydantic import ValidationError

from contract.document import STORAGE_SECRETS_DIR, Contract, OpenAI, secret_references
from controller import naming
from controller.api import InferenceConfig, InferenceRun
from controller.render import (
    CONTRACT_KEY,
    CONTRACT_PATH,
    contract_document,
    desired_configmap,
    desired_cronjob,
    desired_hash,
    desired_job,
    desired_probe,
    desired_workload,
    go_json,
    probe_contract,
    render_contract,
)
from tests.unit.helpers import UID, config_raw, run_raw

# The example contract of upstream's README, in its own key order.
README_CONTRACT = """
{
"jobId":"5be07ada-5fe0-4c9e-a8bc-aaae67d8d344",
"jobName":"inf-example-inference-run-triton-5be07ada",
"kserve":{
"modelName":"sklearn-iris",
"modelUrl":"kserve-krateo-ttm-predictor.kserve-test.svc.cluster.local/v2/models/granite-timeseries-ttm-r2/infer",
"modelVersion":"v2",
"modelInputName":"past_values"
},
"input":{"krateo":{"api":{
  "endpointRef":{"name":"finops-database-handler-endpoint","namespace":"kserve-controller-system"},
  "headers":["Accept: application/json","Content-Type: application/json"],
  "path":"/compute/tritoninput","verb":"POST"}}},
"output":{"krateo":{"api":{
  "endpointRef":{"name":"finops-database-handler-endpoint","namespace":"kserve-controller-system"},
  "headers":["Accept: application/json","Content-Type: application/json"],
  "path":"/compute/tritonoutput","verb":"POST"}}},
"parameters":{
"input_data_length":"512",
"input_table_column_name":"average",
"input_table_name":"azuretoolkit",
"key_name":"resourceid",
"key_value":"sample_vm",
"output_table_name":"kserve_controller_output_triton"
}
}
"""


def krateo(path: str) -> dict[str, Any]:
    # Deliberately not in sorted order: the renderer must sort like Go does.
    return {
        "api": {
            "verb": "POST",
            "path": path,
            "headers": ["Accept: application/json", "Content-Type: application/json"],
            "endpointRef": {
                "namespace": "kserve-controller-system",
                "name": "finops-database-handler-endpoint",
            },
        }
    }


def triton_config_raw(**spec: Any) -> dict[str, Any]:
    """Upstream's worked example: config ``team-a/cfg`` of the Triton time-series model."""
    base: dict[str, Any] = {
        "image": "ghcr.io/krateoplatformops/kserve-krateo-runner:0.1.0",
        "autoDeletePolicy": "None",
        "kserve": {
            "modelName": "sklearn-iris",
            "modelUrl": "kserve-krateo-ttm-predictor.kserve-test.svc.cluster.local"
            "/v2/models/granite-timeseries-ttm-r2/infer",
            "modelVersion": "v2",
            "modelInputName": "past_values",
        },
        "storage": {
            "input": {"krateo": krateo("/compute/tritoninput")},
            "output": {"krateo": krateo("/compute/tritonoutput")},
        },
    }
    return config_raw(typed=True, namespace="team-a", **(base | spec))


def triton_run_raw(name: str = "example-inference-run-triton", **spec: Any) -> dict[str, Any]:
    """Upstream's worked example: run ``team-a/example-inference-run-triton`` of that config."""
    base: dict[str, Any] = {
        "configRef": {"name": "cfg", "namespace": "team-a"},
        "timeoutSeconds": 3600,
        "parameters": {
            "output_table_name": "kserve_controller_output_triton",
            "key_value": "sample_vm",
            "key_name": "resourceid",
            "input_table_name": "azuretoolkit",
            "input_table_column_name": "average",
            "input_data_length": "512",
        },
    }
    return run_raw(typed=True, name=name, namespace="team-a", **(base | spec))


def config(**spec: Any) -> InferenceConfig:
    return InferenceConfig.model_validate(triton_config_raw(**spec))


def run(name: str = "example-inference-run-triton", **spec: Any) -> InferenceRun:
    return InferenceRun.model_validate(triton_run_raw(name, **spec))


# --------------------------------------------------------------------------------------------
# Contract


def test_readme_contract_byte_for_byte() -> None:
    expected = json.dumps(json.loads(README_CONTRACT), separators=(",", ":"))
    assert render_contract(run(), config()) == expected


def test_key_order() -> None:
    doc = json.loads(
        render_contract(
            run(),
            config(batching={"batchSize": 8}),
        )
    )
    assert list(doc) == ["jobId", "jobName", "kserve", "input", "output", "parameters", "batching"]
    assert list(doc["kserve"]) == ["modelName", "modelUrl", "modelVersion", "modelInputName"]
    assert list(doc["batching"]) == [
        "batchSize",
        "concurrency",
        "requestTimeoutSeconds",
        "maxRetries",
    ]


def test_contract_validates_as_the_runners_model() -> None:
    text = render_contract(run(parallelism=3), config(batching={}))
    contract = Contract.model_validate_json(text)
    assert contract.job_id == UID
    assert contract.sharding is not None
    assert contract.sharding.count == 3
    assert contract.batching is not None
    assert contract.batching.batch_size == 256


def test_flat_model_fields_from_the_upstream_readme() -> None:
    raw = triton_config_raw()
    kserve = raw["spec"].pop("kserve")
    raw["spec"].update(kserve)  # modelName, modelUrl, … flat under spec
    flat = InferenceConfig.model_validate(raw)
    assert render_contract(run(), flat) == render_contract(run(), config())


def test_nested_model_fields_win_field_by_field() -> None:
    cfg = config(
        kserve={"modelUrl": "http://nested/infer", "modelName": ""},
        modelUrl="http://flat/infer",
        modelName="flat-name",
        modelInputName="flat-input",
    )
    doc = contract_document(run(), cfg)
    assert doc["kserve"] == {
        "modelName": "flat-name",  # nested is empty: the flat one fills in
        "modelUrl": "http://nested/infer",
        "modelInputName": "flat-input",
    }


def test_empty_kserve_fields_are_left_out() -> None:
    cfg = config(kserve={"modelUrl": "m", "modelVersion": ""})
    assert render_contract(run(), cfg).count('"kserve":{"modelUrl":"m"}') == 1


def test_parameters_absent_empty_and_present() -> None:
    raw = triton_run_raw()
    del raw["spec"]["parameters"]
    absent = InferenceRun.model_validate(raw)
    assert "parameters" not in json.loads(render_contract(absent, config()))
    empty = run(parameters={})
    assert render_contract(empty, config()).endswith(',"parameters":{}}')
    assert json.loads(render_contract(run(), config()))["parameters"]["key_name"] == "resourceid"


def test_empty_storage_sides_are_left_out() -> None:
    cfg = config(storage={"input": {"krateo": krateo("/in")}})
    doc = json.loads(render_contract(run(), cfg))
    assert "output" not in doc
    assert list(doc) == ["jobId", "jobName", "kserve", "input", "parameters"]


def test_storage_passthrough_is_exact_and_sorted_like_go() -> None:
    odd = {
        "zeta": {"b": 1, "a": [{"y": 2.5, "x": None}, True, "<b>&</b>"]},
        "alpha": {"float": 1.0, "big": 1e21, "tiny": 1.5e-7, "neg": -0.001, "int": 42},
        "utf8": {"é": "naïve — 日本", "ctl": "tab\tnl\nbell\x07", "ls": "\u2028"},
    }
    cfg = config(storage={"input": odd})
    text = render_contract(run(), cfg)
    assert json.loads(text)["input"] == odd
    inner = text.split('"input":', 1)[1].split(',"parameters"', 1)[0]
    assert inner == (
        '{"alpha":{"big":1e+21,"float":1,"int":42,"neg":-0.001,"tiny":1.5e-7},'
        '"utf8":{"ctl":"tab\\tnl\\nbell\\u0007","ls":"\\u2028","é":"naïve — 日本"},'
        '"zeta":{"a":[{"x":null,"y":2.5},true,"\\u003cb\\u003e\\u0026\\u003c/b\\u003e"],"b":1}}'
    )


def test_parameters_are_escaped_like_go() -> None:
    text = render_contract(run(parameters={"q": "a<b && c>d", "ü": "ß"}), config())
    assert text.endswith('"parameters":{"q":"a\\u003cb \\u0026\\u0026 c\\u003ed","ü":"ß"}}')


def test_contract_is_deterministic() -> None:
    assert render_contract(run(), config()) == render_contract(run(), config())


def test_contract_needs_a_uid() -> None:
    raw = triton_run_raw()
    raw["metadata"]["uid"] = ""
    with pytest.raises(ValueError, match="no uid"):
        render_contract(InferenceRun.model_validate(raw), config())


def test_job_name_in_contract_follows_the_schedule_bound() -> None:
    long_name = "r" * 70
    one_shot = json.loads(render_contract(run(long_name), config()))["jobName"]
    scheduled = json.loads(render_contract(run(long_name, schedule="@hourly"), config()))
    assert len(one_shot) == 62
    assert len(scheduled["jobName"]) == 52


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.0, "0"),
        (-0.0, "-0"),
        (1.0, "1"),
        (100.0, "100"),
        (0.1, "0.1"),
        (3.14, "3.14"),
        (1e-6, "0.000001"),
        (1.23e-6, "0.00000123"),
        (9.99e-7, "9.99e-7"),
        (2.5e-10, "2.5e-10"),
        (1e16, "10000000000000000"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (-1.5e300, "-1.5e+300"),
        (123456789.125, "123456789.125"),
        (5e-324, "5e-324"),
    ],
)
def test_go_float_formatting(value: float, expected: str) -> None:
    assert go_json(value) == expected


def test_go_json_rejects_what_json_cannot_hold() -> None:
    with pytest.raises(ValueError, match="nan"):
        go_json(float("nan"))
    with pytest.raises(TypeError, match="set"):
        go_json({1, 2})


def test_go_json_scalars_and_invalid_unicode() -> None:
    assert go_json([None, True, False, -7, "\ud800x", "\b\f\x1f\x7f"]) == (
        '[null,true,false,-7,"\ufffdx","\\b\\f\\u001f\x7f"]'
    )


# --------------------------------------------------------------------------------------------
# ConfigMap


def test_configmap_holds_the_contract_under_the_job_name() -> None:
    r, c = run(), config()
    cm = desired_configmap(r, c)
    assert cm["apiVersion"] == "v1"
    assert cm["kind"] == "ConfigMap"
    assert cm["metadata"]["name"] == "inf-example-inference-run-triton-5be07ada"
    assert cm["metadata"]["namespace"] == "team-a"
    assert cm["data"] == {CONTRACT_KEY: render_contract(r, c)}
    assert cm["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "ai.krateo.io/v1",
            "kind": "InferenceRun",
            "name": "example-inference-run-triton",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert cm["metadata"]["labels"][naming.RUN_UID_LABEL] == UID
    assert cm["metadata"]["labels"][naming.MANAGED_BY_LABEL] == naming.MANAGED_BY_VALUE


# --------------------------------------------------------------------------------------------
# Job


def pod_spec(job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


def test_job_shape() -> None:
    r, c = run(), config()
    job = desired_job(r, c, runner_service_account="kserve-runner")
    name = "inf-example-inference-run-triton-5be07ada"
    assert job["apiVersion"] == "batch/v1"
    assert job["kind"] == "Job"
    assert job["metadata"]["name"] == name
    spec = job["spec"]
    assert spec["backoffLimit"] == 2
    assert spec["completions"] == 1
    assert spec["parallelism"] == 1
    assert "completionMode" not in spec
    assert spec["activeDeadlineSeconds"] == 3600
    assert spec["suspend"] is False
    assert "ttlSecondsAfterFinished" not in spec
    assert spec["podFailurePolicy"]["rules"] == [
        {
            "action": "FailJob",
            "onExitCodes": {
                "containerName": "inference",
                "operator": "In",
                "values": [2, 6, 7, 8, 9],
            },
        },
        # Output that is not keyed: an evicted pod counts as an attempt (see below).
    ]
    assert spec["template"]["metadata"]["labels"] == job["metadata"]["labels"]

    pod = pod_spec(job)
    assert pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == "kserve-runner"
    assert pod["automountServiceAccountToken"] is True
    assert "imagePullSecrets" not in pod
    (container,) = pod["containers"]
    assert container["name"] == "inference"
    assert container["image"] == "ghcr.io/krateoplatformops/kserve-krateo-runner:0.1.0"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["env"] == [
        {"name": "pod_uid", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert "resources" not in container
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}
    assert volumes["contract"]["configMap"]["name"] == name
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/tmp"]["name"] == "tmp"
    assert mounts[CONTRACT_PATH] == {
        "name": "contract",
        "mountPath": "/tmp/contract.json",
        "subPath": "contract.json",
        "readOnly": True,
    }


# --------------------------------------------------------------------------------------------
# The runner's identity: a ServiceAccount token only where it reads a Secret through the API


def _storage(secret_ref: dict[str, str] | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"bucket": "b", "key": "in.parquet", "format": "parquet"}
    if secret_ref is not None:
        entry["secretRef"] = secret_ref
    return {"input": {"s3": entry}, "output": {"s3": {**entry, "key": "out.parquet"}}}


def _token_mounted(pod: dict[str, Any]) -> bool:
    return bool(pod["automountServiceAccountToken"])


def test_api_secret_source_mounts_the_token_only_where_a_secret_is_referenced() -> None:
    # The default: upstream's configs reference Secrets in other namespaces.
    assert config().spec.secret_source == "API"
    referencing = pod_spec(desired_job(run(), config()))
    assert _token_mounted(referencing)
    assert not any(v["name"].startswith("storage-secret") for v in referencing["volumes"]), (
        "API reads need no Secret volume"
    )
    # S3 with credentials from the runner pod's env (valueFrom.secretKeyRef): no Secret read.
    plain = config(storage=_storage(None))
    assert plain.spec.secret_references() == []
    pod = pod_spec(desired_job(run(), plain))
    assert pod["automountServiceAccountToken"] is False
    probe = desired_probe(plain, "probe-name")[1]
    assert pod_spec(probe)["automountServiceAccountToken"] is False
    assert _token_mounted(pod_spec(desired_probe(config(), "probe-name")[1]))


def test_volumes_secret_source_mounts_each_secret_and_no_token() -> None:
    c = config(
        secretSource="Volumes",
        storage={
            "input": {"s3": _storage({"name": "s3-creds"})["input"]["s3"]},
            "output": {
                "postgres": {"table": "t", "secretRef": {"name": "db", "namespace": "team-a"}}
            },
        },
    )
    for pod in (pod_spec(desired_job(run(), c)), pod_spec(desired_probe(c, "probe-name")[1])):
        assert pod["automountServiceAccountToken"] is False
        (container,) = pod["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["RUNNER_SECRETS_DIR"]["value"] == STORAGE_SECRETS_DIR
        # Without a token there is no ServiceAccount namespace file: the namespace comes as env.
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert volumes["storage-secret-0"]["secret"] == {
            "secretName": "s3-creds",
            "defaultMode": 0o440,
            "optional": True,
        }
        assert volumes["storage-secret-1"]["secret"]["secretName"] == "db"
        assert mounts["storage-secret-0"] == {
            "name": "storage-secret-0",
            "mountPath": f"{STORAGE_SECRETS_DIR}/s3-creds",
            "readOnly": True,
        }
        assert mounts["storage-secret-1"]["mountPath"] == f"{STORAGE_SECRETS_DIR}/db"
    # Pod Security "restricted" allows secret volumes.
    assert {next(k for k in v if k != "name") for v in pod["volumes"]} == {
        "emptyDir",
        "configMap",
        "secret",
    }


def test_volumes_secret_source_refuses_secrets_of_another_namespace() -> None:
    # krateo() names kserve-controller-system, the config lives in team-a.
    with pytest.raises(ValidationError, match=r"kserve-controller-system/finops-database"):
        config(secretSource="Volumes")
    with pytest.raises(ValidationError):
        config(secretSource="Kubelet")


def test_secret_references_are_found_at_any_depth_once_each() -> None:
    assert secret_references(
        {"krateo": krateo("/a")},
        {"krateo": krateo("/b"), "http": {"secretRef": {"name": "h"}, "x": [{"endpointRef": 1}]}},
    ) == [("kserve-controller-system", "finops-database-handler-endpoint"), (None, "h")]


def test_job_passes_pod_security_restricted() -> None:
    pod = pod_spec(desired_job(run(), config()))
    (container,) = pod["containers"]
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["readOnlyRootFilesystem"] is True
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] == 65532
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # restricted forbids hostPath and the like: only emptyDir and configMap here.
    assert {next(k for k in v if k != "name") for v in pod["volumes"]} == {"emptyDir", "configMap"}


def test_job_options_from_config_and_run() -> None:
    c = config(
        credentialsRef={"name": "regcred", "namespace": "elsewhere"},
        serviceAccountName="custom-runner",
        imagePullPolicy="Always",
        resources={"limits": {"memory": "512Mi"}, "requests": {"cpu": "100m", "memory": 128}},
    )
    r = run(timeoutSeconds=0, backoffLimit=5, suspend=True)
    job = desired_job(r, c, runner_service_account="default-runner")
    pod = pod_spec(job)
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["serviceAccountName"] == "custom-runner"  # the config's wins
    (container,) = pod["containers"]
    assert container["imagePullPolicy"] == "Always"
    assert container["resources"] == {
        "limits": {"memory": "512Mi"},
        "requests": {"cpu": "100m", "memory": 128},
    }
    assert "activeDeadlineSeconds" not in job["spec"]  # 0 = no deadline, as upstream
    assert job["spec"]["backoffLimit"] == 5
    assert job["spec"]["suspend"] is True


def test_job_without_any_service_account_uses_the_namespace_default() -> None:
    assert "serviceAccountName" not in pod_spec(desired_job(run(), config()))


def test_sharded_run_is_an_indexed_job() -> None:
    r, c = run(parallelism=4), config()
    job = desired_job(r, c)
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == 4
    assert job["spec"]["parallelism"] == 4
    assert json.loads(render_contract(r, c))["sharding"] == {"count": 4}
    assert "sharding" not in json.loads(render_contract(run(), c))


def test_no_credential_or_ttl_anywhere() -> None:
    c = config(credentialsRef={"name": "regcred"})
    for obj in (desired_job(run(), c), desired_cronjob(run(schedule="@daily"), c)):
        text = json.dumps(obj)
        assert "ttlSecondsAfterFinished" not in text
        assert "secretKeyRef" not in text
        assert '"secret"' not in text


# --------------------------------------------------------------------------------------------
# CronJob


def test_cronjob_shape() -> None:
    r = run(
        "nightly-iris",
        schedule="*/15 8-18 * * MON-FRI",
        timeZone="Europe/Rome",
        startingDeadlineSeconds=120,
        successfulJobsHistoryLimit=5,
        failedJobsHistoryLimit=2,
    )
    c = config()
    cron = desired_cronjob(r, c, runner_service_account="kserve-runner")
    assert cron["apiVersion"] == "batch/v1"
    assert cron["kind"] == "CronJob"
    spec = cron["spec"]
    assert spec["schedule"] == "*/15 8-18 * * MON-FRI"
    assert spec["timeZone"] == "Europe/Rome"
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["startingDeadlineSeconds"] == 120
    assert spec["successfulJobsHistoryLimit"] == 5
    assert spec["failedJobsHistoryLimit"] == 2
    assert spec["suspend"] is False
    assert spec["jobTemplate"]["metadata"]["labels"] == cron["metadata"]["labels"]
    # The job template is the one-shot Job's spec (suspend lives on the CronJob).
    one_shot = desired_job(run("nightly-iris"), c, runner_service_account="kserve-runner")
    expected = copy.deepcopy(one_shot["spec"])
    del expected["suspend"]
    template = spec["jobTemplate"]["spec"]
    assert (
        template["template"]["spec"]["volumes"][1]["configMap"]["name"]
        == (cron["metadata"]["name"])
    )
    expected["template"]["spec"]["volumes"][1]["configMap"]["name"] = cron["metadata"]["name"]
    expected["template"]["metadata"]["labels"] = template["template"]["metadata"]["labels"]
    assert template == expected


def test_cronjob_defaults_and_schedule_verbatim() -> None:
    cron = desired_cronjob(run(schedule="@hourly", concurrencyPolicy="Replace"), config())
    assert cron["spec"]["schedule"] == "@hourly"
    assert cron["spec"]["concurrencyPolicy"] == "Replace"
    for absent in ("timeZone", "startingDeadlineSeconds", "successfulJobsHistoryLimit"):
        assert absent not in cron["spec"]
    assert len(cron["metadata"]["name"]) <= 52


def test_workload_follows_the_schedule() -> None:
    assert desired_workload(run(), config())["kind"] == "Job"
    assert desired_workload(run(schedule="0 * * * *"), config())["kind"] == "CronJob"
    with pytest.raises(ValueError, match="has a schedule"):
        desired_job(run(schedule="0 * * * *"), config())
    with pytest.raises(ValueError, match="no schedule"):
        desired_cronjob(run(), config())


def test_desired_hash_tracks_the_spec() -> None:
    c = config()
    first = desired_job(run(), c)["metadata"]["annotations"][naming.DESIRED_HASH_ANNOTATION]
    again = desired_job(run(), c)["metadata"]["annotations"][naming.DESIRED_HASH_ANNOTATION]
    other = desired_job(run(backoffLimit=3), c)["metadata"]["annotations"]
    assert first == again
    assert other[naming.DESIRED_HASH_ANNOTATION] != first
    assert desired_hash({"a": 1, "b": 2}) == desired_hash({"b": 2, "a": 1})


def keyed_config(**spec: Any) -> InferenceConfig:
    """A config whose input pages: the run streams and its output is keyed."""
    paged = {**krateo("/compute/tritoninput"), "paging": {"pageSize": 100}}
    storage = {"input": {"krateo": paged}, "output": {"krateo": krateo("/compute/tritonoutput")}}
    return config(storage=storage, **spec)


def test_only_keyed_output_lets_an_evicted_pod_go_uncounted() -> None:
    ignore = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    keyed = desired_job(run(), keyed_config())["spec"]["podFailurePolicy"]["rules"]
    assert keyed[-1] == ignore
    plain = desired_job(run(), config())["spec"]["podFailurePolicy"]["rules"]
    assert ignore not in plain
    assert [rule["action"] for rule in plain] == ["FailJob"]


@pytest.mark.parametrize("scheduled", [False, True])
def test_unkeyed_output_retries_never_fails_the_run_on_its_first_failed_attempt(
    scheduled: bool,
) -> None:
    extra: dict[str, Any] = {"backoffLimit": 5}
    if scheduled:
        extra["schedule"] = "0 * * * *"

    def backoff(c: InferenceConfig) -> int:
        rendered = desired_workload(run(**extra), c)["spec"]
        spec = rendered["jobTemplate"]["spec"] if scheduled else rendered
        limit: int = spec["backoffLimit"]
        return limit

    assert backoff(config()) == 5  # the default: upstream's retries
    assert backoff(config(unkeyedOutputRetries="Allow")) == 5
    assert backoff(config(unkeyedOutputRetries="Never")) == 0
    # Keyed output stores each row once: its retries are kept.
    assert backoff(keyed_config(unkeyedOutputRetries="Never")) == 5
    postgres = {
        "input": {"krateo": krateo("/compute/tritoninput")},
        "output": {"postgres": {"host": "db", "database": "d", "table": "predictions"}},
    }
    assert backoff(config(storage=postgres, unkeyedOutputRetries="Never")) == 5


def test_unkeyed_output_retries_is_checked() -> None:
    with pytest.raises(ValidationError, match="unkeyedOutputRetries"):
        config(unkeyedOutputRetries="Sometimes")


def test_an_openai_block_reaches_the_contract_as_the_runner_reads_it() -> None:
    openai = {
        "endpoint": "chat/completions",
        "request": {"max_tokens": 64, "temperature": 0, "stop": ["\n\n"]},
        "inputColumn": "question",
        "outputColumns": {"text": "answer", "usage": None},
        "onRowError": "record",
    }
    cfg = config(
        kserve={
            "modelName": "llama",
            "modelUrl": "llm/openai/v1",
            "modelVersion": "openai",
            "openai": openai,
        }
    )
    text = render_contract(run(), cfg)
    contract = Contract.model_validate_json(text)
    assert contract.kserve.openai == OpenAI.model_validate(openai)
    assert contract.kserve.openai is not None
    assert contract.kserve.openai.output_columns.usage is None
    assert json.loads(text)["kserve"]["openai"]["request"] == openai["request"]
    assert probe_contract(cfg, "probe")["kserve"]["openai"] == json.loads(text)["kserve"]["openai"]


def test_an_openai_block_needs_model_version_openai() -> None:
    with pytest.raises(ValidationError, match=r"kserve\.openai applies only"):
        config(kserve={"modelUrl": "llm/openai/v1", "modelVersion": "v2", "openai": {}})
