"""A TTM-shaped model: one series from the tritoninput notebook, sent as [1, 512, 1]."""

from __future__ import annotations

import pytest

from contract.exitcodes import ExitCode
from hack.model_server import ttm_forecast
from tests.runner.conftest import (
    World,
    krateo_entry,
)


async def test_ttm_series_is_sent_with_the_models_declared_shape(world: World) -> None:
    # 600 points a minute apart for sensor "a", with a gap and a NULL; noise for "b".
    points: list[tuple[str, float | None, float]] = [
        ("a", float(i % 37), 60.0 * i) for i in range(600) if i not in (590, 591)
    ]
    points[-1] = ("a", None, points[-1][2])
    points += [("b", 1000.0, 60.0 * i + 30) for i in range(10)]
    world.storage.seed_series("sensor", "reading", "sensor_id", points)
    contract = {
        "jobId": "ttm-job",
        "jobName": "inf-ttm-12345678",
        # No modelInputName: name, datatype and [-1, 512, 1] come from the metadata.
        "kserve": {"modelName": "ttm", "modelUrl": world.model_server.infer_url("ttm")},
        "input": krateo_entry("/compute/tritoninput"),
        "output": krateo_entry("/compute/tritonoutput"),
        "parameters": {
            "input_table_name": "sensor",
            "input_data_length": "512",
            "input_table_column_name": "reading",
            "key_name": "sensor_id",
            "key_value": "a",
            "output_table_name": "forecast",
        },
    }

    outcome = await world.run(contract)

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    series = [float(i % 37) for i in range(600)]
    series[590] = series[591] = 0.0  # the gap, zero-filled
    series[599] = 0.0  # the NULL
    expected = [float(v) for v in ttm_forecast([series[-512:]]).ravel()]
    stored = world.storage.predictions("forecast")
    assert [value for _, _, value, _ in stored] == pytest.approx(expected)
    assert outcome.result == {
        "rows": 1,
        "predictions": 96,
        "durationSeconds": outcome.result["durationSeconds"],
    }
    started = next(e for e in outcome.events() if e["event"] == "inference started")
    assert (started["input"], started["shape"]) == ("past_values", [-1, 512, 1])
