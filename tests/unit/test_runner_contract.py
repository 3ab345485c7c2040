"""Contract validation: everything the runner can refuse before any I/O (exit 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from contract.document import Contract
from contract.exitcodes import ContractError, ExitCode
from runner import storage
from runner.app import RunnerEnv, load_contract, plan
from runner.storage.http import HttpProvider
from runner.storage.krateo import KrateoProvider

pytestmark = pytest.mark.unit

KRATEO = {
    "krateo": {
        "api": {
            "endpointRef": {"name": "ep", "namespace": "krateo-system"},
            "path": "/compute/sklearninput",
            "verb": "POST",
            "headers": ["Accept: application/json"],
        }
    }
}

# The upstream README's contract, byte for byte in shape.
UPSTREAM = {
    "jobId": "0b6a3c1e-3f2d-4a57-9d0e-7a3b2c1d0e9f",
    "jobName": "inf-iris-inference-run-0b6a3c1e",
    "kserve": {
        "modelName": "sklearn-iris",
        "modelUrl": (
            "sklearn-iris-predictor.kserve-test.svc.cluster.local/v2/models/sklearn-iris/infer"
        ),
        "modelVersion": "v2",
        "modelInputName": "input-0",
    },
    "input": KRATEO,
    "output": {
        "krateo": {
            "api": {
                **KRATEO["krateo"]["api"],
                "path": "/compute/sklearnoutput",
                "payload": "ignored, as upstream",
            }
        }
    },
    "parameters": {"input_table_name": "in", "output_table_name": "out"},
}


def env(**overrides: Any) -> RunnerEnv:
    values: dict[str, Any] = {
        "contract_path": Path("/tmp/contract.json"),
        "termination_log_path": Path("/dev/termination-log"),
        "pod_uid": "p",
        "namespace": "ns",
        "completion_index": None,
        "deadline_seconds": None,
    }
    values.update(overrides)
    return RunnerEnv(**values)


def test_the_upstream_contract_plans_with_krateo_on_both_sides() -> None:
    work = plan(Contract.model_validate(UPSTREAM), env())
    assert isinstance(work.input, KrateoProvider)
    assert isinstance(work.output, KrateoProvider)
    assert work.input.headers == {"Accept": "application/json"}
    assert (work.shard_count, work.shard_index) == (1, 0)
    assert (work.batches.batch_size, work.batches.concurrency) == (256, 4)
    assert work.batches.retry.max_retries == 5


def test_krateo_defaults_are_upstreams() -> None:
    entry = {"krateo": {"api": {"endpointRef": {"name": "ep"}}}}
    provider = storage.resolve(entry, "input", {})
    assert isinstance(provider, KrateoProvider)
    assert provider.settings.api.verb == "GET"
    assert provider.settings.api.path == ""
    # The handler answers JSON only to exactly this Accept: added when none is given.
    assert provider.headers == {"Accept": "application/json"}


def test_batching_from_the_contract() -> None:
    contract = Contract.model_validate(
        {
            **UPSTREAM,
            "batching": {
                "batchSize": 1000,
                "concurrency": 8,
                "requestTimeoutSeconds": 5,
                "maxRetries": 0,
            },
        }
    )
    batches = plan(contract, env()).batches
    assert (batches.batch_size, batches.concurrency, batches.request_timeout) == (1000, 8, 5.0)
    assert batches.retry.max_retries == 0


def test_sharding_takes_the_index_from_the_job() -> None:
    contract = Contract.model_validate({**UPSTREAM, "sharding": {"count": 4}})
    work = plan(contract, env(completion_index="3"))
    assert (work.shard_count, work.shard_index) == (4, 3)
    for bad in (None, "", "4", "-1", "one"):
        with pytest.raises(ContractError, match="JOB_COMPLETION_INDEX must be an integer"):
            plan(contract, env(completion_index=bad))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"input": {}},
            f"input: no storage provider given (one of: {', '.join(storage.provider_keys())})",
        ),
        ({"output": {"krateo": {}, "http": {}}}, "output: one storage provider expected"),
        ({"input": {"../base": {}}}, "unknown storage provider '../base'"),
        ({"input": {"base": {}}}, "unknown storage provider 'base'"),
        (
            {"input": {"krateo": {"api": {"endpointRef": {"name": "ep"}, "verb": "FETCH"}}}},
            "input.krateo: api.verb: Value error, verb must be one of GET, POST, PUT, PATCH",
        ),
        (
            {"input": {"krateo": {"api": {"endpointRef": {"name": "ep"}, "headers": ["x"]}}}},
            "header 'x' is not of the form 'Name: value'",
        ),
        (
            {"output": {"krateo": {**KRATEO["krateo"], "chunkSize": 0}}},
            "output.krateo: chunkSize: Input should be greater than or equal to 1",
        ),
        (
            {"output": {"http": {"secretRef": {"name": "s"}, "rowField": "x"}}},
            "output.http: rowField: Extra inputs are not permitted",
        ),
        (
            {"output": {"http": {"secretRef": {"name": "s"}, "method": "GET"}}},
            "method GET cannot carry predictions",
        ),
        (
            {"parameters": {"predictions": "[]"}},
            "parameters ['predictions'] would overwrite fields of the output body",
        ),
        (
            {
                "output": {"krateo": {**KRATEO["krateo"], "chunkSize": 10}},
                "parameters": {"predictions_offset": "5"},
            },
            "parameters ['predictions_offset'] would overwrite",
        ),
        ({"kserve": {"modelName": "m"}}, "kserve.modelUrl is required"),
    ],
)
def test_plan_refuses_with_a_clear_message(change: dict[str, Any], message: str) -> None:
    contract = Contract.model_validate({**UPSTREAM, **change})
    with pytest.raises(ContractError) as refused:
        plan(contract, env())
    assert message in refused.value.message
    assert refused.value.exit_code == ExitCode.BAD_CONTRACT


def test_parameters_only_matter_to_the_output_side() -> None:
    # An input-only provider may receive any parameter name.
    provider = storage.resolve(KRATEO, "input", {"predictions": "x"})
    assert provider.key == "krateo"


def test_http_provider_settings() -> None:
    entry = {
        "http": {
            "secretRef": {"name": "s"},
            "method": "get",
            "headers": {"X-Tenant": "a"},
            "rowsField": "data.rows",
        }
    }
    provider = storage.resolve(entry, "input", {})
    assert isinstance(provider, HttpProvider)
    assert provider.settings.method == "GET"
    assert provider.headers == {"X-Tenant": "a"}
    assert provider.settings.rows_field == "data.rows"


def test_provider_keys_are_the_modules_of_the_package() -> None:
    assert storage.provider_keys() == ["http", "krateo", "postgres", "s3"]


def test_load_contract(tmp_path: Path) -> None:
    path = tmp_path / "contract.json"
    path.write_bytes(orjson.dumps({**UPSTREAM, "futureKey": {"ignored": True}}))
    assert load_contract(path).job_id == UPSTREAM["jobId"]

    path.write_bytes(b'{"jobId": "", "jobName": "n"}')
    with pytest.raises(ContractError, match="invalid contract: jobId: String should have at least"):
        load_contract(path)
    with pytest.raises(ContractError, match=r"cannot read the contract at .*absent"):
        load_contract(tmp_path / "absent")


def test_runner_env_from_environ(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "var/run/secrets/kubernetes.io/serviceaccount").mkdir(parents=True)
    (root / "var/run/secrets/kubernetes.io/serviceaccount/namespace").write_text("team-b\n")
    runner_env = RunnerEnv.from_environ(
        {
            "NODE_AGENT_ROOT": str(root),
            "pod_uid": "uid-1",
            "JOB_COMPLETION_INDEX": "2",
            "RUNNER_DEADLINE_SECONDS": "90",
        }
    )
    assert runner_env.contract_path == root / "tmp/contract.json"
    assert runner_env.termination_log_path == root / "dev/termination-log"
    assert (runner_env.pod_uid, runner_env.namespace) == ("uid-1", "team-b")
    assert (runner_env.completion_index, runner_env.deadline_seconds) == ("2", 90.0)
    assert RunnerEnv.from_environ({"POD_UID": "u2"}).pod_uid == "u2"


@pytest.mark.parametrize("value", ["0", "-5", "soon", "nan"])
def test_a_bad_deadline_is_a_contract_error(value: str) -> None:
    with pytest.raises(ContractError, match="RUNNER_DEADLINE_SECONDS must be a positive number"):
        RunnerEnv.from_environ({"RUNNER_DEADLINE_SECONDS": value})
