"""The pure parts of ``python -m runner --check``: URLs, input compatibility, messages."""

from __future__ import annotations

import orjson
import pytest

from contract.document import KServe
from contract.exitcodes import ContractError, InferenceRejected
from runner.check import (
    ModelProbe,
    input_problem,
    model_probe,
    secret_refused,
    select_input,
    success_message,
)
from runner.inference import InputMetadata
from runner.secrets import SecretError, _api_error
from runner.storage.krateo import notebook_names, probe_target

pytestmark = pytest.mark.unit

IRIS = InputMetadata(name="input-0", datatype="FP32", shape=(-1, 4))
TTM = InputMetadata(name="past_values", datatype="FP32", shape=(-1, 512, 1))


@pytest.mark.parametrize(
    ("kserve", "expected"),
    [
        pytest.param(
            {"modelUrl": "m.ns.svc/v2/models/iris/infer"},
            ModelProbe("http://m.ns.svc/v2/models/iris", "v2", "iris"),
            id="v2-no-scheme",
        ),
        pytest.param(
            {"modelUrl": "https://gw/serving/v2/models/iris/versions/3/infer"},
            ModelProbe("https://gw/serving/v2/models/iris/versions/3", "v2", "iris"),
            id="v2-prefix-and-version",
        ),
        pytest.param(
            {"modelUrl": "http://m:8080/predict", "modelName": "iris"},
            ModelProbe("http://m:8080/v2/models/iris", "v2", "iris"),
            id="v2-name-from-modelName",
        ),
        pytest.param(
            {"modelUrl": "http://m:8080/predict"},
            ModelProbe("http://m:8080/predict", "v2", None),
            id="v2-no-name-probes-the-url",
        ),
        pytest.param(
            {"modelUrl": "http://m/p/v1/models/iris:predict"},
            ModelProbe("http://m/p/v1/models/iris", "v1", "iris"),
            id="v1-from-the-url",
        ),
        pytest.param(
            {"modelUrl": "http://m/score", "modelVersion": "v1", "modelName": "iris"},
            ModelProbe("http://m/v1/models/iris", "v1", "iris"),
            id="v1-from-modelVersion",
        ),
    ],
)
def test_the_model_probe_url_is_derived_as_a_run_derives_the_model(
    kserve: dict[str, str], expected: ModelProbe
) -> None:
    assert model_probe(KServe.model_validate(kserve)) == expected


def test_a_model_url_without_host_is_a_contract_error() -> None:
    with pytest.raises(ContractError, match="modelUrl"):
        model_probe(KServe.model_validate({"modelUrl": "ftp://x/y"}))


@pytest.mark.parametrize(
    ("declared", "batch_size", "problem"),
    [
        (IRIS, 256, None),
        (TTM, 256, None),
        (InputMetadata("x", "INT64", (-1, 3)), 256, None),
        (InputMetadata("x", "FP64", (-1,)), 256, None),
        (InputMetadata("x", "FP32", ()), 256, None),
        (InputMetadata("x", "FP32", (1, 4)), 1, None),
        (InputMetadata("x", "BYTES", (-1, 4)), 256, "datatype BYTES"),
        (InputMetadata("x", "BOOL", (-1, 4)), 256, "datatype BOOL"),
        (InputMetadata("x", "FP32", (8, 4)), 256, "fixes the batch dimension at 8"),
        (InputMetadata("x", "FP32", (1, 4)), 256, "fixes the batch dimension at 1"),
        (InputMetadata("x", "FP32", (-1, 0)), 256, "size 0"),
        (InputMetadata("x", "FP32", (-1, -2)), 256, "negative size"),
    ],
)
def test_input_compatibility(declared: InputMetadata, batch_size: int, problem: str | None) -> None:
    found = input_problem(declared, batch_size)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert problem in found


def test_the_input_is_the_named_one_else_the_first() -> None:
    assert select_input([IRIS, TTM], None, "m") == IRIS
    assert select_input([IRIS, TTM], "past_values", "m") == TTM
    assert select_input([], "anything", "m") is None


def test_an_undeclared_input_name_lists_the_models_inputs() -> None:
    with pytest.raises(InferenceRejected) as raised:
        select_input([IRIS, TTM], "input_0", "iris")
    assert raised.value.message == (
        "model 'iris' has no input 'input_0' (kserve.modelInputName); "
        "its inputs: input-0 (FP32 [-1, 4]), past_values (FP32 [-1, 512, 1])"
    )


@pytest.mark.parametrize(
    ("status", "refused"), [(404, True), (403, True), (401, False), (500, False)]
)
def test_a_missing_or_forbidden_secret_is_refused(status: int, refused: bool) -> None:
    error = SecretError(_api_error("ns", "s", status, b'{"message": "nope"}'))
    assert secret_refused(error) is refused


def test_an_unreachable_api_server_is_not_a_refusal() -> None:
    error = SecretError("cannot reach the Kubernetes API to read Secret ns/s: OSError")
    assert not secret_refused(error)


def test_the_success_message_is_one_short_json_line() -> None:
    probe = ModelProbe("http://m/v2/models/iris", "v2", "iris")
    message = success_message(probe, "input-0", [IRIS])
    assert "\n" not in message
    assert orjson.loads(message) == {
        "check": "ok",
        "protocol": "v2",
        "model": "iris",
        "input": "input-0",
        "inputs": [{"name": "input-0", "datatype": "FP32", "shape": [-1, 4]}],
    }
    many = [InputMetadata(f"i{n}", "FP32", (-1, 1)) for n in range(100)]
    assert len(orjson.loads(success_message(probe, "i0", many))["inputs"]) == 16
    blind = orjson.loads(success_message(ModelProbe("http://m/p", "v2", None), None, []))
    assert blind == {
        "check": "ok",
        "protocol": "v2",
        "model": None,
        "metadata": False,
        "inputs": [],
    }


@pytest.mark.parametrize(
    ("path", "target"),
    [
        ("/compute/sklearninput", ("compute/list", "sklearninput")),
        ("compute/sklearnoutput/", ("compute/list", "sklearnoutput")),
        ("/finops/compute/tritoninput", ("finops/compute/list", "tritoninput")),
        ("/upload", ("", None)),
        ("", ("", None)),
        ("/compute/list", ("", None)),
    ],
)
def test_the_krateo_probe_lists_the_notebooks_next_to_the_configured_one(
    path: str, target: tuple[str, str | None]
) -> None:
    assert probe_target(path) == target


def test_notebook_names_read_the_handlers_rows() -> None:
    listing = [["sklearninput"], ["tritonoutput"], "plain", {"NOTEBOOK_NAME": "dict"}, [], 3]
    assert notebook_names(listing) == {"sklearninput", "tritonoutput", "plain", "dict"}
    assert notebook_names({"error": "x"}) == set()
