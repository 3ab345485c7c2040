"""The API models: parsing, the checks the CRD schema cannot do, status, and CRD/model agreement."""

from __future__ import annotations

import json
import re
import typing
import zoneinfo
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from contract.credentials import find_inline_credentials
from contract.document import Batching
from contract.termination import RunResult
from controller import api, cron, quantity, render
from controller.api import (
    Condition,
    Execution,
    InferenceConfig,
    InferenceConfigStatus,
    InferenceRun,
    InferenceRunStatus,
    ObjectReference,
    Progress,
    find_condition,
    run_config_warnings,
    set_condition,
)
from controller.cron import CRON_DESCRIPTORS, CRON_PATTERN, check_schedule
from controller.invalid import InvalidObject, describe_invalid
from tests.unit.helpers import config_raw, run_raw

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "crds"
EXAMPLES = REPO / "examples"


def krateo_config(**spec: Any) -> dict[str, Any]:
    """A config reading from Krateo with a plain HTTP model URL; ``spec`` overrides."""
    base = {
        "kserve": {"modelUrl": "http://model/v2/models/m/infer"},
        "storage": {"input": {"krateo": {"api": {"path": "/in"}}}},
    }
    return config_raw(uid="u1", **(base | spec))


def timed_run(**spec: Any) -> dict[str, Any]:
    """Run ``ns/run`` with a 60 s timeout and no generation; ``spec`` overrides."""
    return run_raw(name="run", uid="u2", generation=None, **({"timeoutSeconds": 60} | spec))


def invalid(
    model: type[InferenceRun] | type[InferenceConfig], raw: dict[str, Any]
) -> tuple[str, str]:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(raw)
    return describe_invalid(caught.value)


# --------------------------------------------------------------------------------------------
# Parsing


def test_examples_parse_and_are_usable() -> None:
    configs: dict[str, InferenceConfig] = {}
    runs: list[InferenceRun] = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            doc["metadata"].setdefault("namespace", "ns")
            doc["metadata"].setdefault("uid", "0000")
            if doc["kind"] == "InferenceConfig":
                configs[doc["metadata"]["name"]] = InferenceConfig.model_validate(doc)
            else:
                runs.append(InferenceRun.model_validate(doc))
    assert len(configs) >= 4
    assert len(runs) >= 5
    for r in runs:
        assert r.spec.config_ref.name in configs, r.metadata.name
    assert any(r.spec.scheduled for r in runs)
    assert any(not r.spec.scheduled for r in runs)


def test_upstream_readme_config_with_flat_model_fields() -> None:
    raw = {
        "apiVersion": "ai.krateo.io/v1",
        "kind": "InferenceConfig",
        "metadata": {"name": "iris-inference-config", "namespace": "kserve-controller-system"},
        "spec": {
            "autoDeletePolicy": "None",
            "image": "ghcr.io/krateoplatformops/kserve-krateo-runner:0.1.0",
            "modelName": "sklearn-iris",
            "modelUrl": "sklearn-iris-predictor.kserve-test.svc.cluster.local"
            "/v2/models/sklearn-iris/infer",
            "modelVersion": "v2",
            "storage": {"input": {"krateo": {"api": {"path": "/compute/kserveinput"}}}},
        },
    }
    kserve = InferenceConfig.model_validate(raw).spec.effective_kserve()
    assert kserve.model_name == "sklearn-iris"
    assert kserve.model_url is not None
    assert kserve.model_url.startswith("sklearn-iris-predictor")
    assert kserve.model_input_name is None


def test_unknown_fields_are_tolerated() -> None:
    raw = timed_run(futureField={"x": 1})
    raw["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    raw["status"] = {"phase": "Running", "somethingNew": True}
    parsed = InferenceRun.model_validate(raw)
    assert parsed.status.phase == "Running"


def test_defaults_match_upstream_semantics() -> None:
    r = InferenceRun.model_validate(timed_run())
    assert r.spec.backoff_limit == 2
    assert r.spec.parallelism == 1
    assert r.spec.suspend is False
    assert r.config_key == ("ns", "cfg")
    c = InferenceConfig.model_validate(krateo_config())
    assert c.spec.auto_delete_policy == "None"
    assert c.spec.image_pull_policy == "IfNotPresent"


def test_config_ref_namespace() -> None:
    r = InferenceRun.model_validate(timed_run(configRef={"name": "cfg", "namespace": "shared"}))
    assert r.config_key == ("shared", "cfg")


@pytest.mark.parametrize(("timeout", "deadline"), [(None, None), (0, None), (1, 1), (3600, 3600)])
def test_timeout_zero_means_no_deadline(timeout: int | None, deadline: int | None) -> None:
    raw = timed_run()
    raw["spec"]["timeoutSeconds"] = timeout
    if timeout is None:
        del raw["spec"]["timeoutSeconds"]
    assert InferenceRun.model_validate(raw).spec.deadline_seconds == deadline


# --------------------------------------------------------------------------------------------
# Checks the schema cannot do


def test_config_without_model_url_is_not_usable() -> None:
    raw = krateo_config(kserve={"modelName": "iris"})
    reason, message = invalid(InferenceConfig, raw)
    assert reason == "MissingModelUrl"
    assert "modelUrl" in message


def test_flat_model_url_is_enough() -> None:
    raw = krateo_config(kserve={"modelUrl": ""}, modelUrl="http://flat")
    assert InferenceConfig.model_validate(raw).spec.effective_kserve().model_url == "http://flat"


@pytest.mark.parametrize(
    "storage",
    [
        {"krateo": {"api": {"password": "hunter2"}}},
        {"http": {"auth": {"Token": "abc"}}},
        {"s3": {"secret_access_key": "AKIA..."}},
        {"http": {"headers": ["Accept: application/json", "Authorization: Bearer abc"]}},
        {"http": {"headers": ["x-api-key: 123"]}},
        {"http": {"url": "https://user:pw@example.com/data"}},
    ],
)
def test_inline_credentials_are_refused(storage: dict[str, Any]) -> None:
    reason, message = invalid(InferenceConfig, krateo_config(storage={"input": storage}))
    assert reason == "InlineCredentials"
    # The message names where, never what.
    for secret in ("hunter2", "abc", "AKIA", "123", ":pw@"):
        assert secret not in message


@pytest.mark.parametrize(
    "storage",
    [
        {"krateo": {"api": {"endpointRef": {"name": "endpoint", "namespace": "krateo-system"}}}},
        {"http": {"token": {"secretKeyRef": {"name": "s", "key": "token"}}}},
        {"http": {"password": ""}},
        {"http": {"url": "https://example.com:8443/data", "headers": ["Accept: text/csv"]}},
        {"s3": {"secretName": "bucket-credentials", "passwordRef": "x"}},
    ],
)
def test_references_are_not_credentials(storage: dict[str, Any]) -> None:
    assert find_inline_credentials(storage) == []
    InferenceConfig.model_validate(krateo_config(storage={"input": storage}))


def test_inline_credential_paths() -> None:
    found = find_inline_credentials({"a": [{"token": "t"}], "b": {"Authorization": "Basic x"}})
    assert found == ["a[0].token", "b.Authorization"]


VALID_SCHEDULES = [
    "0 * * * *",
    "1 * * * *",
    "* * * * *",
    "*/5 * * * *",
    "0 0 1 1 *",
    "0,15,30,45 8-18 * * 1-5",
    "*/15 8-18 * * MON-FRI",
    "0 0 ? JAN-MAR sun",
    "5/10 * * * *",
    "0 23 31 12 6",
    " 0 1  2 3 4 ",
    "*/60 * * * *",
    "*/999 * * * *",
    "0 0 */31 * *",
    # Every descriptor the grammar names (test_crds checks robfig/cron takes them all).
    *(f"@{name}" for name in CRON_DESCRIPTORS),
]

INVALID_SCHEDULES = [
    "",
    "* * * *",
    "* * * * * *",
    "60 * * * *",
    "0 24 * * *",
    "0 0 0 * *",
    "0 0 32 * *",
    "0 0 * 13 *",
    "0 0 * * 7",
    "*/0 * * * *",
    "*/1000 * * * *",
    "*/99999999999999999999 * * * *",
    "0 0 1/9223372036854775808 * *",
    "5-1 * * * *",
    "0 0 * DEC-JAN *",
    "0 0 31 2 *",
    "CRON_TZ=UTC 0 * * * *",
    "TZ=Europe/Rome 0 * * * *",
    "@every 5m",
    "@HOURLY",
    "0\t* * * *",
    "0 * * * *\n",
    "L * * * *",
    "0 0 * * MON#2",
]


@pytest.mark.parametrize("schedule", VALID_SCHEDULES)
def test_valid_schedules(schedule: str) -> None:
    check_schedule(schedule)
    assert re.fullmatch(CRON_PATTERN, schedule)


@pytest.mark.parametrize("schedule", INVALID_SCHEDULES)
def test_invalid_schedules(schedule: str) -> None:
    reason, message = invalid(InferenceRun, timed_run(schedule=schedule))
    assert reason == "InvalidSchedule"
    assert message.startswith("spec.schedule: ")


def test_schedule_messages_say_what_to_do() -> None:
    _, tz = invalid(InferenceRun, timed_run(schedule="CRON_TZ=UTC 0 * * * *"))
    assert "spec.timeZone" in tz
    _, never = invalid(InferenceRun, timed_run(schedule="0 0 30 2 *"))
    assert "never fires" in never
    _, backwards = invalid(InferenceRun, timed_run(schedule="0 0 * DEC-JAN *"))
    assert "month range 'DEC-JAN' runs backwards" in backwards
    _, step = invalid(InferenceRun, timed_run(schedule="*/99999999999999999999 * * * *"))
    assert "steps of at most 3 digits" in step


@pytest.mark.parametrize(
    "tz", ["UTC", "Europe/Rome", "America/Argentina/Buenos_Aires", "Etc/GMT+5"]
)
def test_valid_time_zones(tz: str) -> None:
    InferenceRun.model_validate(timed_run(schedule="@daily", timeZone=tz))


@pytest.mark.parametrize("tz", ["Local", "Mars/Olympus", "../etc/passwd", ""])
def test_invalid_time_zones(tz: str) -> None:
    reason, message = invalid(InferenceRun, timed_run(schedule="@daily", timeZone=tz))
    assert reason == "InvalidTimeZone"
    assert message.startswith("spec.timeZone: ")


def test_scheduling_fields_need_a_schedule() -> None:
    reason, message = invalid(InferenceRun, timed_run(timeZone="UTC", concurrencyPolicy="Allow"))
    assert reason == "InvalidSpec"
    assert "timeZone, concurrencyPolicy only apply to scheduled runs" in message


# --------------------------------------------------------------------------------------------
# What the API server or the Job/CronJob controllers would refuse at child creation


@pytest.mark.parametrize("field", ["timeoutSeconds", "startingDeadlineSeconds"])
@pytest.mark.parametrize("seconds", [2**63 - 1, 1000 * 365 * 86400, api.MAX_DEADLINE_SECONDS + 1])
def test_deadlines_a_duration_cannot_hold_are_refused(field: str, seconds: int) -> None:
    reason, message = invalid(InferenceRun, timed_run(schedule="@daily", **{field: seconds}))
    assert reason == "InvalidSpec"
    assert message == (
        f"spec.{field}: Input should be less than or equal to {api.MAX_DEADLINE_SECONDS} "
        f"(got {seconds})"
    )


def test_ten_years_is_the_longest_deadline() -> None:
    assert api.MAX_DEADLINE_SECONDS == 315_360_000
    # Far below where time.Duration (int64 nanoseconds) overflows.
    assert api.MAX_DEADLINE_SECONDS * 10**9 < (2**63 - 1) // 10
    longest = timed_run(
        schedule="@daily",
        timeoutSeconds=api.MAX_DEADLINE_SECONDS,
        startingDeadlineSeconds=api.MAX_DEADLINE_SECONDS,
    )
    assert InferenceRun.model_validate(longest).spec.deadline_seconds == api.MAX_DEADLINE_SECONDS


@pytest.mark.parametrize(
    "spec",
    [
        {"kserve": {"modelUrl": "http://user:s3cr3t@model.ns.svc/v2/models/m/infer"}},
        {"kserve": {"modelUrl": "https://:s3cr3t@model.ns.svc"}},
        {"kserve": {"modelUrl": "user:s3cr3t@model.ns.svc/v2/models/m/infer"}},
        {"kserve": {"modelUrl": "http://m"}, "modelUrl": "http://user:s3cr3t@m/v2"},
        {"kserve": None, "modelUrl": "HTTP://user:s3cr3t@m:8080/v2"},
    ],
)
def test_model_url_with_a_password_is_refused(spec: dict[str, Any]) -> None:
    reason, message = invalid(InferenceConfig, krateo_config(**spec))
    assert reason == "InlineCredentials"
    assert "modelUrl carries a credential" in message
    assert "s3cr3t" not in message


def test_model_url_credentials_name_the_field() -> None:
    nested = krateo_config(kserve={"modelUrl": "http://u:p@m"})
    flat = krateo_config(kserve={"modelUrl": "http://m"}, modelUrl="http://u:p@m")
    both = krateo_config(kserve={"modelUrl": "http://u:p@m"}, modelUrl="http://u:p@m")
    assert invalid(InferenceConfig, nested)[1].startswith("spec: kserve.modelUrl carries")
    assert invalid(InferenceConfig, flat)[1].startswith("spec: modelUrl carries")
    assert invalid(InferenceConfig, both)[1].startswith("spec: kserve.modelUrl and modelUrl")


@pytest.mark.parametrize(
    "url",
    [
        "sklearn-iris-predictor.kserve-test.svc.cluster.local/v2/models/sklearn-iris/infer",
        "http://model:8080/v2/models/m/infer",
        "model.ns.svc:8080/v2/models/m/infer",
        "http://model/v2/models/m@1/infer",
        "http://model/v2/models/m/infer?user=a:b@c",
        "http://token@model/v2",  # no password: nothing to leak that a URL does not already say
    ],
)
def test_model_urls_without_a_password_are_accepted(url: str) -> None:
    assert not api.model_url_has_password(url)
    InferenceConfig.model_validate(krateo_config(kserve={"modelUrl": url}, modelUrl=url))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", "0.5"),
        ("1Gi", "1073741824"),
        ("1.5Mi", "1572864"),
        ("2k", "2000"),
        ("1e3", "1000"),
        ("1E", "1000000000000000000"),
        (".5", "0.5"),
        ("1.", "1"),
        ("+1", "1"),
        ("-1", "-1"),
        ("1n", "0.000000001"),
        ("0.0000000001", "0.000000001"),  # rounded up to a billionth, as Go does
        ("99999999999999999999", str(2**63 - 1)),  # capped, as Go does
        (7, "7"),
        ("1e1.5", None),
        ("1e", None),
        ("1K", None),
        ("lots", None),
        ("", None),
        ("1e99999999999999999999", None),
    ],
)
def test_parse_quantity(text: str | int, value: str | None) -> None:
    parsed = quantity.parse_quantity(text)
    assert parsed == (None if value is None else Decimal(value))


VALID_RESOURCES: list[dict[str, Any]] = [
    {"limits": {"cpu": "500m", "memory": "1Gi"}},
    {"limits": {"cpu": 1, "memory": "512Mi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
    {"limits": {"cpu": "1"}, "requests": {"cpu": "1000m"}},
    {"requests": {"cpu": "-0", "ephemeral-storage": "1Gi"}},
    {"limits": {"nvidia.com/gpu": 1}},
    {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "2000m"}},
    {"limits": {"example.com/foo_bar": "1k", "kubernetes.io/native": "0.5"}},
    {"limits": {"hugepages-2Mi": "4Mi", "memory": "1Gi"}},
    {"limits": {"hugepages-1Gi": "2Gi"}, "requests": {"hugepages-1Gi": "2Gi", "cpu": "1"}},
    {"limits": {}, "requests": {}},
]

INVALID_RESOURCES: list[tuple[dict[str, Any], str]] = [
    ({"limits": {"cpu": "-1"}}, "cpu must not be negative"),
    ({"requests": {"memory": -1}}, "memory must not be negative"),
    ({"limits": {"cpu": "1e1.5"}}, "cpu is not a quantity"),
    ({"limits": {"cpu": "1" * 65}}, "longer than 64"),
    ({"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}, "the cpu request must not exceed"),
    ({"requests": {"memory": "1025Mi"}, "limits": {"memory": "1Gi"}}, "memory request"),
    ({"limits": {"gpu": 1}}, "'gpu' is not a container resource"),
    ({"limits": {"storage": "1Gi"}}, "'storage' is not a container resource"),
    ({"limits": {"Nvidia.com/gpu": 1}}, "not a container resource"),
    ({"limits": {"requests.example.com/x": 1}}, "not a container resource"),
    ({"limits": {"a/b/c": 1}}, "not a container resource"),
    ({"limits": {"a" * 245 + "/x": 1}}, "not a container resource"),
    ({"limits": {"example.com/" + "x" * 64: 1}}, "not a container resource"),
    ({"limits": {"nvidia.com/gpu": "0.5"}}, "nvidia.com/gpu is an extended resource"),
    ({"limits": {"nvidia.com/gpu": "1500m"}}, "it must be a whole number"),
    ({"requests": {"nvidia.com/gpu": 1}}, "nvidia.com/gpu needs a limit equal to its request"),
    (
        {"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 2}},
        "the nvidia.com/gpu request must equal its limit",
    ),
    ({"limits": {"hugepages-2Mi": "4Mi"}}, "hugepages need a cpu or memory"),
    ({"limits": {"hugepages-2Mi": "3Mi", "cpu": "1"}}, "whole multiple of its page size (2097152"),
    ({"limits": {"hugepages-foo": "4Mi", "cpu": "1"}}, "does not name a page size"),
    ({"limits": {"hugepages-1.5": "3", "cpu": "1"}}, "does not name a page size"),
    ({"limits": {f"example.com/r{i}": 1 for i in range(17)}}, "at most 16 resources"),
]


@pytest.mark.parametrize("resources", VALID_RESOURCES)
def test_valid_resources(resources: dict[str, Any]) -> None:
    config = InferenceConfig.model_validate(krateo_config(resources=resources))
    assert config.spec.resources is not None


@pytest.mark.parametrize(("resources", "expected"), INVALID_RESOURCES)
def test_resources_a_pod_cannot_have_are_refused(resources: dict[str, Any], expected: str) -> None:
    reason, message = invalid(InferenceConfig, krateo_config(resources=resources))
    assert reason == "InvalidResources"
    assert message.startswith("spec.resources")
    assert expected in message


def test_the_examples_resources_are_valid() -> None:
    # ttm.yaml is the example with resources: the check must leave it alone.
    docs = list(yaml.safe_load_all((EXAMPLES / "ttm.yaml").read_text()))
    (config,) = (d for d in docs if d["kind"] == "InferenceConfig")
    assert config["spec"]["resources"]
    assert quantity.resource_list_errors(config["spec"]["resources"].get("limits", {})) == []


def test_parameters_are_bounded() -> None:
    most = {f"p{i:02}": "v" * 100 for i in range(api.MAX_PARAMETERS)}
    assert InferenceRun.model_validate(timed_run(parameters=most)).spec.parameters == most
    _, many = invalid(InferenceRun, timed_run(parameters={**most, "one-more": "v"}))
    assert many.startswith("spec.parameters: Dictionary should have at most 64 items")
    _, long_value = invalid(InferenceRun, timed_run(parameters={"p": "v" * 4097}))
    assert long_value == "spec.parameters.p: String should have at most 4096 characters"
    _, long_name = invalid(InferenceRun, timed_run(parameters={"k" * 254: "v"}))
    assert "String should have at most 253 characters" in long_name
    total = {f"p{i:02}": "v" * 4093 for i in range(9)}  # 9 * 4096 > 32768
    reason, too_much = invalid(InferenceRun, timed_run(parameters=total))
    assert reason == "InvalidSpec"
    assert too_much.startswith("spec.parameters: parameter names and values total 36864")
    InferenceRun.model_validate(timed_run(parameters=dict(list(total.items())[:8])))


def test_maximal_parameters_fit_a_configmap() -> None:
    # The worst case for size: every character one that Go's JSON writes as
    # \u003c, filling the total bound exactly.
    n = api.MAX_PARAMETERS_TOTAL_LENGTH // api.MAX_PARAMETER_VALUE_LENGTH
    width = api.MAX_PARAMETER_VALUE_LENGTH - 3
    params = {f"<{i:02}": "<" * width for i in range(n)}
    assert sum(len(k) + len(v) for k, v in params.items()) == api.MAX_PARAMETERS_TOTAL_LENGTH
    run = InferenceRun.model_validate(timed_run(parameters=params))
    config = InferenceConfig.model_validate(krateo_config())
    size = len(json.dumps(render.desired_configmap(run, config)).encode())
    assert 6 * api.MAX_PARAMETERS_TOTAL_LENGTH <= size < 1024 * 1024 // 4


@pytest.mark.parametrize("image", [" runner:1", "runner:1 ", "runner:1\n", "\trunner:1"])
def test_image_with_surrounding_whitespace_is_refused(image: str) -> None:
    reason, message = invalid(InferenceConfig, krateo_config(image=image))
    assert reason == "InvalidSpec"
    assert message.startswith("spec.image: the image must not have leading or trailing whitespace")


# --------------------------------------------------------------------------------------------
# describe_invalid


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            timed_run(timeoutSeconds=-1),
            "spec.timeoutSeconds: Input should be greater than or equal to 0 (got -1)",
        ),
        (timed_run(configRef={}), "spec.configRef.name: Field required"),
        (
            timed_run(parallelism=0),
            "spec.parallelism: Input should be greater than or equal to 1 (got 0)",
        ),
        (
            timed_run(concurrencyPolicy="Sometimes", schedule="@daily"),
            "spec.concurrencyPolicy: Input should be 'Allow', 'Forbid' or 'Replace' "
            "(got 'Sometimes')",
        ),
        (
            timed_run(parameters={"n": 5}),
            "spec.parameters.n: Input should be a valid string (got 5)",
        ),
        ({"metadata": {"name": "run"}}, "spec: Field required"),
    ],
)
def test_describe_invalid_run(raw: dict[str, Any], expected: str) -> None:
    reason, message = invalid(InferenceRun, raw)
    assert reason == "InvalidSpec"
    assert message == expected


def test_describe_invalid_config_never_echoes_storage() -> None:
    raw = krateo_config(autoDeletePolicy="Sometimes", storage={"input": {"krateo": "s3cr3t"}})
    reason, message = invalid(InferenceConfig, raw)
    assert reason == "InvalidSpec"
    assert (
        "spec.autoDeletePolicy: Input should be 'None', 'DeleteOnSuccess' or "
        "'DeleteOnCompletion' (got 'Sometimes')" in message
    )
    assert "spec.storage.input.krateo: Input should be a valid dictionary" in message
    assert "s3cr3t" not in message


def test_describe_invalid_bounds_the_message() -> None:
    raw = timed_run(
        timeoutSeconds=-1,
        parallelism=0,
        backoffLimit=-1,
        suspend="maybe",
        startingDeadlineSeconds=-1,
        schedule="@daily",
        successfulJobsHistoryLimit=-1,
        failedJobsHistoryLimit=-1,
    )
    _, message = invalid(InferenceRun, raw)
    assert message.endswith("; and 2 more")
    assert len(message) <= api.MAX_MESSAGE_LENGTH


def test_describe_invalid_object() -> None:
    assert describe_invalid(InvalidObject("ConfigNotFound", "no config ns/cfg")) == (
        "ConfigNotFound",
        "no config ns/cfg",
    )


def test_condition_reasons_are_valid() -> None:
    reason_re = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    for raw, model in [
        (timed_run(schedule="bad"), InferenceRun),
        (timed_run(schedule="@daily", timeZone="X/Y"), InferenceRun),
        (krateo_config(kserve={}), InferenceConfig),
        (krateo_config(storage={"input": {"a": {"token": "t"}}}), InferenceConfig),
        (krateo_config(image=""), InferenceConfig),
    ]:
        reason, _ = invalid(model, raw)
        assert reason_re.match(reason), reason


# --------------------------------------------------------------------------------------------
# Warnings for a valid run + config


def test_run_config_warnings() -> None:
    r = InferenceRun.model_validate(timed_run(schedule="@daily"))
    c = InferenceConfig.model_validate(
        krateo_config(
            autoDeletePolicy="DeleteOnSuccess",
            credentialsRef={"name": "regcred", "namespace": "other"},
            kserve={"modelUrl": "http://a", "modelName": "nested"},
            modelName="flat",
        )
    )
    reasons = [reason for reason, _ in run_config_warnings(r, c)]
    assert reasons == ["CredentialsNamespaceIgnored", "AutoDeleteIgnored", "ModelFieldsConflict"]
    one_shot = InferenceRun.model_validate(timed_run())
    same_ns = InferenceConfig.model_validate(
        krateo_config(credentialsRef={"name": "r", "namespace": "ns"})
    )
    assert run_config_warnings(one_shot, same_ns) == []


# --------------------------------------------------------------------------------------------
# Status


NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def condition(type_: str, status: str, reason: str, when: datetime = NOW) -> Condition:
    return Condition.model_validate(
        {"type": type_, "status": status, "reason": reason, "lastTransitionTime": when}
    )


def test_run_status_dump_is_camel_case_without_unset_fields() -> None:
    status = InferenceRunStatus(
        phase="Running",
        conditions=[condition("Ready", "True", "Running")],
        observed_generation=3,
        contract={"jobId": "u", "kserve": {}},
        job_status=ObjectReference(
            kind="Job", api_version="batch/v1", namespace="ns", name="inf-x", uid="j"
        ),
        start_time=NOW,
        progress=Progress(rows_done=120, rows_total=500),
    )
    assert status.to_api() == {
        "phase": "Running",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Running",
                "message": "",
                "lastTransitionTime": "2026-01-02T03:04:05Z",
            }
        ],
        "observedGeneration": 3,
        "contract": {"jobId": "u", "kserve": {}},
        "jobStatus": {
            "kind": "Job",
            "apiVersion": "batch/v1",
            "namespace": "ns",
            "name": "inf-x",
            "uid": "j",
        },
        "startTime": "2026-01-02T03:04:05Z",
        "progress": {"rowsDone": 120, "rowsTotal": 500, "summary": "120/500 (24%)"},
    }


def test_run_status_round_trip() -> None:
    status = InferenceRunStatus(
        phase="Scheduled",
        last_schedule_time=NOW,
        result=RunResult(rows=10, predictions=10, duration_seconds=1.5),
        reason="BackoffLimitExceeded",
        message="input: table missing",
        last_execution=Execution(
            name="inf-x-29000000", phase="Failed", reason="InputFailed", start_time=NOW
        ),
    )
    again = InferenceRunStatus.model_validate(status.to_api())
    assert again == status
    assert again.last_schedule_time == NOW.replace(microsecond=0)


def test_times_are_utc_seconds() -> None:
    rome = timezone(timedelta(hours=1))
    status = InferenceRunStatus(start_time=datetime(2026, 1, 2, 4, 4, 5, 999, tzinfo=rome))
    assert status.to_api() == {"conditions": [], "startTime": "2026-01-02T03:04:05Z"}
    parsed = InferenceRunStatus.model_validate({"startTime": "2026-01-02T03:04:05Z"})
    assert parsed.start_time == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("done", "total", "summary"),
    [(0, None, "0"), (7, 0, "7"), (0, 3, "0/3 (0%)"), (3, 3, "3/3 (100%)"), (5, 3, "5/3 (100%)")],
)
def test_progress_summary(done: int, total: int | None, summary: str) -> None:
    assert Progress(rows_done=done, rows_total=total).summary == summary


def test_unreadable_status_does_not_invalidate_the_object() -> None:
    raw = timed_run()
    raw["status"] = {"phase": "Exploded", "conditions": "nope"}
    assert InferenceRun.model_validate(raw).status == InferenceRunStatus()
    cfg = krateo_config()
    cfg["status"] = {"conditions": [{"type": "Ready"}]}
    assert InferenceConfig.model_validate(cfg).status == InferenceConfigStatus()


def test_set_condition_keeps_transition_time_when_status_is_unchanged() -> None:
    later = NOW + timedelta(minutes=5)
    first = [condition("Ready", "True", "Running"), condition("Complete", "False", "Running")]
    same = set_condition(first, condition("Ready", "True", "StillRunning", later))
    ready = find_condition(same, "Ready")
    assert ready is not None
    assert ready.reason == "StillRunning"
    assert ready.last_transition_time == NOW
    flipped = set_condition(same, condition("Complete", "True", "Succeeded", later))
    complete = find_condition(flipped, "Complete")
    assert complete is not None
    assert complete.last_transition_time == later
    added = set_condition(flipped, condition("Failed", "False", "Succeeded", later))
    assert [c.type for c in added] == ["Ready", "Complete", "Failed"]
    assert find_condition(added, "Suspended") is None


# --------------------------------------------------------------------------------------------
# The CRDs agree with the models


def crd(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((CRDS / f"{name}.ai.krateo.io.yaml").read_text())
    return doc


def schema(name: str) -> dict[str, Any]:
    version = crd(name)["spec"]["versions"][0]
    result: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return result


def walk(node: dict[str, Any], path: str = "") -> typing.Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for key, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{key}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")


@pytest.mark.parametrize("name", ["inferenceruns", "inferenceconfigs"])
def test_every_field_is_described_and_typed(name: str) -> None:
    for path, node in walk(schema(name)):
        if path == ".metadata":
            continue
        assert node.get("description"), f"{name}{path} has no description"
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{name}{path} has no type"


@pytest.mark.parametrize("name", ["inferenceruns", "inferenceconfigs"])
def test_crd_names(name: str) -> None:
    spec = crd(name)["spec"]
    assert spec["group"] == "ai.krateo.io"
    assert spec["scope"] == "Namespaced"
    (version,) = spec["versions"]
    assert version["name"] == "v1"
    assert version["served"]
    assert version["storage"]
    assert version["subresources"] == {"status": {}}
    assert spec["names"]["categories"] == ["inference"]
    assert spec["names"]["shortNames"] == [
        {"inferenceruns": "infrun", "inferenceconfigs": "infcfg"}[name]
    ]


def test_printer_columns() -> None:
    columns = {
        name: [
            c["name"]
            for c in crd(name)["spec"]["versions"][0]["additionalPrinterColumns"]
            if not c.get("priority")
        ]
        for name in ("inferenceruns", "inferenceconfigs")
    }
    assert columns["inferenceruns"] == [
        "Phase",
        "Config",
        "Progress",
        "Job",
        "Reason",
        "Age",
    ]
    assert columns["inferenceconfigs"] == ["Ready", "Probed", "Image", "Age"]


def enum_of(name: str, path: str) -> list[str]:
    nodes = dict(walk(schema(name)))
    values: list[str] = nodes[path]["enum"]
    return values


def test_enums_match_the_models() -> None:
    assert enum_of("inferenceconfigs", ".spec.autoDeletePolicy") == list(
        typing.get_args(api.AutoDeletePolicy)
    )
    assert enum_of("inferenceconfigs", ".spec.imagePullPolicy") == list(
        typing.get_args(api.ImagePullPolicy)
    )
    assert enum_of("inferenceruns", ".spec.concurrencyPolicy") == list(
        typing.get_args(api.ConcurrencyPolicy)
    )
    assert enum_of("inferenceruns", ".status.phase") == list(typing.get_args(api.Phase))
    assert enum_of("inferenceruns", ".status.lastExecution.phase") == list(
        typing.get_args(api.ExecutionPhase)
    )


def test_defaults_match_the_models() -> None:
    runs, configs = dict(walk(schema("inferenceruns"))), dict(walk(schema("inferenceconfigs")))
    spec = InferenceRun.model_validate(timed_run()).spec
    assert runs[".spec.backoffLimit"]["default"] == spec.backoff_limit
    assert runs[".spec.parallelism"]["default"] == spec.parallelism
    assert runs[".spec.parallelism"]["maximum"] == api.MAX_PARALLELISM
    assert runs[".spec.suspend"]["default"] is spec.suspend
    assert runs[".spec.schedule"]["maxLength"] == cron.MAX_SCHEDULE_LENGTH
    cfg = InferenceConfig.model_validate(krateo_config()).spec
    assert configs[".spec.autoDeletePolicy"]["default"] == cfg.auto_delete_policy
    assert configs[".spec.imagePullPolicy"]["default"] == cfg.image_pull_policy
    batching = Batching()
    for field, value in batching.model_dump(by_alias=True).items():
        assert configs[f".spec.batching.{field}"]["default"] == value, field


def test_schedule_rule_is_the_models_pattern() -> None:
    rules = dict(walk(schema("inferenceruns")))[".spec.schedule"]["x-kubernetes-validations"]
    assert any(f"self.matches('{CRON_PATTERN}')" in rule["rule"] for rule in rules)
    assert "\\" not in CRON_PATTERN
    assert "'" not in CRON_PATTERN


def rules_of(name: str, path: str) -> list[str]:
    node = dict(walk(schema(name)))[path]
    return [rule["rule"] for rule in node.get("x-kubernetes-validations", [])]


def test_deadline_rules_are_the_models_bound() -> None:
    for field in ("timeoutSeconds", "startingDeadlineSeconds"):
        assert f"self <= {api.MAX_DEADLINE_SECONDS}" in rules_of("inferenceruns", f".spec.{field}")


def test_model_url_rules_are_the_models_pattern() -> None:
    expected = f"!has(self.modelUrl) || !self.modelUrl.matches('{api.MODEL_URL_WITH_PASSWORD}')"
    assert expected in rules_of("inferenceconfigs", ".spec")
    assert expected in rules_of("inferenceconfigs", ".spec.kserve")
    assert "\\" not in api.MODEL_URL_WITH_PASSWORD
    assert "'" not in api.MODEL_URL_WITH_PASSWORD


def test_resource_rules_are_the_models_bounds() -> None:
    nodes = dict(walk(schema("inferenceconfigs")))
    for field in ("limits", "requests"):
        node = nodes[f".spec.resources.{field}"]
        assert node["maxProperties"] == quantity.MAX_RESOURCES
        assert node["additionalProperties"]["maxLength"] == quantity.MAX_QUANTITY_LENGTH
        rules = " ".join(rules_of("inferenceconfigs", f".spec.resources.{field}"))
        assert f"k.matches('{quantity.RESOURCE_NAME_PATTERN}')" in rules
        assert "<= 63" in rules
        assert "<= 244" in rules


def test_parameter_rules_are_the_models_bounds() -> None:
    node = dict(walk(schema("inferenceruns")))[".spec.parameters"]
    assert node["maxProperties"] == api.MAX_PARAMETERS
    assert node["additionalProperties"]["maxLength"] == api.MAX_PARAMETER_VALUE_LENGTH
    rules = rules_of("inferenceruns", ".spec.parameters")
    assert f"self.all(k, k.size() <= {api.MAX_PARAMETER_NAME_LENGTH})" in rules
    assert f"self.map(k, k.size() + self[k].size()).sum() <= {api.MAX_PARAMETERS_TOTAL_LENGTH}" in (
        rules
    )


def test_every_time_zone_passes_the_crd_pattern() -> None:
    # The pattern holds each part to 14 characters, as CronJob validation does;
    # no zone in the database is longer, so none is refused.
    pattern = dict(walk(schema("inferenceruns")))[".spec.timeZone"]["pattern"]
    zones = zoneinfo.available_timezones()
    assert zones
    assert [z for z in sorted(zones) if not re.fullmatch(pattern, z)] == []
    assert not re.fullmatch(pattern, "America/Abcdefghijklmno")
