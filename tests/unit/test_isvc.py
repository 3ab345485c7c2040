"""A config's model named by an InferenceService: resolution, the run's wait, its status."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from controller.api import InferenceConfig, InferenceRun
from controller.caches import inferenceservice_index
from controller.invalid import describe_invalid
from controller.isvc import (
    Access,
    AccessState,
    ModelProblem,
    ResolvedModel,
    contract_model,
    resolve,
)
from controller.isvc_watch import next_discovery_delay
from controller.naming import DESIRED_HASH_ANNOTATION
from controller.plan import Create, Patch, View, plan
from controller.probe import ConfigView, plan_config
from controller.render import desired_configmap, desired_workload
from kubeclient.resources import CONFIGMAPS, CRONJOBS, JOBS
from tests.unit.helpers import NOW, UID

READY = AccessState(Access.READY)
INTERNAL = "http://iris-predictor.models.svc.cluster.local"
EXTERNAL = "http://iris-models.example.com"


def config(kserve: dict[str, Any] | None = None, **spec: Any) -> InferenceConfig:
    return InferenceConfig.model_validate(
        {
            "metadata": {"name": "cfg", "namespace": "ns", "uid": "cfg-uid", "generation": 3},
            "spec": {
                "image": "runner:1",
                "kserve": kserve
                if kserve is not None
                else {"inferenceServiceRef": {"name": "iris", "namespace": "models"}},
                "storage": {"input": {"http": {"url": "http://in"}}},
                **spec,
            },
        }
    )


def isvc(
    ready: str = "True",
    message: str = "",
    protocol: str | None = "v2",
    framework: str = "model",
    address: str | None = INTERNAL,
    url: str | None = EXTERNAL,
) -> dict[str, Any]:
    predictor: dict[str, Any] = {framework: {"storageUri": "gs://x"}}
    if protocol is not None:
        predictor[framework]["protocolVersion"] = protocol
    status: dict[str, Any] = {
        "conditions": [{"type": "Ready", "status": ready, "message": message, "reason": "R"}]
    }
    if address is not None:
        status["address"] = {"url": address}
    if url is not None:
        status["url"] = url
    return {
        "metadata": {"name": "iris", "namespace": "models"},
        "spec": {"predictor": predictor},
        "status": status,
    }


def test_a_ready_service_resolves_to_its_cluster_local_v2_url() -> None:
    got = resolve(config(), isvc(), READY)
    assert got == ResolvedModel(
        service="models/iris",
        url=f"{INTERNAL}/v2/models/iris/infer",
        protocol="v2",
        model_name="iris",
    )
    kserve = contract_model(config(), got)
    assert (kserve.model_url, kserve.model_name, kserve.model_version) == (
        f"{INTERNAL}/v2/models/iris/infer",
        "iris",
        "v2",
    )


def test_prefer_external_takes_status_url_and_v1_is_predict() -> None:
    cfg = config(
        {
            "inferenceServiceRef": {
                "name": "iris",
                "namespace": "models",
                "preferAddress": "external",
            }
        }
    )
    got = resolve(cfg, isvc(protocol=None, framework="sklearn"), READY)
    assert isinstance(got, ResolvedModel)
    # KServe's default protocol is v1.
    assert got.url == f"{EXTERNAL}/v1/models/iris:predict"
    assert got.protocol == "v1"


def test_internal_falls_back_to_the_url_and_external_does_not_fall_back() -> None:
    got = resolve(config(), isvc(address=None), READY)
    assert isinstance(got, ResolvedModel)
    assert got.url.startswith(EXTERNAL)
    cfg = config(
        {
            "inferenceServiceRef": {
                "name": "iris",
                "namespace": "models",
                "preferAddress": "external",
            }
        }
    )
    missing = resolve(cfg, isvc(url=None), READY)
    assert missing == ModelProblem(
        "ModelNotReady", "InferenceService models/iris is Ready but has no status.url yet"
    )


@pytest.mark.parametrize("version", ["openai", "OpenAI"])
def test_an_openai_model_calls_kserves_openai_routes_on_the_predictor(version: str) -> None:
    # KServe's Hugging Face and vLLM runtimes serve the OpenAI API under
    # /openai/v1; the runner adds chat/completions, completions or embeddings.
    cfg = config(
        {
            "inferenceServiceRef": {"name": "iris", "namespace": "models"},
            "modelVersion": version,
            "openai": {"endpoint": "completions", "request": {"max_tokens": 8}},
        }
    )
    got = resolve(cfg, isvc(protocol="v2", framework="huggingface"), READY)
    assert got == ResolvedModel(
        service="models/iris", url=f"{INTERNAL}/openai/v1", protocol="openai", model_name="iris"
    )
    kserve = contract_model(cfg, got)
    assert (kserve.model_url, kserve.model_version, kserve.model_name) == (
        f"{INTERNAL}/openai/v1",
        "openai",
        "iris",
    )
    assert kserve.openai is not None
    assert kserve.openai.endpoint == "completions"
    external = config(
        {
            "inferenceServiceRef": {
                "name": "iris",
                "namespace": "models",
                "preferAddress": "external",
            },
            "modelVersion": "openai",
        }
    )
    got = resolve(external, isvc(address=f"{INTERNAL}/"), READY)
    assert isinstance(got, ResolvedModel)
    assert got.url == f"{EXTERNAL}/openai/v1"


def test_the_configs_model_name_and_version_override_the_services() -> None:
    cfg = config(
        {
            "inferenceServiceRef": {"name": "iris", "namespace": "models"},
            "modelName": "sklearn-iris",
            "modelVersion": "v1",
            "modelInputName": "input-0",
        }
    )
    got = resolve(cfg, isvc(protocol="v2"), READY)
    assert isinstance(got, ResolvedModel)
    assert got.url == f"{INTERNAL}/v1/models/sklearn-iris:predict"
    assert contract_model(cfg, got).model_input_name == "input-0"


def test_a_service_not_ready_is_kserves_own_words() -> None:
    said = "Revision iris-predictor-00001 failed with message: container exited"
    got = resolve(config(), isvc(ready="False", message=said), READY)
    assert got == ModelProblem(
        "ModelNotReady", f"InferenceService models/iris is not Ready: {said}"
    )
    no_conditions = isvc()
    no_conditions["status"] = {}
    got = resolve(config(), no_conditions, READY)
    assert isinstance(got, ModelProblem)
    assert got.message == "InferenceService models/iris is not Ready yet"


@pytest.mark.parametrize(
    ("state", "found", "reason", "words"),
    [
        (READY, None, "InferenceServiceNotFound", "not found"),
        (
            AccessState(Access.CRD_MISSING),
            None,
            "InferenceServiceCRDMissing",
            "no InferenceService CRD",
        ),
        (
            AccessState(Access.FORBIDDEN, 'inferenceservices is forbidden: User "x" cannot list'),
            None,
            "InferenceServiceForbidden",
            "cannot list",
        ),
        (AccessState(Access.DISABLED), None, "InferenceServicesDisabled", "support is off"),
        (AccessState(Access.SYNCING), None, "ModelNotReady", "still reading"),
    ],
)
def test_what_cannot_be_read_says_why(
    state: AccessState, found: Any, reason: str, words: str
) -> None:
    got = resolve(config(), found, state)
    assert isinstance(got, ModelProblem)
    assert got.reason == reason
    assert words in got.message
    assert "models/iris" in got.message
    # Only a cache still being filled is not a settled answer.
    assert got.settled is (state.access is not Access.SYNCING)


def test_a_service_outside_the_watched_namespaces_is_out_of_reach() -> None:
    got = resolve(config(), isvc(), READY, ("ns", "other"))
    assert isinstance(got, ModelProblem)
    assert got.reason == "InferenceServiceOutOfReach"


def test_grpc_is_not_a_protocol_the_runner_speaks() -> None:
    got = resolve(config(), isvc(protocol="grpc-v2"), READY)
    assert isinstance(got, ModelProblem)
    assert got.reason == "UnsupportedProtocol"


def test_the_namespace_defaults_to_the_configs() -> None:
    cfg = config({"inferenceServiceRef": {"name": "iris"}})
    raw = {"metadata": {"name": "cfg", "namespace": "ns"}, "spec": cfg.spec.to_api()}
    assert inferenceservice_index(raw) == ["ns/iris"]
    got = resolve(cfg, isvc(), READY)
    assert isinstance(got, ResolvedModel)
    assert got.service == "ns/iris"


@pytest.mark.parametrize(
    ("kserve", "flat", "reason"),
    [
        (
            {"inferenceServiceRef": {"name": "iris"}, "modelUrl": "m:1/v2/models/m/infer"},
            {},
            "ConflictingModel",
        ),
        (
            {"inferenceServiceRef": {"name": "iris"}},
            {"modelUrl": "m:1/v2/models/m/infer"},
            "ConflictingModel",
        ),
        ({"modelName": "m"}, {}, "MissingModelUrl"),
        ({"modelUrl": "  "}, {}, "MissingModelUrl"),
    ],
)
def test_a_config_names_its_model_exactly_one_way(
    kserve: dict[str, Any], flat: dict[str, Any], reason: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        config(kserve, **flat)
    assert describe_invalid(caught.value)[0] == reason


# ----------------------------------------------------------------------- runs


def run() -> InferenceRun:
    return InferenceRun.model_validate(
        {
            "metadata": {"name": "r", "namespace": "ns", "uid": UID, "generation": 1},
            "spec": {"configRef": {"name": "cfg"}},
        }
    )


def test_a_run_waits_while_its_model_is_not_ready_and_creates_nothing() -> None:
    said = "InferenceService models/iris is not Ready: predictor is scaling up"
    out = plan(
        View(
            run=run(),
            now=NOW,
            config=config(),
            model=ModelProblem("ModelNotReady", said),
            confirmed=True,
        )
    )
    assert out.writes == []
    assert out.status is not None
    assert (out.status.phase, out.status.reason, out.status.message) == (
        "Pending",
        "ModelNotReady",
        said,
    )
    ready = next(c for c in out.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason, ready.message) == ("False", "ModelNotReady", said)
    assert out.status.contract is None
    assert [(e.type, e.reason) for e in out.events] == [("Warning", "ModelNotReady")]
    assert out.requeue_after is not None


def test_a_ready_model_reaches_the_contract() -> None:
    model = resolve(config(), isvc(), READY)
    out = plan(View(run=run(), now=NOW, config=config(), model=model, confirmed=True))
    assert [(type(w), w.resource) for w in out.writes] == [(Create, CONFIGMAPS), (Create, JOBS)]
    contract = json.loads(out.writes[0].obj["data"]["contract.json"])  # type: ignore[union-attr]
    assert contract["kserve"] == {
        "modelName": "iris",
        "modelUrl": f"{INTERNAL}/v2/models/iris/infer",
        "modelVersion": "v2",
    }
    assert out.status is not None
    assert out.status.contract is not None
    assert out.status.contract["kserve"]["modelUrl"] == f"{INTERNAL}/v2/models/iris/infer"


# ------------------------------------------------------------ scheduled runs

NOT_READY = ModelProblem(
    "ModelNotReady",
    "InferenceService models/iris is not Ready: Revision iris-predictor-00002 failed",
)


def scheduled(suspend: bool = False) -> InferenceRun:
    return InferenceRun.model_validate(
        {
            "metadata": {"name": "r", "namespace": "ns", "uid": UID, "generation": 1},
            "spec": {"configRef": {"name": "cfg"}, "schedule": "0 * * * *", "suspend": suspend},
            "status": {"phase": "Scheduled"},
        }
    )


def scheduled_children(r: InferenceRun) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ConfigMap and CronJob made while the model was Ready, as the API server returns them."""
    kserve = contract_model(config(), resolve(config(), isvc(), READY))
    made = [desired_configmap(r, config(), kserve=kserve), desired_workload(r, config())]
    for obj in made:
        obj["metadata"] |= {"uid": f"{obj['kind']}-uid", "resourceVersion": "7"}
    return made[0], made[1]


def test_a_scheduled_runs_cronjob_is_suspended_while_its_model_is_not_ready() -> None:
    # It used to go on firing against the model that is down, run after run.
    r = scheduled()
    cm, cron = scheduled_children(r)
    seen = {"config": config(), "model": NOT_READY, "configmaps": [cm], "cronjobs": [cron]}
    first = plan(View(run=r, now=NOW, **seen))
    assert first.confirm  # the service may only look so from a lagging cache
    assert first.writes == []

    out = plan(View(run=r, now=NOW, confirmed=True, **seen))
    (patch,) = out.writes
    assert isinstance(patch, Patch)
    name = cron["metadata"]["name"]
    assert (patch.resource, patch.name) == (CRONJOBS, name)
    assert patch.patch["spec"] == {"suspend": True}
    assert patch.patch["metadata"] == {
        "resourceVersion": "7",
        "annotations": {DESIRED_HASH_ANNOTATION: None},
    }
    assert out.status is not None
    assert (out.status.phase, out.status.reason) == ("Pending", "ModelNotReady")
    assert out.status.message == (
        f"{NOT_READY.message}; CronJob {name} is suspended until the model is Ready "
        "(an execution under way goes on)"
    )
    assert out.status.next_schedule_time is None
    ready = next(c for c in out.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason, ready.message) == (
        "False",
        "ModelNotReady",
        out.status.message,
    )
    assert [(e.type, e.reason) for e in out.events] == [("Warning", "ModelNotReady")]
    assert out.requeue_after is not None

    # Suspended: nothing more to write, and the run still says why.
    cron["spec"]["suspend"] = True
    del cron["metadata"]["annotations"][DESIRED_HASH_ANNOTATION]
    later = plan(View(run=r, now=NOW, **seen))
    assert (later.writes, later.confirm) == ([], False)
    assert later.status is not None
    assert (later.status.phase, later.status.reason) == ("Pending", "ModelNotReady")


@pytest.mark.parametrize("reason", ["InferenceServiceNotFound", "InferenceServiceForbidden"])
def test_a_model_that_cannot_be_resolved_suspends_the_cronjob_too(reason: str) -> None:
    r = scheduled()
    cm, cron = scheduled_children(r)
    problem = ModelProblem(reason, f"InferenceService models/iris: {reason}")
    out = plan(
        View(
            run=r,
            now=NOW,
            config=config(),
            model=problem,
            configmaps=[cm],
            cronjobs=[cron],
            confirmed=True,
        )
    )
    assert [w.patch["spec"] for w in out.writes] == [{"suspend": True}]  # type: ignore[union-attr]
    assert out.status is not None
    assert (out.status.phase, out.status.reason) == ("Pending", reason)


def test_the_model_ready_again_resumes_the_cronjob_with_its_url_as_it_is_then() -> None:
    r = scheduled()
    cm, cron = scheduled_children(r)
    cron["spec"]["suspend"] = True
    del cron["metadata"]["annotations"][DESIRED_HASH_ANNOTATION]
    moved = resolve(config(), isvc(address="http://iris-moved.models.svc"), READY)
    seen = {"config": config(), "model": moved, "configmaps": [cm], "cronjobs": [cron]}
    first = plan(View(run=r, now=NOW, **seen))
    assert first.confirm  # firing again needs the fresh view a create has
    assert first.writes == []

    out = plan(View(run=r, now=NOW, confirmed=True, **seen))
    assert [(type(w), w.resource) for w in out.writes] == [(Patch, CONFIGMAPS), (Patch, CRONJOBS)]
    configmap, cronjob = (w.patch for w in out.writes)  # type: ignore[union-attr]
    contract = json.loads(configmap["data"]["contract.json"])
    assert contract["kserve"]["modelUrl"] == "http://iris-moved.models.svc/v2/models/iris/infer"
    assert cronjob["spec"]["suspend"] is False
    assert out.status is not None
    assert out.status.phase == "Scheduled"


def test_a_cache_still_filling_does_not_suspend_the_cronjob() -> None:
    # A restarting controller reads InferenceServices anew: no schedule is paused for that.
    r = scheduled()
    cm, cron = scheduled_children(r)
    syncing = resolve(config(), None, AccessState(Access.SYNCING))
    out = plan(
        View(
            run=r,
            now=NOW,
            config=config(),
            model=syncing,
            configmaps=[cm],
            cronjobs=[cron],
            confirmed=True,
        )
    )
    assert (out.writes, out.confirm) == ([], False)
    assert out.status is not None
    assert out.status.phase == "Scheduled"
    warning = next(c for c in out.status.conditions if c.type == "Warning")
    assert warning.reason == "ModelNotReady"


def test_a_run_the_user_suspended_is_left_suspended_while_its_model_is_down() -> None:
    r = scheduled(suspend=True)
    cm, cron = scheduled_children(r)
    assert cron["spec"]["suspend"] is True
    out = plan(
        View(run=r, now=NOW, config=config(), model=NOT_READY, configmaps=[cm], cronjobs=[cron])
    )
    assert (out.writes, out.confirm) == ([], False)
    assert out.status is not None
    assert out.status.phase == "Suspended"


def test_a_scheduled_run_gets_no_cronjob_while_its_model_is_not_ready() -> None:
    out = plan(View(run=scheduled(), now=NOW, config=config(), model=NOT_READY, confirmed=True))
    assert out.writes == []
    assert out.status is not None
    assert (out.status.phase, out.status.reason, out.status.message) == (
        "Pending",
        "ModelNotReady",
        NOT_READY.message,
    )


# -------------------------------------------------------------------- configs


def config_view(model: Any) -> ConfigView:
    cfg = config()
    raw = {"metadata": cfg.metadata.to_api(), "spec": cfg.spec.to_api()}
    return ConfigView(raw=raw, now=NOW, config=cfg, model=model, probe_interval=600)


def test_the_configs_ready_follows_its_model_and_status_shows_the_url() -> None:
    waiting = plan_config(config_view(ModelProblem("ModelNotReady", "not Ready: scaling")))
    ready = next(c for c in waiting.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason, ready.message) == (
        "False",
        "ModelNotReady",
        "not Ready: scaling",
    )
    stalled = next(c for c in waiting.status.conditions if c.type == "Stalled")
    assert stalled.status == "False"  # it may resolve without an edit
    assert waiting.status.model is None
    assert waiting.create is None  # no probe of a model that is not there

    model = resolve(config(), isvc(), READY)
    done = plan_config(config_view(model))
    ready = next(c for c in done.status.conditions if c.type == "Ready")
    assert ready.status == "True"
    assert done.status.to_api()["model"] == {
        "url": f"{INTERNAL}/v2/models/iris/infer",
        "protocol": "v2",
        "name": "iris",
        "inferenceService": "models/iris",
    }
    assert done.create is not None  # the probe, with the resolved URL
    probe_contract = json.loads(done.create[0]["data"]["contract.json"])
    assert probe_contract["kserve"]["modelUrl"] == f"{INTERNAL}/v2/models/iris/infer"


def test_discovery_waits_double_up_to_the_most_and_stay_short_while_wanted() -> None:
    delays = [10.0]
    for _ in range(7):
        delays.append(next_discovery_delay(delays[-1], False, 10.0, 300.0))
    assert delays == [10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0, 300.0]
    assert next_discovery_delay(300.0, True, 10.0, 300.0) == 10.0
