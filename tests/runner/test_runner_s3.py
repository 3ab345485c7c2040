"""The ``s3`` provider against a real S3 server (versitygw's POSIX backend on loopback).

Each test has its own bucket on the session's server (``s3_server``), and runs
the real runner in-process (or as a process it kills) against KServe's model
server: round trips in every format, shards, a kill mid-write and its resume,
``--check``, and every kind of bad input with the exit code and message it gets.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import obstore
import orjson
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from aiohttp import web

from contract.exitcodes import ExitCode
from hack.loopback import ForwardingProxy
from hack.s3server import REGION, ROOT_ACCESS_KEY, ROOT_SECRET_KEY, S3Server
from tests.runner.conftest import (
    InMemorySecrets,
    Outcome,
    SmallDisk,
    World,
    direct_iris,
    random_iris_rows,
)
from tests.servers import running

S3_SECRET = "s3-credentials"
NAMESPACE = "data"
RUN = "9c0ffee0-s3-run"
IRIS = ("sepal_length", "sepal_width", "petal_length", "petal_width")


def s3_secrets(access: str = ROOT_ACCESS_KEY, secret: str = ROOT_SECRET_KEY) -> InMemorySecrets:
    return InMemorySecrets(
        {
            (NAMESPACE, S3_SECRET): {
                "AWS_ACCESS_KEY_ID": access,
                "AWS_SECRET_ACCESS_KEY": secret,
            }
        }
    )


@dataclass
class Bucket:
    """One test's bucket, and a client of its own to seed and inspect it."""

    server: S3Server
    name: str
    url: str = ""

    def __post_init__(self) -> None:
        self.url = self.url or self.server.url
        self.client = self.server.root_store(self.name)

    def entry(self, **settings: Any) -> dict[str, Any]:
        return {
            "s3": {
                "bucket": self.name,
                "endpointUrl": self.url,
                "region": REGION,
                "secretRef": {"name": S3_SECRET, "namespace": NAMESPACE},
                **settings,
            }
        }

    async def put(self, key: str, data: bytes) -> None:
        await obstore.put_async(self.client, key, data)

    async def get(self, key: str) -> bytes:
        result = await obstore.get_async(self.client, key)
        return bytes(await result.bytes_async())

    async def keys(self, prefix: str = "") -> list[str]:
        found: list[str] = []
        async for batch in obstore.list(self.client, prefix or None, chunk_size=1000):
            found.extend(meta["path"] for meta in batch)
        return sorted(found)

    async def put_parquet(self, key: str, rows: list[list[float]], row_group: int) -> None:
        await self.put(key, parquet_bytes(iris_table(rows), row_group))

    async def output(self, prefix: str = "out") -> pa.Table:
        """Every chunk stored under ``prefix``, in (shard, row) order."""
        tables = []
        for key in await self.keys(prefix):
            name = key.rsplit("/", 1)[-1]
            if not name.startswith("part-"):
                continue
            data = await self.get(key)
            if name.endswith(".parquet"):
                tables.append(pq.read_table(io.BytesIO(data)))
            elif ".jsonl" in name:
                raw = gzip.decompress(data) if name.endswith(".gz") else data
                tables.append(pa.Table.from_pylist([orjson.loads(x) for x in raw.splitlines()]))
            else:
                tables.append(pa_csv.read_csv(io.BytesIO(data)))
        assert tables, f"no chunk under {prefix}"
        return pa.concat_tables(tables).sort_by([("shard", "ascending"), ("row", "ascending")])


@pytest.fixture
def bucket(s3_server: S3Server) -> Bucket:
    return Bucket(s3_server, s3_server.create_bucket())


def iris_table(rows: list[list[float]]) -> pa.Table:
    return pa.table({name: [row[i] for row in rows] for i, name in enumerate(IRIS)})


def parquet_bytes(table: pa.Table, row_group: int) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=row_group)
    return bytes(sink.getvalue())


def csv_bytes(rows: list[list[float]]) -> bytes:
    lines = [",".join(IRIS)] + [",".join(str(v) for v in row) for row in rows]
    return ("\n".join(lines) + "\n").encode()


def s3_contract(
    world: World, source: dict[str, Any], sink: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    return {
        "jobId": RUN,
        "jobName": "inf-s3-9c0ffee0",
        "kserve": {"modelUrl": world.model_server.infer_url()},
        "input": source,
        "output": sink,
        "batching": {"batchSize": 64, "concurrency": 3},
        **extra,
    }


async def run_s3(world: World, contract: dict[str, Any], **options: Any) -> Outcome:
    secrets = options.pop("secrets", None) or s3_secrets()
    return await world.run(contract, secrets, **options)


async def run_shard(world: World, contract: dict[str, Any], index: int) -> Outcome:
    """The run of shard ``index``: an Indexed Job's pod ``pod-<index>``."""
    env = {"JOB_COMPLETION_INDEX": str(index), "pod_uid": f"pod-{index}"}
    return await run_s3(world, contract, env=env)


def assert_all_rows_once(table: pa.Table, shard_rows: dict[int, int]) -> None:
    shards, numbers = table.column("shard").to_pylist(), table.column("row").to_pylist()
    keys = list(zip(shards, numbers, strict=True))
    assert len(keys) == len(set(keys)) == sum(shard_rows.values())
    for shard, count in shard_rows.items():
        assert sorted(r for s, r in keys if s == shard) == list(range(count))


# -- round trips ----------------------------------------------------------------------


async def test_parquet_prefix_in_parquet_out_with_manifests(world: World, bucket: Bucket) -> None:
    rows = random_iris_rows(2500, seed=3)
    await bucket.put_parquet("in/part-0.parquet", rows[:1500], row_group=400)
    await bucket.put_parquet("in/part-1.parquet", rows[1500:], row_group=400)
    await bucket.put("in/_SUCCESS", b"")  # skipped: a hidden name
    contract = s3_contract(
        world,
        bucket.entry(prefix="in/", paging={"pageSize": 700}),
        bucket.entry(prefix="out"),
    )

    outcome = await run_s3(world, contract)

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert (outcome.result["rows"], outcome.result["predictions"]) == (2500, 2500)
    table = await bucket.output()
    assert_all_rows_once(table, {0: 2500})
    assert table.column("prediction").to_pylist() == direct_iris(rows)
    keys = await bucket.keys("out")
    chunks = [k for k in keys if "/part-" in k]
    assert len(chunks) == 4  # pages of 700: 700, 700, 700, 400
    assert chunks[0] == f"out/{RUN}/shard-00000-of-00001/part-000000000000-000000000700.parquet"
    manifest = orjson.loads(await bucket.get(f"out/{RUN}/_manifest.json"))
    assert manifest["runUid"] == RUN
    assert manifest["rows"] == 2500
    assert [p["rows"] for p in manifest["parts"]] == [700, 700, 700, 400]
    assert [p["key"] for p in manifest["parts"]] == chunks
    # The shard's progress knew the total from the Parquet footers before reading.
    assert outcome.progress is not None
    assert (outcome.progress.rows_done, outcome.progress.rows_total) == (2500, 2500)


async def test_csv_gzip_and_json_lines_zstd_in_jsonl_out(world: World, bucket: Bucket) -> None:
    rows = random_iris_rows(900, seed=5)
    await bucket.put("in/a.csv.gz", gzip.compress(csv_bytes(rows[:500])))
    jsonl = b"".join(orjson.dumps(dict(zip(IRIS, r, strict=True))) + b"\n" for r in rows[500:])
    await bucket.put("in/b.jsonl.zst", pa.compress(jsonl, codec="zstd", asbytes=True))
    contract = s3_contract(
        world,
        bucket.entry(keys=["in/a.csv.gz", "in/b.jsonl.zst"], paging={"pageSize": 300}),
        bucket.entry(prefix="out", format="jsonl", compression="gzip"),
    )

    outcome = await run_s3(world, contract)

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    table = await bucket.output()
    assert_all_rows_once(table, {0: 900})
    assert table.column("prediction").to_pylist() == direct_iris(rows)
    assert all(k.endswith(".jsonl.gz") for k in await bucket.keys("out") if "/part-" in k)


async def test_csv_out_and_one_object_by_key(world: World, bucket: Bucket) -> None:
    rows = random_iris_rows(120, seed=8)
    await bucket.put("one.csv", csv_bytes(rows))
    contract = s3_contract(
        world, bucket.entry(key="one.csv"), bucket.entry(prefix="results/iris/", format="csv")
    )

    outcome = await run_s3(world, contract)

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    table = await bucket.output("results/iris")
    assert table.column("prediction").to_pylist() == direct_iris(rows)


async def test_the_same_run_again_rewrites_the_same_bytes(world: World, bucket: Bucket) -> None:
    rows = random_iris_rows(600, seed=9)
    await bucket.put_parquet("in.parquet", rows, row_group=250)
    contract = s3_contract(
        world, bucket.entry(key="in.parquet", paging={"pageSize": 250}), bucket.entry(prefix="o")
    )
    assert (await run_s3(world, contract)).exit_code == ExitCode.DONE
    keys = await bucket.keys("o")
    first = {key: await bucket.get(key) for key in keys}
    # As if the pod had been killed after its last chunk, before its manifests.
    for name in (f"o/{RUN}/_manifest.json", f"o/{RUN}/shard-00000-of-00001/_manifest.json"):
        await obstore.delete_async(bucket.client, name)
    # A retried pod of a finished shard resumes at its end: nothing to predict again,
    # and it writes the manifests.
    again = await run_s3(world, contract, env={"pod_uid": "pod-again"})

    assert again.exit_code == ExitCode.DONE, again.termination
    assert again.result["resumedRows"] == 600
    assert await bucket.keys("o") == keys
    assert {key: await bucket.get(key) for key in keys} == first


# -- columnar pages (runner.storage._columnar) -------------------------------------------


async def test_typed_parquet_keys_and_passthrough_nulls_round_trip(
    world: World, bucket: Bucket
) -> None:
    """int32 keys, an int64 feature beside floats, a text column with nulls: as the row path."""
    rows = random_iris_rows(900, seed=21)
    whole = [[int(r[0] * 10), *r[1:]] for r in rows]  # an integer first feature
    species = [None if i % 7 == 0 else f"s{i % 3}" for i in range(900)]
    table = pa.table(
        {
            "id": pa.array(range(5000, 5900), pa.int32()),
            "sepal_length": pa.array([r[0] for r in whole], pa.int64()),
            "sepal_width": pa.array([r[1] for r in whole], pa.float32()),
            "petal_length": [r[2] for r in whole],
            "petal_width": [r[3] for r in whole],
            "species": pa.array(species, pa.string()),
        }
    )
    await bucket.put("in.parquet", parquet_bytes(table, 250))
    source = bucket.entry(key="in.parquet", paging={"pageSize": 300})
    source["s3"].update(keyColumn="id", passthroughColumns=["species"])
    outcome = await run_s3(world, s3_contract(world, source, bucket.entry(prefix="out")))

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    out = await bucket.output()
    assert_all_rows_once(out, {0: 900})
    assert out.column_names == ["shard", "row", "id", "species", "prediction"]
    assert out.schema.field("id").type == pa.int64()
    assert out.column("id").to_pylist() == list(range(5000, 5900))
    assert out.column("species").to_pylist() == species
    f32 = [float(v) for v in pa.array([r[1] for r in whole], pa.float32()).to_pylist()]
    sent = [[float(r[0]), f32[i], r[2], r[3]] for i, r in enumerate(whole)]
    assert out.column("prediction").to_pylist() == direct_iris(sent)


async def test_a_page_with_a_null_feature_goes_to_the_model_as_before(
    world: World, bucket: Bucket
) -> None:
    """The page with the null takes the row path (a JSON null, as before); the others not."""
    rows = random_iris_rows(600, seed=22)
    table = iris_table(rows)
    petal = table.column("petal_width").to_pylist()
    petal[450] = None
    table = table.set_column(3, "petal_width", pa.array(petal, pa.float64()))
    await bucket.put("in.parquet", parquet_bytes(table, 200))
    source = bucket.entry(key="in.parquet", paging={"pageSize": 200})
    outcome = await run_s3(world, s3_contract(world, source, bucket.entry(prefix="out")))

    # KServe's sklearn server takes the null as NaN and predicts; what matters is that
    # every other row's prediction is its own and every row is stored once.
    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    out = await bucket.output()
    assert_all_rows_once(out, {0: 600})
    got = out.column("prediction").to_pylist()
    expected = direct_iris(rows)
    assert got[:450] == expected[:450]
    assert got[451:] == expected[451:]


# -- shards ---------------------------------------------------------------------------


async def test_shards_read_disjoint_row_groups_and_the_last_writes_the_run_manifest(
    world: World, bucket: Bucket
) -> None:
    rows = random_iris_rows(1000, seed=12)
    await bucket.put_parquet("in/x.parquet", rows[:600], row_group=100)
    await bucket.put_parquet("in/y.parquet", rows[600:], row_group=100)
    contract = s3_contract(
        world,
        bucket.entry(prefix="in", paging={"pageSize": 150}),
        bucket.entry(prefix="out"),
        sharding={"count": 3},
    )

    outcomes = [await run_shard(world, contract, i) for i in (2, 0)]
    assert all(o.exit_code == ExitCode.DONE for o in outcomes), [o.termination for o in outcomes]
    # Two shards of three done: no run manifest yet.
    assert f"out/{RUN}/_manifest.json" not in await bucket.keys("out")
    last = await run_shard(world, contract, 1)
    assert last.exit_code == ExitCode.DONE, last.termination

    table = await bucket.output()
    # Ten row groups of 100, dealt round-robin: shard 0 gets groups 0, 3, 6, 9.
    assert_all_rows_once(table, {0: 400, 1: 300, 2: 300})
    by_shard: dict[int, list[float]] = {0: [], 1: [], 2: []}
    for group in range(10):
        by_shard[group % 3].extend(direct_iris(rows[group * 100 : (group + 1) * 100]))
    for shard, expected in by_shard.items():
        got = table.filter(pa.compute.equal(table.column("shard"), shard))
        assert got.column("prediction").to_pylist() == expected
    manifest = orjson.loads(await bucket.get(f"out/{RUN}/_manifest.json"))
    assert manifest["rows"] == 1000
    assert [s["rows"] for s in manifest["shards"]] == [400, 300, 300]


async def test_shards_of_text_objects_take_whole_objects(world: World, bucket: Bucket) -> None:
    rows = random_iris_rows(300, seed=13)
    for i in range(3):
        await bucket.put(f"in/{i}.csv", csv_bytes(rows[i * 100 : (i + 1) * 100]))
    contract = s3_contract(
        world, bucket.entry(prefix="in"), bucket.entry(prefix="out"), sharding={"count": 2}
    )
    for index in (0, 1):
        outcome = await run_shard(world, contract, index)
        assert outcome.exit_code == ExitCode.DONE, outcome.termination
    table = await bucket.output()
    assert_all_rows_once(table, {0: 200, 1: 100})
    shard1 = table.filter(pa.compute.equal(table.column("shard"), 1))
    assert shard1.column("prediction").to_pylist() == direct_iris(rows[100:200])


# -- a kill mid-write, and the resume -----------------------------------------------------


class HoldingS3Proxy(ForwardingProxy):
    """Forwards S3 requests untouched (signatures stay valid); holds chunk PUTs after ``n``."""

    HOP = frozenset({"connection", "content-length", "transfer-encoding", "keep-alive"})
    auto_decompress = False

    def __init__(self, target: str, hold_after: int) -> None:
        super().__init__(target)
        self.hold_after = hold_after
        self.chunk_puts = 0
        self.held = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        if request.method == "PUT" and "/part-" in request.path:
            self.chunk_puts += 1
            if self.chunk_puts > self.hold_after:
                self.held.set()
                await asyncio.Event().wait()  # until the runner is killed
        headers = {k: v for k, v in request.headers.items() if k.lower() not in self.HOP}
        async with self._session.request(
            request.method,
            f"{self.target}{request.path_qs}",
            data=body,
            headers=headers,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        ) as answer:
            payload = await answer.read()
            kept = {k: v for k, v in answer.headers.items() if k.lower() not in self.HOP}
            if request.method == "HEAD" and "Content-Length" in answer.headers:
                # A HEAD's answer has no body but says how long the object is.
                kept["Content-Length"] = answer.headers["Content-Length"]
        return web.Response(status=answer.status, body=payload, headers=kept)


async def test_a_runner_killed_mid_write_is_resumed_with_every_row_stored_once(
    world: World, bucket: Bucket
) -> None:
    rows = random_iris_rows(3000, seed=21)
    await bucket.put_parquet("in.parquet", rows, row_group=500)
    async with running(HoldingS3Proxy(bucket.server.url, hold_after=4)) as proxy:
        through_proxy = Bucket(bucket.server, bucket.name, url=proxy.url)
        contract = s3_contract(
            world,
            through_proxy.entry(key="in.parquet", paging={"pageSize": 250}),
            through_proxy.entry(prefix="out"),
        )
        process = await world.start_killable(contract, s3_secrets(), stderr=asyncio.subprocess.PIPE)
        exited = asyncio.ensure_future(process.wait())
        held = asyncio.ensure_future(proxy.held.wait())
        try:
            # The 5th chunk's PUT is held: the runner is killed while it writes.
            await asyncio.wait({exited, held}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGKILL)
            await exited
            held.cancel()
        assert process.stderr is not None
        said = (await process.stderr.read()).decode(errors="replace")[-2000:]
        assert process.returncode == -signal.SIGKILL, said
    stored = [k for k in await bucket.keys("out") if "/part-" in k]
    assert len(stored) == 4
    assert f"out/{RUN}/_manifest.json" not in await bucket.keys("out")

    contract = s3_contract(
        world, bucket.entry(key="in.parquet", paging={"pageSize": 250}), bucket.entry(prefix="out")
    )
    outcome = await run_s3(world, contract, env={"pod_uid": "pod-retry"})

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert outcome.result["resumedRows"] == 1000
    assert (outcome.result["rows"], outcome.result["predictions"]) == (3000, 3000)
    table = await bucket.output()
    assert_all_rows_once(table, {0: 3000})
    assert table.column("prediction").to_pylist() == direct_iris(rows)
    manifest = orjson.loads(await bucket.get(f"out/{RUN}/_manifest.json"))
    assert manifest["rows"] == 3000


# -- --check --------------------------------------------------------------------------


async def test_check_passes_without_reading_or_writing(world: World, bucket: Bucket) -> None:
    await bucket.put_parquet("in/a.parquet", random_iris_rows(50), row_group=50)
    contract = s3_contract(world, bucket.entry(prefix="in"), bucket.entry(prefix="out"))
    before = await bucket.keys()

    outcome = await world.check(contract, s3_secrets())

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert outcome.result["check"] == "ok"
    storage = next(e for e in outcome.events() if e.get("step") == "storage")
    assert storage["input"] == f"s3://{bucket.name}/in listed"
    assert await bucket.keys() == before


@pytest.mark.parametrize(
    ("change", "code", "says"),
    [
        ({"key": "missing.parquet"}, ExitCode.INPUT_REJECTED, "not found"),
        ({"bucket": "no-such-bucket-7", "prefix": "in"}, ExitCode.INPUT_REJECTED, "not found"),
        ({"prefix": "empty/"}, ExitCode.INPUT_REJECTED, "no objects under this prefix"),
    ],
)
async def test_check_refuses_what_a_run_would_meet(
    world: World, bucket: Bucket, change: dict[str, Any], code: ExitCode, says: str
) -> None:
    source = bucket.entry(prefix="in")
    source["s3"].pop("prefix")
    source["s3"].update(change)
    contract = s3_contract(world, source, bucket.entry(prefix="out"))

    outcome = await world.check(contract, s3_secrets())

    assert outcome.exit_code == code, outcome.termination
    assert outcome.termination.startswith("input: "), outcome.termination
    assert says in outcome.termination


# -- bad input ------------------------------------------------------------------------


async def test_a_missing_object_is_rejected_by_name(world: World, bucket: Bucket) -> None:
    contract = s3_contract(world, bucket.entry(key="nope/rows.csv"), bucket.entry(prefix="out"))
    outcome = await run_s3(world, contract)
    assert outcome.exit_code == ExitCode.INPUT_REJECTED, outcome.termination
    assert f"s3://{bucket.name}/nope/rows.csv: not found" in outcome.termination
    assert await bucket.keys("out") == []


async def test_a_missing_bucket_is_rejected_by_name(world: World, bucket: Bucket) -> None:
    source = bucket.entry(prefix="in")
    source["s3"]["bucket"] = "no-such-bucket-3"
    outcome = await run_s3(world, s3_contract(world, source, bucket.entry(prefix="out")))
    assert outcome.exit_code == ExitCode.INPUT_REJECTED, outcome.termination
    assert "s3://no-such-bucket-3/in" in outcome.termination
    assert "not found" in outcome.termination


async def test_a_missing_output_bucket_is_rejected_before_predicting(
    world: World, bucket: Bucket
) -> None:
    await bucket.put("in.csv", csv_bytes(random_iris_rows(10)))
    sink = bucket.entry(prefix="out")
    sink["s3"]["bucket"] = "no-such-output-9"
    outcome = await run_s3(world, s3_contract(world, bucket.entry(key="in.csv"), sink))
    assert outcome.exit_code == ExitCode.OUTPUT_REJECTED, outcome.termination
    assert "s3://no-such-output-9/" in outcome.termination


async def test_a_wrong_secret_is_denied_and_its_value_shown_nowhere(
    world: World, bucket: Bucket
) -> None:
    await bucket.put("in.csv", csv_bytes(random_iris_rows(10)))
    wrong = "wrong-secret-value-4f2b9c"
    contract = s3_contract(world, bucket.entry(key="in.csv"), bucket.entry(prefix="out"))

    outcome = await run_s3(world, contract, secrets=s3_secrets(secret=wrong))
    checked = await world.check(contract, s3_secrets(secret=wrong))

    # A run asks the output what is stored before reading; the check probes the input first.
    assert outcome.exit_code == ExitCode.OUTPUT_REJECTED, outcome.termination
    assert outcome.termination.startswith(f"output: listing s3://{bucket.name}/out/")
    assert "SignatureDoesNotMatch" in outcome.termination
    assert checked.exit_code == ExitCode.INPUT_REJECTED, checked.termination
    assert checked.termination.startswith(f"input: s3://{bucket.name}/in.csv: access denied")
    for result in (outcome, checked):
        assert "access denied (403)" in result.termination
        for text in (result.termination, result.stdout, result.stderr):
            assert wrong not in text
    assert await bucket.keys("out") == []


async def test_a_user_without_rights_on_the_bucket_is_denied_by_name(
    world: World, bucket: Bucket
) -> None:
    """A valid account (its signature checks out) that the bucket does not allow."""
    await bucket.put("in.csv", csv_bytes(random_iris_rows(10)))
    secret = "unprivileged-secret-value-8a1e37"
    bucket.server.create_user("ksc-s3-nobody", secret)
    secrets = s3_secrets(access="ksc-s3-nobody", secret=secret)
    contract = s3_contract(world, bucket.entry(key="in.csv"), bucket.entry(prefix="out"))

    outcome = await run_s3(world, contract, secrets=secrets)
    checked = await world.check(contract, secrets)

    assert outcome.exit_code == ExitCode.OUTPUT_REJECTED, outcome.termination
    assert outcome.termination.startswith(f"output: listing s3://{bucket.name}/out/")
    assert checked.exit_code == ExitCode.INPUT_REJECTED, checked.termination
    assert checked.termination.startswith(f"input: s3://{bucket.name}/in.csv: access denied")
    # The listing's answer has the store's code: the signature was good, the account refused.
    assert "access denied (403): AccessDenied: Access Denied" in outcome.termination
    # A HEAD's answer has no body: the message says both causes a 403 can have.
    assert "has no right on this bucket or object" in checked.termination
    for result in (outcome, checked):
        assert "SignatureDoesNotMatch" not in result.termination
        for text in (result.termination, result.stdout, result.stderr):
            assert secret not in text
    assert await bucket.keys("out") == []
    assert await bucket.keys() == ["in.csv"]


async def test_a_malformed_csv_row_names_the_object_and_row(world: World, bucket: Bucket) -> None:
    good = csv_bytes(random_iris_rows(40))
    await bucket.put("in/0.csv", good)
    await bucket.put("in/1.csv", good + b"5.1,3.5,1.4\n")
    contract = s3_contract(world, bucket.entry(prefix="in"), bucket.entry(prefix="out"))
    outcome = await run_s3(world, contract)
    assert outcome.exit_code == ExitCode.INPUT_REJECTED, outcome.termination
    assert f"s3://{bucket.name}/in/1.csv (csv)" in outcome.termination
    assert "Row #42" in outcome.termination
    assert "Expected 4 columns, got 3" in outcome.termination


async def test_a_parquet_object_with_other_columns_is_rejected(
    world: World, bucket: Bucket
) -> None:
    await bucket.put_parquet("in/a.parquet", random_iris_rows(30), row_group=30)
    other = pa.table({"sepal_length": [1.0], "petal": ["x"]})
    await bucket.put("in/b.parquet", parquet_bytes(other, 1))
    contract = s3_contract(world, bucket.entry(prefix="in"), bucket.entry(prefix="out"))
    outcome = await run_s3(world, contract)
    assert outcome.exit_code == ExitCode.INPUT_REJECTED, outcome.termination
    assert (
        f"s3://{bucket.name}/in/b.parquet has columns (sepal_length: double, petal: string)"
        in outcome.termination
    )
    assert "every object of the input must have the same columns" in outcome.termination
    assert await bucket.keys("out") == []


async def test_a_column_named_in_columns_but_absent_is_rejected_by_name(
    world: World, bucket: Bucket
) -> None:
    await bucket.put_parquet("in.parquet", random_iris_rows(30), row_group=30)
    source = bucket.entry(key="in.parquet")
    source["s3"]["columns"] = ["sepal_length", "sepal_width", "petal_length", "petal_wdth"]
    contract = s3_contract(world, source, bucket.entry(prefix="out"))
    outcome = await run_s3(world, contract)
    assert outcome.exit_code == ExitCode.INPUT_REJECTED, outcome.termination
    assert "row 0 has no column 'petal_wdth', which columns names" in outcome.termination
    assert await bucket.keys("out") == []


async def test_an_object_that_is_not_what_its_name_says(world: World, bucket: Bucket) -> None:
    await bucket.put("in/a.parquet", csv_bytes(random_iris_rows(3)))
    contract = s3_contract(world, bucket.entry(prefix="in"), bucket.entry(prefix="out"))
    outcome = await run_s3(world, contract)
    assert outcome.exit_code == ExitCode.INPUT_REJECTED, outcome.termination
    assert f"s3://{bucket.name}/in/a.parquet: not a Parquet file" in outcome.termination


async def test_an_s3_output_needs_a_streaming_input(world: World, bucket: Bucket) -> None:
    contract = s3_contract(world, bucket.entry(key="in.csv"), bucket.entry(prefix="out"))
    contract["input"] = {"http": {"secretRef": {"name": "x"}, "path": "/rows"}}
    outcome = await run_s3(world, contract)
    assert outcome.exit_code == ExitCode.BAD_CONTRACT, outcome.termination
    assert "output.s3 stores keyed chunks, so the input must stream" in outcome.termination


@pytest.mark.parametrize(("side", "entry"), [("input", "key"), ("input", "prefix"), ("output", "")])
async def test_a_wrong_region_is_rejected_naming_the_region(
    world: World, bucket: Bucket, side: str, entry: str
) -> None:
    """A request signed for another region is refused (400); the message says so."""
    await bucket.put_parquet("in/a.parquet", random_iris_rows(20), row_group=20)
    source = bucket.entry(key="in/a.parquet") if entry == "key" else bucket.entry(prefix="in")
    contract = s3_contract(world, source, bucket.entry(prefix="out"))
    contract[side]["s3"]["region"] = "eu-west-3"

    outcome = await run_s3(world, contract)
    checked = await world.check(contract, s3_secrets())

    code = ExitCode.INPUT_REJECTED if side == "input" else ExitCode.OUTPUT_REJECTED
    for result in (outcome, checked):
        assert result.exit_code == code, result.termination
        assert result.termination.startswith(f"{side}: "), result.termination
        assert "refused (400)" in result.termination
        assert "eu-west-3" in result.termination, result.termination
    if entry == "key":
        # A HEAD's answer has no body: the runner names the region it signed for.
        assert "a 400 here most often means a wrong region" in outcome.termination
    else:
        # A listing's answer has the store's own words, unescaped.
        assert (
            "AuthorizationHeaderMalformed: The authorization header is malformed; the region "
            '"eu-west-3" is wrong; expecting "us-east-1"'
        ) in outcome.termination
    assert await bucket.keys("out") == []


async def test_a_store_out_of_space_fails_retryably_and_a_retry_resumes(
    world: World, bucket: Bucket, small_disk: SmallDisk, tmp_path: Path
) -> None:
    """The output store's disk is 48 KiB: a chunk's PUT gets 507 InsufficientStorage.

    The runner exits 5 (retryable) naming the chunk and the store's words, with
    the chunks written so far kept; once there is room, the next attempt resumes
    after them and every row is stored once.
    """
    rows = random_iris_rows(6000, seed=31)
    await bucket.put_parquet("in.parquet", rows, row_group=500)
    directory = tmp_path / "small-s3"
    small_disk.mount(directory / "data", "48k")
    server = S3Server(directory, log=tmp_path / "small-s3.log").start()
    try:
        full = Bucket(server, server.create_bucket())
        contract = s3_contract(
            world,
            bucket.entry(key="in.parquet", paging={"pageSize": 500}),
            full.entry(prefix="out", format="jsonl"),
        )

        failed = await run_s3(world, contract, env={"pod_uid": "pod-full"})

        assert failed.exit_code == ExitCode.OUTPUT, failed.termination
        assert failed.termination.startswith(
            f"output: writing s3://{full.name}/out/{RUN}/shard-00000-of-00001/part-"
        ), failed.termination
        assert "InsufficientStorage: No space left on device." in failed.termination
        kept = [k for k in await full.keys("out") if "/part-" in k]
        assert 0 < len(kept) < 12, kept

        small_disk.resize(directory / "data", "16m")
        outcome = await run_s3(world, contract, env={"pod_uid": "pod-retry"})

        assert outcome.exit_code == ExitCode.DONE, outcome.termination
        assert outcome.result["resumedRows"] == 500 * len(kept)
        table = await full.output()
        assert_all_rows_once(table, {0: 6000})
        assert table.column("prediction").to_pylist() == direct_iris(rows)
        assert orjson.loads(await full.get(f"out/{RUN}/_manifest.json"))["rows"] == 6000
    finally:
        server.stop()
