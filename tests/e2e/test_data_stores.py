"""Where users keep their data, end to end: Parquet in S3 in, PostgreSQL out.

The controller runs under the chart's RBAC and the node agent runs the real
runner, which reads its two Secrets through the API; the bucket is versitygw's
(``s3_server``), the table PostgreSQL's (``postgres``), both real servers on
loopback. Each input row carries an ``id`` that is not its position and a
``species`` text, so every stored prediction is checked against its own input
row through the key, and "stored once" is counted as distinct keys.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import obstore
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kubernetes_asyncio import client

from hack.model_server import iris_predict
from hack.postgres import SUPERUSER
from hack.s3server import REGION, ROOT_ACCESS_KEY, ROOT_SECRET_KEY, S3Server
from hack.storage_service import IRIS_COLUMNS
from tests.e2e.conftest import E2E, RUNNER_IMAGE
from tests.kubehelpers import wait_for_events
from tests.runs import inference_config, inference_run, status
from tests.servers import Database

S3_SECRET, PG_SECRET = "s3-credentials", "features-db"
ROWS, ROW_GROUP, PAGE = 1200, 150, 200


def iris_features(count: int, seed: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    rng = np.random.default_rng(seed)
    low, high = np.array([4.3, 2.0, 1.0, 0.1]), np.array([7.9, 4.4, 6.9, 2.5])
    return rng.uniform(low, high, size=(count, 4)).round(1)


async def create_secret(e2e: E2E, name: str, data: dict[str, str]) -> None:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    await client.CoreV1Api(e2e.api).create_namespaced_secret(
        e2e.namespace, {"metadata": {"name": name}, "data": encoded}
    )


async def seed_bucket(server: S3Server) -> tuple[str, dict[int, tuple[list[float], str]]]:
    """Two Parquet objects of 150-row groups; ``{id: (features, species)}``."""
    bucket = server.create_bucket()
    store = server.root_store(bucket)
    features = iris_features(ROWS, seed=41)
    ids = [90_000 - 13 * i for i in range(ROWS)]  # keys that are not positions
    species = [f"sp-{i % 7}-{i}" for i in ids]
    rows: dict[int, tuple[list[float], str]] = {}
    half = ROWS // 2
    for number, part in enumerate((slice(0, half), slice(half, ROWS))):
        table = pa.table(
            {
                "id": pa.array(ids[part], pa.int64()),
                **{c: features[part, k] for k, c in enumerate(IRIS_COLUMNS)},
                "species": species[part],
            }
        )
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, row_group_size=ROW_GROUP)
        await obstore.put_async(
            store, f"features/iris/part-{number}.parquet", bytes(sink.getvalue())
        )
    for i, key in enumerate(ids):
        rows[key] = ([float(v) for v in features[i]], species[i])
    return bucket, rows


def config(server: S3Server, bucket: str, db: Database, model_url: str) -> dict[str, Any]:
    storage = {
        "input": {
            "s3": {
                "bucket": bucket,
                "endpointUrl": server.url,
                "region": REGION,
                "secretRef": {"name": S3_SECRET},
                "prefix": "features/iris/",
                "format": "parquet",
                "paging": {"pageSize": PAGE},
                "columns": list(IRIS_COLUMNS),
                "keyColumn": "id",
                "passthroughColumns": ["species"],
            }
        },
        "output": {
            "postgres": {
                "host": db.server.host,
                "port": db.server.port,
                "database": db.name,
                "secretRef": {"name": PG_SECRET},
                "sslmode": "disable",
                "table": "iris_predictions",
                "createTable": True,
            }
        },
    }
    made = inference_config("s3-to-pg", RUNNER_IMAGE, storage=storage)
    made["spec"]["kserve"]["modelUrl"] = model_url
    return made


@pytest.mark.usefixtures("controller")
async def test_parquet_in_s3_to_postgres_stores_each_prediction_once_by_key(
    e2e: E2E, s3_server: S3Server, postgres: Database
) -> None:
    bucket, rows = await seed_bucket(s3_server)
    await create_secret(
        e2e,
        S3_SECRET,
        {"AWS_ACCESS_KEY_ID": ROOT_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": ROOT_SECRET_KEY},
    )
    await create_secret(
        e2e, PG_SECRET, {"username": SUPERUSER, "password": postgres.server.password}
    )
    run = inference_run("s3-to-pg-run", "s3-to-pg", parallelism=2, timeoutSeconds=300)

    done = await e2e.finish(
        config(s3_server, bucket, postgres, e2e.model_url()), run, "Succeeded", within=240
    )

    result = status(done)["result"]
    assert (result["rows"], result["predictions"]) == (ROWS, ROWS)
    stored = postgres.query(
        "SELECT run_uid, shard, row_index, id, species, prediction FROM iris_predictions"
    )
    (counts,) = postgres.query(
        "SELECT count(*), count(DISTINCT id), count(DISTINCT (shard, row_index)) "
        "FROM iris_predictions"
    )
    assert counts == (ROWS, ROWS, ROWS)
    assert len(stored) == ROWS
    assert {run_uid for run_uid, *_ in stored} == {done["metadata"]["uid"]}
    # Both shards stored rows: eight row groups dealt round-robin, four each.
    assert sorted({int(str(shard)) for _, shard, *_ in stored}) == [0, 1]
    ids = [int(str(key)) for _, _, _, key, _, _ in stored]
    assert set(ids) == set(rows)
    expected = dict(zip(ids, iris_predict([rows[i][0] for i in ids]).tolist(), strict=True))
    assert len(set(expected.values())) == 3  # all three classes came up
    for _, _, _, key, species, prediction in stored:
        _, wanted_species = rows[int(str(key))]
        assert species == wanted_species
        assert prediction == expected[int(str(key))]
    # The Secrets' values are nowhere in what the run shows.
    shown = json.dumps(done)
    assert ROOT_SECRET_KEY not in shown
    assert postgres.server.password not in shown


@pytest.mark.usefixtures("controller")
async def test_a_wrong_password_fails_the_run_at_once_and_shows_nowhere(
    e2e: E2E, s3_server: S3Server, postgres: Database
) -> None:
    """The output's password is refused: OutputRejected (exit 8), the Job not retried.

    The wrong password is nowhere in the run's status, the namespace's Events or
    the runner's log, and neither is the S3 secret the input used.
    """
    bucket, _ = await seed_bucket(s3_server)
    wrong = "Wr0ng-e2e-pg-password-7c41"
    await create_secret(
        e2e,
        S3_SECRET,
        {"AWS_ACCESS_KEY_ID": ROOT_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": ROOT_SECRET_KEY},
    )
    await create_secret(e2e, PG_SECRET, {"username": SUPERUSER, "password": wrong})
    run = inference_run("wrong-pw", "s3-to-pg", timeoutSeconds=300, backoffLimit=3)

    failed = await e2e.finish(
        config(s3_server, bucket, postgres, e2e.model_url()), run, "Failed", within=180
    )

    st = status(failed)
    assert st["reason"] == "OutputRejected", st
    assert "runner exited with code 8" in st["message"]
    assert 'password authentication failed for user "postgres"' in st["message"]
    core = client.CoreV1Api(e2e.api)
    pods = (
        await core.list_namespaced_pod(
            e2e.namespace, label_selector=f"ai.krateo.io/run-uid={failed['metadata']['uid']}"
        )
    ).items
    # A refusal is permanent: the Job fails at its first pod, backoffLimit or not.
    assert len(pods) == 1
    log = await core.read_namespaced_pod_log(pods[0].metadata.name, e2e.namespace)
    assert "password authentication failed" in log
    # The Event is recorded after the status write, so it may come a moment later.
    await wait_for_events(
        e2e.api, e2e.namespace, "wrong-pw", "OutputRejected", what="the OutputRejected Event"
    )
    events = (await core.list_namespaced_event(e2e.namespace)).items
    for shown in (json.dumps(failed), log, *(e.message or "" for e in events)):
        assert wrong not in shown
        assert ROOT_SECRET_KEY not in shown
    assert not postgres.query("SELECT to_regclass('iris_predictions') IS NOT NULL")[0][0]
