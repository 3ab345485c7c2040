"""Each failure ends with its stage's exit code and a message saying what happened."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from contract.exitcodes import ExitCode
from hack.loopback import FaultProxy
from hack.storage_service import IRIS_COLUMNS
from runner import storage
from tests.runner.conftest import (
    REPO,
    SECRET_NAMESPACE,
    STORAGE_SECRET,
    InMemorySecrets,
    World,
    direct_iris,
    iris_contract,
    runner_cli,
    storage_secrets,
)
from tests.servers import free_port

INFER = "/v2/models/sklearn-iris/infer"


async def test_empty_input_is_a_clear_result_and_the_model_is_not_called(
    world: World, fault_proxy: FaultProxy
) -> None:
    world.storage.seed_table("nothing", IRIS_COLUMNS, [])
    contract = iris_contract(f"{fault_proxy.url}{INFER}", input_table="nothing")

    outcome = await world.run(contract)

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert outcome.result["rows"] == outcome.result["predictions"] == 0
    assert fault_proxy.seen[INFER] == 0
    assert world.storage.calls["sklearnoutput"] == 1
    assert world.storage.has_table("iris_predictions")
    assert world.storage.predictions("iris_predictions") == []
    assert any(e["event"] == "the input has no rows: nothing to predict" for e in outcome.events())


def bad_contracts() -> list[Any]:
    good = iris_contract("http://127.0.0.1:1/v2/models/sklearn-iris/infer")

    def edit(**changes: Any) -> dict[str, Any]:
        return {**good, **changes}

    without_job = dict(good)
    del without_job["jobId"]
    return [
        pytest.param(b"{not json", "is not JSON", id="not-json"),
        pytest.param(b"[]", "is not a JSON object", id="not-an-object"),
        pytest.param(orjson.dumps(without_job), "jobId: Field required", id="no-job-id"),
        pytest.param(
            orjson.dumps(edit(kserve={"modelName": "x"})),
            "kserve.modelUrl is required",
            id="no-model-url",
        ),
        pytest.param(
            orjson.dumps(edit(input={"ftp": {"host": "h"}})),
            f"unknown storage provider 'ftp' (known: {', '.join(storage.provider_keys())})",
            id="unknown-provider",
        ),
        pytest.param(
            orjson.dumps(edit(parameters={"job_uid": "mine", "input_table_name": "iris"})),
            "parameters ['job_uid'] would overwrite fields of the output body",
            id="parameter-overwrites-job-uid",
        ),
        pytest.param(
            orjson.dumps(edit(output={"krateo": {"api": {"path": "/compute/x"}}})),
            "output.krateo: api.endpointRef: Field required",
            id="no-endpoint-ref",
        ),
        pytest.param(
            orjson.dumps(edit(batching={"batchSize": 0})),
            "batching.batchSize",
            id="batch-size-zero",
        ),
        pytest.param(
            orjson.dumps(edit(sharding={"count": 2})),
            "JOB_COMPLETION_INDEX must be an integer in [0, 2)",
            id="sharded-without-index",
        ),
    ]


@pytest.mark.parametrize(("contract", "expected"), bad_contracts())
async def test_bad_contract_exits_2_before_any_io(
    world: World, contract: bytes, expected: str
) -> None:
    secrets = InMemorySecrets()

    outcome = await world.run(contract, secrets)

    assert outcome.exit_code == ExitCode.BAD_CONTRACT
    assert outcome.termination.startswith("contract: ")
    assert expected in outcome.termination
    assert secrets.reads == []


def test_the_cli_reports_a_missing_contract_with_exit_2(tmp_path: Path) -> None:
    termination = tmp_path / "termination-log"
    env = {
        **os.environ,
        "CONTRACT_PATH": str(tmp_path / "absent.json"),
        "TERMINATION_LOG_PATH": str(termination),
    }

    done = runner_cli(env=env)

    assert done.returncode == ExitCode.BAD_CONTRACT
    message = termination.read_text()
    assert message.startswith("contract: cannot read the contract at ")
    assert "No such file or directory" in message
    last = orjson.loads(done.stdout.splitlines()[-1])
    assert (last["event"], last["level"], last["exitCode"]) == ("run failed", "error", 2)


def test_the_cli_help_documents_exit_codes() -> None:
    done = runner_cli("--help", check=True)
    assert "exit codes: 0 done, 2 bad contract, 3 input, 4 inference, 5 output" in done.stdout
    help_text = " ".join(done.stdout.split())
    assert "6 input rejected, 7 inference rejected, 8 output rejected" in help_text


async def test_storage_down_exits_3(world: World) -> None:
    closed = f"http://127.0.0.1:{free_port()}"

    outcome = await world.run(
        iris_contract(world.model_server.infer_url()), storage_secrets(closed)
    )

    assert outcome.exit_code == ExitCode.INPUT
    assert outcome.termination.startswith(
        f"input: POST {closed}/compute/sklearninput: cannot connect: "
    )
    assert outcome.termination.endswith(" (gave up after 4 attempts)")
    retries = [e for e in outcome.events() if e["event"] == "storage request failed, retrying"]
    assert len(retries) == 3


async def test_missing_input_secret_exits_3(world: World) -> None:
    outcome = await world.run(iris_contract(world.model_server.infer_url()), InMemorySecrets())

    assert outcome.exit_code == ExitCode.INPUT
    assert outcome.termination == f"input: Secret {SECRET_NAMESPACE}/{STORAGE_SECRET} not found"


async def test_input_notebook_failure_answered_200_is_rejected_with_exit_6(world: World) -> None:
    contract = iris_contract(world.model_server.infer_url(), input_table="no_such_table")

    outcome = await world.run(contract)

    # A missing table is missing for every pod: the Job must not retry it.
    assert outcome.exit_code == ExitCode.INPUT_REJECTED
    assert "answered 200 with a body that is not JSON" in outcome.termination
    assert outcome.termination.endswith(
        "not JSON: sqlite3.OperationalError: no such table: no_such_table"
    )


async def test_accept_header_that_is_not_exactly_json_is_explained(world: World) -> None:
    world.storage.seed_iris("iris")
    contract = iris_contract(world.model_server.infer_url())
    contract["input"]["krateo"]["api"]["headers"] = ["Accept: application/json, text/plain"]

    outcome = await world.run(contract)

    assert outcome.exit_code == ExitCode.INPUT_REJECTED
    assert "with content type text/html" in outcome.termination
    assert "'Accept: application/json', exactly" in outcome.termination
    # The body is the rows themselves: quoted as a collapsed structure, not as data.
    assert outcome.termination.endswith("exactly): {…}")


async def test_model_4xx_fails_at_once_with_the_servers_message(
    world: World, fault_proxy: FaultProxy
) -> None:
    world.storage.seed_iris("iris")
    contract = iris_contract(f"{fault_proxy.url}/v2/models/nope/infer")

    outcome = await world.run(contract)

    assert outcome.exit_code == ExitCode.INFERENCE_REJECTED
    assert outcome.termination == (
        "inference: model answered 404: Model with name nope does not exist."
    )
    assert fault_proxy.seen["/v2/models/nope/infer"] == 1
    assert world.storage.calls["sklearnoutput"] == 0


@pytest.mark.parametrize(
    ("path", "version", "expected", "requests"),
    [
        # v1 has no metadata to check against, so the model itself refuses the rows.
        pytest.param(
            "/v1/models/sklearn-iris:predict",
            "v1",
            "inference: model answered 400: "
            "expected rows of 4 features, got an array of shape [10, 3]",
            1,
            id="v1-the-model-itself-refuses-them",
        ),
        # v2 metadata declares the input's shape: the rows fail before sending.
        pytest.param(
            INFER,
            "v2",
            "inference: the model declares input 'input-0' of shape [-1, 4], "
            "but the input's rows have shape [3]",
            0,
            id="v2-rows-contradicting-the-metadata",
        ),
    ],
)
async def test_rows_the_model_cannot_take_fail_with_the_reason(
    world: World, fault_proxy: FaultProxy, path: str, version: str, expected: str, requests: int
) -> None:
    world.storage.seed_table("narrow", IRIS_COLUMNS[:3], [[5.1, 3.5, 1.4]] * 10)
    contract = iris_contract(f"{fault_proxy.url}{path}", input_table="narrow")
    contract["kserve"]["modelVersion"] = version

    outcome = await world.run(contract)

    assert outcome.exit_code == ExitCode.INFERENCE_REJECTED
    assert outcome.termination == expected
    assert fault_proxy.seen[path] == requests


async def test_transient_model_faults_at_20_percent_still_store_every_row_once(
    world: World, fault_proxy: FaultProxy
) -> None:
    rows = world.seed_random_iris("flaky", 20_000, seed=5)
    fault_proxy.rate = 0.2
    contract = iris_contract(
        f"{fault_proxy.url}{INFER}",
        input_table="flaky",
        batching={"batchSize": 100, "concurrency": 4, "maxRetries": 30},
    )

    outcome = await world.run(contract)

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert set(fault_proxy.faults) == {"500", "503", "429", "reset"}
    # Each row reached the model successfully exactly once...
    assert fault_proxy.forwarded_rows == len(rows)
    # ...and is stored exactly once, in order.
    stored = world.storage.predictions("iris_predictions")
    assert [counter for _, _, _, counter in stored] == list(range(len(rows)))
    assert [value for _, _, value, _ in stored] == direct_iris(rows)
    retries = [e for e in outcome.events() if e["event"] == "model request failed, retrying"]
    assert len(retries) == sum(fault_proxy.faults.values())


async def test_model_failing_every_time_gives_up_after_the_retry_budget(
    world: World, fault_proxy: FaultProxy
) -> None:
    world.storage.seed_iris("iris")
    fault_proxy.rate = 1.0
    contract = iris_contract(
        f"{fault_proxy.url}{INFER}", batching={"batchSize": 1000, "maxRetries": 3}
    )

    outcome = await world.run(contract)

    assert outcome.exit_code == ExitCode.INFERENCE
    assert outcome.termination.startswith("inference: model ")
    assert outcome.termination.endswith(" (gave up after 4 attempts)")
    assert fault_proxy.seen[INFER] == 4
    assert world.storage.calls["sklearnoutput"] == 0


async def test_the_run_deadline_stops_retries(world: World, fault_proxy: FaultProxy) -> None:
    world.storage.seed_iris("iris")
    fault_proxy.rate = 1.0
    contract = iris_contract(
        f"{fault_proxy.url}{INFER}", batching={"batchSize": 1000, "maxRetries": 100}
    )

    outcome = await world.run(contract, env={"RUNNER_DEADLINE_SECONDS": "1.5"})

    assert outcome.exit_code == ExitCode.INFERENCE
    assert "(the run's deadline stopped retries after " in outcome.termination
    assert fault_proxy.seen[INFER] < 101


async def test_output_notebook_failure_answered_200_is_rejected_with_exit_8(world: World) -> None:
    world.storage.seed_iris("iris")
    contract = iris_contract(world.model_server.infer_url(), output_table="bad-name")

    outcome = await world.run(contract)

    assert outcome.exit_code == ExitCode.OUTPUT_REJECTED
    assert outcome.termination.startswith(
        f"output: POST {world.storage.url}/compute/sklearnoutput answered 200 "
        "with an error instead of storing: "
    )
    assert outcome.termination.endswith(
        "hack.storage_service.NotebookFailed: invalid table name 'bad-name': "
        "expected [A-Za-z_][A-Za-z0-9_]*"
    )
    assert world.storage.calls["sklearnoutput"] == 1


async def test_missing_output_secret_fails_before_the_model_is_called(
    world: World, fault_proxy: FaultProxy
) -> None:
    world.storage.seed_iris("iris")
    contract = iris_contract(f"{fault_proxy.url}{INFER}")
    contract["output"]["krateo"]["api"]["endpointRef"] = {"name": "absent"}

    outcome = await world.run(contract, env={"POD_NAMESPACE": "team-a"})

    assert outcome.exit_code == ExitCode.OUTPUT
    # endpointRef without a namespace means the pod's own.
    assert outcome.termination == "output: Secret team-a/absent not found"
    assert fault_proxy.seen[INFER] == 0


def test_sigterm_still_leaves_a_termination_message(tmp_path: Path) -> None:
    # A Kubernetes API that accepts connections and never answers: the runner hangs
    # reading its input Secret until the kubelet (here: the test) sends SIGTERM.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "c",
                            "cluster": {"server": f"http://127.0.0.1:{silent.getsockname()[1]}"},
                        }
                    ],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        contract = tmp_path / "contract.json"
        contract.write_bytes(orjson.dumps(iris_contract("http://127.0.0.1:1/v2/models/m/infer")))
        termination = tmp_path / "termination-log"
        env = {key: value for key, value in os.environ.items() if not key.startswith("KUBERNETES_")}
        env.update(
            CONTRACT_PATH=str(contract),
            TERMINATION_LOG_PATH=str(termination),
            KUBECONFIG=str(kubeconfig),
        )
        runner = subprocess.Popen(
            [sys.executable, "-m", "runner"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert runner.stdout is not None
            for line in runner.stdout:
                if '"contract loaded"' in line:
                    break
            runner.send_signal(signal.SIGTERM)
            code = runner.wait(timeout=60)
        finally:
            if runner.poll() is None:
                runner.kill()
                runner.wait()

    assert code == ExitCode.TERMINATED
    assert termination.read_text() == "terminated: stopped during input after 0/0 rows"
