"""Shaping requests and answers: OIP bodies, tensor shapes, storage bodies and checks."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from contract.document import KServe
from contract.exitcodes import ContractError
from runner.httputil import retry_after_seconds, server_message, trim
from runner.inference import (
    InputMetadata,
    ModelRefused,
    ShapeMismatch,
    TensorSpec,
    check_rows,
    classify,
    endpoint_from_contract,
    flatten,
    normalise_url,
    parse_metadata,
    parse_v1_response,
    parse_v2_response,
    resolve_tensor_spec,
    row_shape,
    v1_request,
    v2_request,
)
from runner.retry import Deadline, Transient
from runner.storage.base import StorageContext, StorageError, check_parameters, chunks, output_body
from runner.storage.endpoint import (
    Endpoint,
    build_endpoint,
    parse_bool,
    parse_header_lines,
    split_userinfo,
)
from runner.storage.transport import Answer, check_stored, rows_from

pytestmark = pytest.mark.unit

IRIS_META = [InputMetadata("input-0", "FP32", (-1, 4))]
TTM_META = [InputMetadata("past_values", "FP32", (-1, 512, 1))]


# -- where the model is ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kserve", "url", "protocol", "name", "metadata"),
    [
        (
            {"modelUrl": "iris.svc/v2/models/sklearn-iris/infer"},
            "http://iris.svc/v2/models/sklearn-iris/infer",
            "v2",
            "sklearn-iris",
            "http://iris.svc/v2/models/sklearn-iris",
        ),
        (
            {"modelUrl": "https://gw/ns/p/v2/models/m/versions/3/infer", "modelVersion": "V2"},
            "https://gw/ns/p/v2/models/m/versions/3/infer",
            "v2",
            "m",
            "https://gw/ns/p/v2/models/m/versions/3",
        ),
        (
            {"modelUrl": "http://h:8080/v1/models/iris:predict"},
            "http://h:8080/v1/models/iris:predict",
            "v1",
            "iris",
            None,
        ),
        (
            # An explicit modelVersion wins over the URL's look.
            {"modelUrl": "http://h/score", "modelVersion": "v1", "modelName": "x"},
            "http://h/score",
            "v1",
            "x",
            None,
        ),
        (
            # Upstream examples put a model version ("1") there: not a protocol.
            {"modelUrl": "http://h/score", "modelVersion": "1", "modelName": "x"},
            "http://h/score",
            "v2",
            "x",
            "http://h/v2/models/x",
        ),
    ],
)
def test_endpoint_from_contract(
    kserve: dict[str, str], url: str, protocol: str, name: str, metadata: str | None
) -> None:
    endpoint = endpoint_from_contract(KServe.model_validate(kserve))
    assert (endpoint.url, endpoint.protocol, endpoint.model_name, endpoint.metadata_url) == (
        url,
        protocol,
        name,
        metadata,
    )


@pytest.mark.parametrize(
    ("model_url", "message"),
    [
        (None, "kserve.modelUrl is required"),
        ("  ", "kserve.modelUrl is required"),
        ("ftp://h/v2/models/m/infer", "must be an http(s) URL with a host"),
        ("http:///v2/models/m/infer", "must be an http(s) URL with a host"),
    ],
)
def test_endpoint_from_contract_rejects_unusable_urls(model_url: str | None, message: str) -> None:
    with pytest.raises(ContractError, match=message.replace("(", r"\(").replace(")", r"\)")):
        endpoint_from_contract(KServe(model_url=model_url))


def test_normalise_url_adds_http_only_when_there_is_no_scheme() -> None:
    assert normalise_url("h:8080/x") == "http://h:8080/x"
    assert normalise_url(" https://h/x ") == "https://h/x"


# -- tensor shapes ------------------------------------------------------------------------


def test_iris_rows_keep_their_shape() -> None:
    spec = resolve_tensor_spec([5.1, 3.5, 1.4, 0.2], None, IRIS_META)
    assert spec == TensorSpec("input-0", "FP32", (4,))


def test_ttm_rows_take_the_models_extra_dimension() -> None:
    spec = resolve_tensor_spec([0.0] * 512, None, TTM_META)
    assert spec == TensorSpec("past_values", "FP32", (512, 1))


def test_rows_already_in_the_models_shape_are_left_alone() -> None:
    spec = resolve_tensor_spec([[0.0]] * 512, None, TTM_META)
    assert spec.row_shape == (512, 1)


def test_a_wildcard_dimension_is_filled_from_the_data() -> None:
    meta = [InputMetadata("x", "FP64", (-1, 8, -1))]
    assert resolve_tensor_spec([0.0] * 24, None, meta).row_shape == (8, 3)


def test_without_metadata_the_data_decides() -> None:
    assert resolve_tensor_spec([1, 2, 3], None, []) == TensorSpec("input-0", "FP32", (3,))
    assert resolve_tensor_spec([1, 2, 3], "features", []).name == "features"


def test_the_contracts_input_name_picks_the_declared_input() -> None:
    meta = [InputMetadata("a", "INT64", (-1, 2)), InputMetadata("b", "FP16", (-1, 3))]
    assert resolve_tensor_spec([1, 2, 3], "b", meta) == TensorSpec("b", "FP16", (3,))
    # A name the model does not declare: sent as named, shaped by the data.
    assert resolve_tensor_spec([1, 2, 3], "c", meta) == TensorSpec("c", "FP32", (3,))


@pytest.mark.parametrize(
    ("row", "meta", "message"),
    [
        ([1.0, 2.0, 3.0], IRIS_META, r"declares input 'input-0' of shape \[-1, 4\], .* \[3\]"),
        (
            [0.0] * 100,
            TTM_META,
            r"of shape \[-1, 512, 1\], but the input's rows have shape \[100\]",
        ),
    ],
)
def test_rows_the_model_cannot_take_fail_before_sending(
    row: list[float], meta: list[InputMetadata], message: str
) -> None:
    with pytest.raises(ShapeMismatch, match=message):
        resolve_tensor_spec(row, None, meta)


def test_parse_metadata_keeps_usable_inputs() -> None:
    body = {
        "inputs": [
            {"name": "input-0", "datatype": "FP32", "shape": [-1, 4]},
            {"name": "odd", "shape": "[-1]"},
            {"shape": [1]},
            {"name": "nodtype", "shape": [-1, 2]},
        ]
    }
    assert parse_metadata(body) == [
        InputMetadata("input-0", "FP32", (-1, 4)),
        InputMetadata("nodtype", "FP32", (-1, 2)),
    ]
    assert parse_metadata({"name": "m"}) == []
    assert parse_metadata([]) == []


def test_row_shape_and_ragged_rows() -> None:
    assert row_shape([1, 2]) == (2,)
    assert row_shape([[1], [2]]) == (2, 1)
    assert row_shape(7) == ()
    check_rows([[1, 2], [3, 4]])
    check_rows([])
    with pytest.raises(ValueError, match="row 1 has 1 values, row 0 has 2"):
        check_rows([[1, 2], [3]])
    with pytest.raises(ValueError, match="row 2 has a single value, row 0 has 2"):
        check_rows([[1, 2], [3, 4], 5])


# -- request and answer bodies -------------------------------------------------------------


def test_v2_request_body() -> None:
    body = orjson.loads(v2_request(TensorSpec("past_values", "FP32", (3, 1)), [[1, 2, 3]]))
    assert body == {
        "inputs": [
            {"name": "past_values", "shape": [1, 3, 1], "datatype": "FP32", "data": [[1, 2, 3]]}
        ]
    }


def test_v1_request_body() -> None:
    assert orjson.loads(v1_request([[1, 2], [3, 4]])) == {"instances": [[1, 2], [3, 4]]}


@pytest.mark.parametrize(
    ("data", "rows", "expected"),
    [
        ([1, 0, 2], 3, [1, 0, 2]),
        ([[1], [0], [2]], 3, [1, 0, 2]),  # [n, 1]
        ([[[1.5], [2.5]], [[3.5], [4.5]]], 2, [1.5, 2.5, 3.5, 4.5]),  # [n, 2, 1]
        ([1.5, 2.5, 3.5, 4.5], 2, [1.5, 2.5, 3.5, 4.5]),  # flat [n, 2]
    ],
)
def test_v2_answers_are_flattened_in_row_major_order(
    data: list[Any], rows: int, expected: list[Any]
) -> None:
    answer = {"outputs": [{"name": "o", "shape": [rows], "datatype": "INT64", "data": data}]}
    assert parse_v2_response(orjson.dumps(answer), rows) == expected


def test_v1_answers_are_flattened() -> None:
    assert parse_v1_response(b'{"predictions": [[1], [2]]}', 2) == [1, 2]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"outputs": []}', "has no outputs"),
        (b'{"outputs": [{"name": "o"}]}', "has no data list"),
        (b'{"outputs": [{"data": [1, 2]}]}', r"answered 2 value\(s\) for 3 row\(s\)"),
        (b"<html>oops</html>", "not JSON: <html>oops</html>"),
    ],
)
def test_v2_answers_that_are_not_predictions_are_refusals(body: bytes, message: str) -> None:
    with pytest.raises(ModelRefused, match=message):
        parse_v2_response(body, 3)


def test_v1_answer_without_predictions_is_a_refusal() -> None:
    with pytest.raises(ModelRefused, match="has no predictions"):
        parse_v1_response(b'{"outputs": []}', 1)


def test_flatten() -> None:
    assert flatten([]) == []
    assert flatten([[1, [2]], 3]) == [1, 2, 3]


# -- errors from the model ------------------------------------------------------------------


def test_server_message_prefers_the_servers_own_field() -> None:
    assert server_message(b'{"error": "Model with name x does not exist."}') == (
        "Model with name x does not exist."
    )
    detail = b'{"detail": [{"loc": ["body"], "msg": "field required"}]}'
    assert server_message(detail) == "body: field required"
    assert server_message(b"") == "(empty body)"
    assert server_message(b"plain\n  text") == "plain text"


def test_a_traceback_is_reduced_to_its_exception() -> None:
    traceback = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        "    f()\nValueError: expected 4 features\n"
    )
    assert trim(traceback) == "ValueError: expected 4 features"


def test_long_messages_are_trimmed_to_one_short_line() -> None:
    trimmed = trim("word " * 1000)
    assert len(trimmed) == 500
    assert trimmed.endswith("…")
    assert "\n" not in trimmed


@pytest.mark.parametrize(
    ("status", "retry_after", "kind", "hint"),
    [
        (500, None, Transient, None),
        (503, "2", Transient, 2.0),
        (429, "1.5", Transient, 1.5),
        (429, "Wed, 21 Oct 2015 07:28:00 GMT", Transient, 0.0),  # a date in the past
        (400, "5", ModelRefused, None),
        (404, None, ModelRefused, None),
        (422, None, ModelRefused, None),
    ],
)
def test_classify(status: int, retry_after: str | None, kind: type, hint: float | None) -> None:
    error = classify(status, b'{"error": "nope"}', retry_after)
    assert isinstance(error, kind)
    assert str(error) == f"model answered {status}: nope"
    if isinstance(error, Transient):
        assert error.retry_after == hint


def test_retry_after_values() -> None:
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    assert retry_after_seconds("-3") == 0.0
    assert retry_after_seconds("Fri, 31 Dec 2100 23:59:59 GMT") > 1e9  # type: ignore[operator]


# -- storage bodies and answers --------------------------------------------------------------


def context(parameters: dict[str, str]) -> StorageContext:
    return StorageContext(
        session=None,
        secrets=None,
        namespace="ns",
        job_id="job-1",
        pod_uid="pod-1",
        parameters=parameters,
        deadline=Deadline(None),
        log=None,
    )


def test_output_body_carries_ids_predictions_and_parameters() -> None:
    body = output_body(context({"output_table_name": "t"}), "[1,0]", {"predictions_offset": "0"})
    assert body == {
        "output_table_name": "t",
        "predictions_offset": "0",
        "job_uid": "job-1",
        "pod_uid": "pod-1",
        "predictions": "[1,0]",
    }


def test_output_body_fields_win_over_a_clashing_parameter() -> None:
    body = output_body(context({"job_uid": "forged"}), [])
    assert body["job_uid"] == "job-1"


def test_parameters_may_not_reuse_output_fields() -> None:
    check_parameters({"output_table_name": "t"})
    check_parameters(None)
    with pytest.raises(
        ValueError, match=r"parameters \['pod_uid', 'predictions'\] would overwrite"
    ):
        check_parameters({"predictions": "x", "pod_uid": "y"})
    with pytest.raises(ValueError, match=r"\['predictions_offset'\]"):
        check_parameters({"predictions_offset": "1"}, ("predictions_offset",))


def test_chunks() -> None:
    assert chunks([1, 2, 3, 4, 5], 2) == [(0, [1, 2]), (2, [3, 4]), (4, [5])]
    assert chunks([1, 2], None) == [(0, [1, 2])]
    assert chunks([], 10) == [(0, [])]


def test_header_lines() -> None:
    assert parse_header_lines(["Accept: application/json", "X-A:  b:c "]) == {
        "Accept": "application/json",
        "X-A": "b:c",
    }
    assert parse_header_lines({"X-B": "1"}) == {"X-B": "1"}
    with pytest.raises(ValueError, match="is not of the form"):
        parse_header_lines(["Accept application/json"])
    with pytest.raises(ValueError, match="not a valid HTTP header name"):
        parse_header_lines(["Bad Name: x"])


def test_parse_bool_is_gos() -> None:
    assert [parse_bool(v, "insecure") for v in ("1", "t", "TRUE", "True")] == [True] * 4
    assert [parse_bool(v, "insecure") for v in ("0", "f", "false", "")] == [False] * 4
    with pytest.raises(StorageError, match="must be a boolean"):
        parse_bool("yes", "insecure")


def answer(body: bytes, status: int = 200, content_type: str = "application/json") -> Answer:
    return Answer("POST", "http://h/compute/x", status, content_type, body)


def test_rows_from_reads_the_field() -> None:
    assert rows_from(answer(b'{"result": [[1, 2]]}'), "result") == [[1, 2]]
    assert rows_from(answer(b'{"result": null}'), "result") == []
    assert rows_from(answer(b'{"data": {"rows": [[1]]}}'), "data.rows") == [[1]]
    assert rows_from(answer(b"[[1]]"), "") == [[1]]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"Traceback (most recent call last):\nKeyError: 'x'", "not JSON: KeyError: 'x'"),
        (b'{"rows": []}', "without a 'result' field"),
        (b'{"result": {"a": 1}}', "result is a dict, not a list of rows"),
    ],
)
def test_rows_from_rejects_what_is_not_rows(body: bytes, message: str) -> None:
    with pytest.raises(StorageError, match=message):
        rows_from(answer(body), "result")


def test_a_store_succeeds_only_with_an_empty_or_json_body() -> None:
    check_stored(answer(b""))
    check_stored(answer(b"  \n"))
    check_stored(answer(b'{"stored": 3}'))
    with pytest.raises(StorageError, match="answered 200 with an error instead of storing: boom"):
        check_stored(answer(b"boom"))


def test_userinfo_is_taken_out_of_urls() -> None:
    assert split_userinfo("https://u:p%40ss@h:1/x") == ("https://h:1/x", "u", "p@ss")
    assert split_userinfo("https://h/x") == ("https://h/x", "", None)


def endpoint(url: str, **given: Any) -> Endpoint:
    """``build_endpoint`` of ``url`` with no credentials, TLS or proxy but those ``given``."""
    settings: dict[str, Any] = {
        "token": None,
        "username": None,
        "password": None,
        "ca_data": None,
        "insecure": False,
        "proxy_url": None,
        "source": "s",
    }
    return build_endpoint(url=url, **{**settings, **given})


def test_endpoint_authorization() -> None:
    basic = endpoint("http://h/", username="u", password="p")
    assert basic.authorization == "Basic " + base64.b64encode(b"u:p").decode()
    assert basic.url_for("/compute/x") == "http://h/compute/x"
    bearer = endpoint("https://h", token="t0k", insecure=True)
    assert bearer.authorization == "Bearer t0k"
    assert not isinstance(bearer.ssl, bool)
    assert bearer.ssl.check_hostname is False
    from_url = endpoint("http://u:p@h")
    assert (from_url.base_url, from_url.authorization) == ("http://h", basic.authorization)
    with pytest.raises(StorageError, match="both a token and a password"):
        endpoint("http://h", token="t", username="u", password="p")
