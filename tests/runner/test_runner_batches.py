"""Many rows: batches keep order, outputs too large for one write go in chunks, shards."""

from __future__ import annotations

from contract.exitcodes import ExitCode
from hack.loopback import FaultProxy
from tests.runner.conftest import (
    World,
    direct_iris,
    iris_contract,
)


async def test_100k_rows_in_batches_come_back_in_input_order(
    world: World, fault_proxy: FaultProxy
) -> None:
    rows = world.seed_random_iris("big", 100_000)
    contract = iris_contract(
        f"{fault_proxy.url}/v2/models/sklearn-iris/infer",
        input_table="big",
        output_table="big_predictions",
        batching={"batchSize": 1000, "concurrency": 4},
    )
    # 100k predictions do not fit in one notebook argument (128 KiB): write in chunks.
    contract["output"]["krateo"]["chunkSize"] = 30_000

    outcome = await world.run(contract)

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert fault_proxy.seen["/v2/models/sklearn-iris/infer"] == 100
    assert world.storage.calls["sklearnoutput"] == 4
    stored = world.storage.predictions("big_predictions")
    assert [counter for _, _, _, counter in stored] == list(range(100_000))
    assert [value for _, _, value, _ in stored] == direct_iris(rows)
    assert outcome.result["rows"] == outcome.result["predictions"] == 100_000


async def test_one_write_too_large_for_the_handler_fails_the_output_stage(world: World) -> None:
    world.seed_random_iris("big", 70_000)
    contract = iris_contract(
        world.model_server.infer_url(), input_table="big", batching={"batchSize": 5000}
    )

    outcome = await world.run(contract)

    assert outcome.exit_code == ExitCode.OUTPUT
    assert "answered 500" in outcome.termination
    assert "Argument list too long" in outcome.termination
    assert any(e["event"].startswith("the predictions argument exceeds") for e in outcome.events())
    assert not world.storage.has_table("iris_predictions")


async def test_shards_each_store_their_rows_and_together_cover_the_input(world: World) -> None:
    rows = world.seed_random_iris("shared", 1001)
    contract = iris_contract(
        world.model_server.infer_url(),
        input_table="shared",
        output_table="sharded",
        batching={"batchSize": 64},
        sharding={"count": 3},
    )

    for index in range(3):
        outcome = await world.run_shard(contract, index)
        assert outcome.exit_code == ExitCode.DONE, outcome.termination
        assert outcome.result["rows"] == len(range(index, 1001, 3))

    by_pod: dict[str, list[float]] = {}
    for _, pod, value, _ in world.storage.predictions("sharded"):
        by_pod.setdefault(pod, []).append(value)
    # Row i is prediction i // 3 of shard i % 3.
    reassembled = [by_pod[f"pod-{i % 3}"][i // 3] for i in range(1001)]
    assert reassembled == direct_iris(rows)
