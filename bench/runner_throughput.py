"""Runner throughput against the model server's own limit, peak memory, resume, shards.

    python -m bench.runner_throughput [--rows 1000000] [--batch-size 1000] [--concurrency 4]
        [--page-size 10000] [--pages-in-flight 2] [--kill-at 0.9] [--shards 4]
        [--compat-rows 0] [--storage http|s3|postgres]

Everything on loopback, in separate processes, on this machine:

1. KServe's model server (``python -m hack.model_server``) serving iris.
2. **Model server limit**: a direct aiohttp load generator sends the same rows in
   requests of ``--batch-size`` rows, ``--concurrency`` in flight, bodies encoded
   before the clock starts. That is the most any client could get. Measured
   before and after the runners: on a shared machine they differ, and the spread
   says how far to trust a ratio.
3. **Streaming runner** (``python -m runner``'s code in a child process, Secrets
   given in code): ``--rows`` rows through the ``http`` provider with paging
   (``--page-size``) from the storage look-alike's plain JSON routes
   (``python -m hack.storage_service``), predictions stored as keyed chunks. Its
   rate is rows over the whole stream (read, inference and writes overlap; the
   runner's own ``stream done`` line); its peak memory is the child's ``VmHWM``
   (``ru_maxrss`` would also count the forking parent's pages from before ``exec``).
4. **Kill and resume**: the same run under another job id, with a counting
   proxy in front of the model; the child is SIGKILLed once ``--kill-at`` of the
   rows are stored, a second child resumes. Checked: every row stored once
   (count, distinct keys, positions 0..N-1); rows predicted twice (proxy count
   minus N) in pages.
5. **Shards**: ``--shards`` children of one sharded run at once (each reads only
   its own rows), against the one-shard run of (3), by wall time.
6. ``--compat-rows N`` also runs the unpaged path (one read, as upstream; krateo
   provider, chunked output) for N rows, for its peak memory.

7. ``--storage s3`` or ``--storage postgres``: parts 1-5 against a real S3 server
   (versitygw, Parquet in and out) or a real PostgreSQL, both started here
   (:mod:`bench.runner_stores`); the default ``http`` is the look-alike above.

The runner's own cost per row is its CPU-seconds from the run's start (after
its imports) divided by the rows, from the child's ``getrusage``.

Measured and printed, never asserted: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson

from bench.common import proc_cpu_seconds
from bench.runner_stores import PostgresStore, S3Store, store_for, wait_stored
from hack.cluster import free_port, stop_process
from hack.loopback import FaultProxy

REPO = Path(__file__).resolve().parents[1]
USER, PASSWORD = "bench", "bench-password"
MODEL = "sklearn-iris"


def wait_until_ready(url: str, process: subprocess.Popen[bytes], within: float = 120) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers: good enough
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise RuntimeError(f"{url} not ready within {within}s")


def storage_command(port: int, db: Path) -> list[str]:
    """``hack.storage_service`` on ``port`` over the SQLite file ``db``, for :func:`server`."""
    return [
        "hack.storage_service",
        "--port",
        str(port),
        "--db",
        str(db),
        "--user",
        USER,
        "--password",
        PASSWORD,
    ]


@contextlib.contextmanager
def server(args: list[str], ready_url: str) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until_ready(ready_url, process)
        yield process
    finally:
        stop_process(process, grace=15)


def print_load_and_direct(
    load: list[tuple[float, float, float]], direct_rows: int, before: float, after: float
) -> None:
    """The report's lines on the machine's load and on the direct load generator's rate."""
    print(
        "load averages (start, after each part): "
        + "; ".join(" ".join(f"{v:.2f}" for v in triple) for triple in load)
    )
    print(
        f"model server, direct load generator ({direct_rows:,} rows): "
        f"{(before + after) / 2:,.0f} rows/s (before the runners {before:,.0f}, after {after:,.0f})"
    )


def print_stream(provider: str, rows: int, one: dict[str, Any], direct: float) -> None:
    """The report's lines on one streaming runner against the direct rate ``direct``."""
    rate = rows / one["seconds"]
    print(
        f"streaming runner, {provider} provider, {rows:,} rows: {rate:,.0f} rows/s over the "
        f"whole stream ({one['seconds']:.1f} s; {one['wallSeconds']:.1f} s wall with process "
        f"start) = {rate / direct:.2f} of the direct rate; {one['pages']} pages, "
        f"{one['chunks']} chunks"
    )
    print(f"streaming runner peak RSS: {one['peakRssMiB']:.0f} MiB for {rows:,} rows")


def print_sharded(count: int, rows: int, one: dict[str, Any], sharded: dict[str, Any]) -> None:
    """The report's line on ``count`` shards run at once against one shard alone."""
    shards = sharded["shards"]
    sharded_rate = rows / sharded["wallSeconds"]
    one_rate = rows / one["wallSeconds"]
    print(
        f"{count} shards at once: {sharded_rate:,.0f} rows/s by wall time "
        f"({sharded['wallSeconds']:.1f} s) vs one shard {one_rate:,.0f} rows/s "
        f"({one['wallSeconds']:.1f} s) = {sharded_rate / one_rate:.2f}x; rows per shard "
        f"{[s['rows'] for s in shards]}, peak RSS per shard "
        f"{[round(s['peakRssMiB']) for s in shards]} MiB; stored "
        f"{sharded['check']['count']:,} rows, {sharded['check']['keys']:,} distinct keys"
    )


def iris_rows(count: int) -> list[list[float]]:
    rng = np.random.default_rng(1)
    low, high = np.array([4.3, 2.0, 1.0, 0.1]), np.array([7.9, 4.4, 6.9, 2.5])
    values = rng.uniform(low, high, size=(count, 4)).round(1)
    return [[float(v) for v in row] for row in values]


async def direct_rows_per_second(
    url: str, rows: list[list[float]], batch_size: int, concurrency: int
) -> float:
    """The model server's own rate: pre-encoded v2 requests, ``concurrency`` in flight."""
    bodies = [
        orjson.dumps(
            {
                "inputs": [
                    {
                        "name": "input-0",
                        "shape": [len(rows[i : i + batch_size]), 4],
                        "datatype": "FP32",
                        "data": rows[i : i + batch_size],
                    }
                ]
            }
        )
        for i in range(0, len(rows), batch_size)
    ]
    seconds = await post_all(url, bodies, {"Content-Type": "application/json"}, concurrency)
    return len(rows) / seconds


async def post_all(
    url: str, bodies: list[bytes], headers: dict[str, str], concurrency: int
) -> float:
    """Seconds to POST every body, ``concurrency`` in flight, each answer read and checked.

    One warm-up request first, so that connection set-up is not measured.
    """
    queue = iter(bodies)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            for body in queue:
                async with session.post(url, data=body, headers=headers) as answer:
                    await answer.read()
                    if answer.status != 200:
                        raise RuntimeError(f"the server answered {answer.status}")

        async with session.post(url, data=bodies[0], headers=headers) as answer:
            await answer.read()
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started


STORAGE_KEYS = ("server-url", "url")


class _NoPandas:
    """An import finder that says pandas is not installed (:func:`child`)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def child(contract_path: str, storage_url: str) -> int:
    """The runner, with its Secret given in code (run as ``--child``).

    pandas is hidden, as in the runner image, which does not install it: pyarrow
    imports pandas on its first array when it can (the development virtualenv
    has it for the model server), ~3 CPU-s and ~90 MiB of RSS the image never pays.
    """
    sys.meta_path.insert(0, _NoPandas())
    from runner import app, logs

    given = os.environ.get("BENCH_SECRET")

    class Secrets:
        async def read(self, namespace: str, name: str) -> dict[str, str]:
            if given:
                return dict(orjson.loads(given))
            return {
                **{key: storage_url for key in STORAGE_KEYS},
                "username": USER,
                "password": PASSWORD,
            }

    logs.configure("info")
    environ = {
        **os.environ,
        "CONTRACT_PATH": contract_path,
        "TERMINATION_LOG_PATH": contract_path + ".termination",
        "pod_uid": os.environ.get("POD_UID", "bench-pod"),
    }
    # The runner's own cost per row counts from here: imports (the sources are
    # compiled on each start where bytecode is not cached) are a fixed start cost.
    gc.freeze()  # as python -m runner does before its run
    started = resource.getrusage(resource.RUSAGE_SELF)
    code = asyncio.run(app.run(environ, secrets=Secrets()))
    status = Path("/proc/self/status").read_text()
    peak_kib = next(
        int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")
    )
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        orjson.dumps(
            {
                "event": "bench peak",
                "vmHwmKiB": peak_kib,
                "cpuSeconds": usage.ru_utime + usage.ru_stime,
                "runCpuSeconds": usage.ru_utime
                + usage.ru_stime
                - started.ru_utime
                - started.ru_stime,
            }
        ).decode(),
        flush=True,
    )
    return code


def seed(db: Path, table: str, count: int, chunk: int = 500_000) -> None:
    """``count`` iris-like rows, generated and inserted in chunks (bounded memory)."""
    from hack.storage_service import IRIS_COLUMNS

    rng = np.random.default_rng(1)
    low, high = np.array([4.3, 2.0, 1.0, 0.1]), np.array([7.9, 4.4, 6.9, 2.5])
    columns = ", ".join(IRIS_COLUMNS)
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(f'DROP TABLE IF EXISTS "{table}"')
        conn.execute(f'CREATE TABLE "{table}" ({columns})')
        for start in range(0, count, chunk):
            size = min(chunk, count - start)
            values = rng.uniform(low, high, size=(size, 4)).round(1)
            conn.executemany(f'INSERT INTO "{table}" VALUES (?, ?, ?, ?)', values.tolist())


def stream_contract(
    job: str, model_url: str, table: str, out: str, args: argparse.Namespace, shards: int = 1
) -> dict[str, Any]:
    ref = {"secretRef": {"name": "storage", "namespace": "bench"}}
    contract: dict[str, Any] = {
        "jobId": job,
        "jobName": f"inf-{job}",
        "kserve": {"modelName": MODEL, "modelUrl": model_url, "modelVersion": "v2"},
        "input": {
            "http": {
                **ref,
                "method": "GET",
                "path": f"/tables/{table}/rows",
                "rowsField": "rows",
                "paging": {"pageSize": args.page_size, "pagesInFlight": args.pages_in_flight},
            }
        },
        "output": {
            "http": {
                **ref,
                "path": f"/tables/{out}/predictions",
                "resumePath": f"/tables/{out}/progress",
            }
        },
        "batching": {"batchSize": args.batch_size, "concurrency": args.concurrency},
    }
    if shards > 1:
        contract["sharding"] = {"count": shards}
    return contract


def compat_contract(model_url: str, rows: int, args: argparse.Namespace) -> dict[str, Any]:
    api = {
        "endpointRef": {"name": "storage", "namespace": "bench"},
        "verb": "POST",
        "headers": ["Accept: application/json"],
    }
    return {
        "jobId": "bench-job",
        "jobName": "inf-bench-00000000",
        "kserve": {"modelName": MODEL, "modelUrl": model_url, "modelVersion": "v2"},
        "input": {"krateo": {"api": {**api, "path": "/compute/sklearninput"}}},
        "output": {
            "krateo": {"api": {**api, "path": "/compute/sklearnoutput"}, "chunkSize": 40_000}
        },
        "parameters": {"input_table_name": f"rows{rows}", "output_table_name": f"out{rows}"},
        "batching": {"batchSize": args.batch_size, "concurrency": args.concurrency},
    }


def start_runner(
    workdir: Path, name: str, contract: dict[str, Any], storage_url: str, **env: str
) -> tuple[subprocess.Popen[bytes], Path]:
    contract_path = workdir / f"contract-{name}.json"
    contract_path.write_bytes(orjson.dumps(contract))
    log_path = workdir / f"runner-{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.runner_throughput",
                "--child",
                str(contract_path),
                storage_url,
            ],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )
    return process, log_path


def outcome(process: subprocess.Popen[bytes], log_path: Path) -> dict[str, Any]:
    events = [orjson.loads(line) for line in log_path.read_bytes().splitlines() if line[:1] == b"{"]
    if process.returncode != 0:
        raise RuntimeError(f"the runner failed ({process.returncode}): {events[-3:]}")
    found: dict[str, Any] = {}
    for event in events:
        if event["event"] in ("stage timings", "stream done", "bench peak"):
            found.update(event)
    found["peakRssMiB"] = found.pop("vmHwmKiB") / 1024
    return found


def run_runner(
    workdir: Path, name: str, contract: dict[str, Any], storage_url: str, **env: str
) -> dict[str, Any]:
    process, log_path = start_runner(workdir, name, contract, storage_url, **env)
    started = time.perf_counter()
    process.wait()
    return {**outcome(process, log_path), "wallSeconds": time.perf_counter() - started}


class CountingProxy(FaultProxy):
    """Forwards to the model server in a thread of its own, counting the rows predicted.

    The tests' :class:`hack.loopback.FaultProxy`, injecting no faults
    (``forwarded_rows`` is the count), on an event loop of its own: this
    benchmark's main thread blocks.
    """

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.start(), self._loop).result(30)
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self.stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def stored(db: Path, table: str) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(db, timeout=60)) as conn:
        count, keys, low, high = conn.execute(
            f'SELECT count(*), count(DISTINCT rowkey), min(counter), max(counter) FROM "{table}"'
        ).fetchone()
    return {"count": count, "keys": keys, "min": low, "max": high}


def stored_so_far(db: Path, table: str) -> int:
    """Rows inserted so far: max(rowid), cheap (keyed rows are only ever inserted)."""
    with contextlib.closing(sqlite3.connect(db, timeout=60)) as conn:
        try:
            return int(conn.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()[0] or 0)
        except sqlite3.OperationalError:
            return 0


def kill_and_resume(
    workdir: Path,
    db: Path,
    model_url: str,
    storage_url: str,
    table: str,
    rows: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    with CountingProxy(model_url.split("/v2/")[0]) as proxy:
        proxied = f"{proxy.url}/v2/models/{MODEL}/infer"
        contract = stream_contract("bench-kill", proxied, table, "out_kill", args)
        process, _ = start_runner(workdir, "kill-1", contract, storage_url, POD_UID="pod-1")
        threshold = int(rows * args.kill_at)
        while (done := stored_so_far(db, "out_kill")) < threshold:
            if process.poll() is not None:
                raise RuntimeError(f"the runner ended ({process.returncode}) before the kill")
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait()
        killed_at = stored_so_far(db, "out_kill")
        predicted_first = proxy.forwarded_rows
        second = run_runner(workdir, "kill-2", contract, storage_url, POD_UID="pod-2")
        predicted = proxy.forwarded_rows
    check = stored(db, "out_kill")
    return {
        "threshold": threshold,
        "seenAtKill": done,
        "storedAfterKill": killed_at,
        "predictedByFirst": predicted_first,
        "resumedRows": second["resumedRows"],
        "redoneRows": predicted - rows,
        "second": second,
        **check,
    }


def run_shards(
    workdir: Path,
    model_url: str,
    storage_url: str,
    table: str,
    shards: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    contract = stream_contract("bench-shards", model_url, table, "out_shards", args, shards)
    started = time.perf_counter()
    children = [
        start_runner(
            workdir,
            f"shard-{index}",
            contract,
            storage_url,
            JOB_COMPLETION_INDEX=str(index),
            POD_UID=f"pod-{index}",
        )
        for index in range(shards)
    ]
    for process, _ in children:
        process.wait()
    wall = time.perf_counter() - started
    results = [outcome(process, log) for process, log in children]
    return {"wallSeconds": wall, "shards": results}


def store_contract(
    job: str,
    model_url: str,
    store: S3Store | PostgresStore,
    out: str,
    args: argparse.Namespace,
    shards: int = 1,
) -> dict[str, Any]:
    contract: dict[str, Any] = {
        "jobId": job,
        "jobName": f"inf-{job}",
        "kserve": {"modelName": MODEL, "modelUrl": model_url, "modelVersion": "v2"},
        "input": store.input(args.page_size, args.pages_in_flight),
        "output": store.output(out),
        "batching": {"batchSize": args.batch_size, "concurrency": args.concurrency},
    }
    if shards > 1:
        contract["sharding"] = {"count": shards}
    return contract


def store_main(args: argparse.Namespace) -> int:
    """``--storage s3|postgres``: the same parts against real servers (bench.runner_stores)."""
    rows, page = args.rows, args.page_size
    model_port = free_port()
    model_url = f"http://127.0.0.1:{model_port}/v2/models/{MODEL}/infer"
    load = [os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="runner-bench-") as tmp:
        workdir = Path(tmp)
        store = store_for(args.storage, workdir)
        with (
            store.running(),
            server(
                ["hack.model_server", "--port", str(model_port)],
                f"http://127.0.0.1:{model_port}/v2/health/ready",
            ) as model_process,
        ):
            seeding = time.perf_counter()
            store.seed(rows, page)
            seeded = time.perf_counter() - seeding
            env = {"BENCH_SECRET": orjson.dumps(store.secret).decode()}
            direct_rows = iris_rows(args.direct_rows)
            before = asyncio.run(
                direct_rows_per_second(model_url, direct_rows, args.batch_size, args.concurrency)
            )
            model_cpu = proc_cpu_seconds(model_process.pid)
            one = run_runner(
                workdir,
                "stream",
                store_contract("bench-stream", model_url, store, "out_stream", args),
                "",
                **env,
            )
            model_cpu = proc_cpu_seconds(model_process.pid) - model_cpu
            one_check = store.stored("out_stream")
            load.append(os.getloadavg())
            killed: dict[str, Any] | None = None
            if args.kill_at:
                with CountingProxy(model_url.split("/v2/")[0]) as proxy:
                    proxied = f"{proxy.url}/v2/models/{MODEL}/infer"
                    contract = store_contract("bench-kill", proxied, store, "out_kill", args)
                    process, _ = start_runner(workdir, "kill-1", contract, "", POD_UID="p1", **env)
                    seen = wait_stored(store, "out_kill", int(rows * args.kill_at), process)
                    process.send_signal(signal.SIGKILL)
                    process.wait()
                    at_kill = store.stored_so_far("out_kill")
                    first = proxy.forwarded_rows
                    second = run_runner(workdir, "kill-2", contract, "", POD_UID="p2", **env)
                    redone = proxy.forwarded_rows - rows
                killed = {
                    "seen": seen,
                    "atKill": at_kill,
                    "first": first,
                    "second": second,
                    "redone": redone,
                    **store.stored("out_kill"),
                }
                load.append(os.getloadavg())
            sharded: dict[str, Any] | None = None
            if args.shards > 1:
                contract = store_contract(
                    "bench-shards", model_url, store, "out_shards", args, args.shards
                )
                started = time.perf_counter()
                children = [
                    start_runner(
                        workdir,
                        f"shard-{i}",
                        contract,
                        "",
                        JOB_COMPLETION_INDEX=str(i),
                        POD_UID=f"pod-{i}",
                        **env,
                    )
                    for i in range(args.shards)
                ]
                for process, _ in children:
                    process.wait()
                wall = time.perf_counter() - started
                sharded = {
                    "wallSeconds": wall,
                    "shards": [outcome(p, log) for p, log in children],
                    "check": store.stored("out_shards"),
                }
                load.append(os.getloadavg())
            after = asyncio.run(
                direct_rows_per_second(model_url, direct_rows, args.batch_size, args.concurrency)
            )
            load.append(os.getloadavg())

    direct = (before + after) / 2
    print(
        f"{args.storage}: batch size {args.batch_size}, concurrency {args.concurrency}, page "
        f"size {page}, {args.pages_in_flight} pages in flight, {os.cpu_count()} CPUs; "
        f"seeding {rows:,} rows took {seeded:.0f} s"
    )
    print_load_and_direct(load, args.direct_rows, before, after)
    print_stream(args.storage, rows, one, direct)
    print(
        f"CPU seconds during that run: model server {model_cpu:.1f}, runner "
        f"{one['cpuSeconds']:.1f} (with its start), for {one['wallSeconds']:.1f} s wall; "
        f"runner's own cost {one['runCpuSeconds'] / rows * 1e6:.2f} CPU-us per row "
        "(from the run's start, imports excluded)"
    )
    print(
        f"stored: {one_check['count']:,} rows, {one_check['keys']:,} distinct (shard, row) keys, "
        f"{one_check['ids']:,} distinct input ids {one_check['min']}..{one_check['max']}"
    )
    if killed is not None:
        print(
            f"kill at {args.kill_at:.0%}: SIGKILL once {killed['seen']:,} rows were stored "
            f"({killed['atKill']:,} after the kill landed; the first pod had predicted "
            f"{killed['first']:,}); the second pod resumed at {killed['second']['resumedRows']:,} "
            f"and finished in {killed['second']['seconds']:.1f} s; rows predicted twice: "
            f"{killed['redone']:,} ({killed['redone'] / page:.2f} chunks of {page:,}); stored "
            f"{killed['count']:,} rows, {killed['keys']:,} distinct keys, {killed['ids']:,} "
            f"distinct ids; second pod peak RSS {killed['second']['peakRssMiB']:.0f} MiB"
        )
    if sharded is not None:
        print_sharded(args.shards, rows, one, sharded)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.runner_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--page-size", type=int, default=10_000)
    parser.add_argument("--pages-in-flight", type=int, default=2)
    parser.add_argument("--direct-rows", type=int, default=200_000)
    parser.add_argument("--kill-at", type=float, default=0.9, help="0 skips the kill")
    parser.add_argument("--shards", type=int, default=4, help="1 skips the sharded run")
    parser.add_argument("--compat-rows", type=int, default=0, help="0 skips the unpaged run")
    parser.add_argument(
        "--child", nargs=2, metavar=("CONTRACT", "STORAGE_URL"), help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--storage",
        choices=("http", "s3", "postgres"),
        default="http",
        help="http: the SQLite look-alike (default); s3: versitygw, Parquet in and out; "
        "postgres: a private PostgreSQL (bench.runner_stores)",
    )
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child)
    if args.storage != "http":
        return store_main(args)

    model_port, storage_port = free_port(), free_port()
    model_url = f"http://127.0.0.1:{model_port}/v2/models/{MODEL}/infer"
    load = [os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="runner-bench-") as tmp:
        workdir = Path(tmp)
        db = workdir / "bench.sqlite"
        table = f"rows{args.rows}"
        seeding = time.perf_counter()
        seed(db, table, args.rows)
        if args.compat_rows:
            seed(db, f"rows{args.compat_rows}", args.compat_rows)
        seeded = time.perf_counter() - seeding
        storage_cmd = storage_command(storage_port, db)
        storage_url = f"http://127.0.0.1:{storage_port}"
        with (
            server(
                ["hack.model_server", "--port", str(model_port)],
                f"http://127.0.0.1:{model_port}/v2/health/ready",
            ) as model_process,
            server(storage_cmd, f"{storage_url}/compute/none") as storage_process,
        ):
            direct_rows = iris_rows(args.direct_rows)
            before = asyncio.run(
                direct_rows_per_second(model_url, direct_rows, args.batch_size, args.concurrency)
            )
            cpu_before = [proc_cpu_seconds(p.pid) for p in (model_process, storage_process)]
            one = run_runner(
                workdir,
                "stream",
                stream_contract("bench-stream", model_url, table, "out_stream", args),
                storage_url,
            )
            cpu = [
                proc_cpu_seconds(p.pid) - b
                for p, b in zip((model_process, storage_process), cpu_before, strict=True)
            ]
            one_check = stored(db, "out_stream")
            load.append(os.getloadavg())
            killed = None
            if args.kill_at:
                killed = kill_and_resume(
                    workdir, db, model_url, storage_url, table, args.rows, args
                )
                load.append(os.getloadavg())
            sharded = None
            if args.shards > 1:
                sharded = run_shards(workdir, model_url, storage_url, table, args.shards, args)
                sharded["check"] = stored(db, "out_shards")
                load.append(os.getloadavg())
            compat = None
            if args.compat_rows:
                compat = run_runner(
                    workdir,
                    "compat",
                    compat_contract(model_url, args.compat_rows, args),
                    storage_url,
                )
            after = asyncio.run(
                direct_rows_per_second(model_url, direct_rows, args.batch_size, args.concurrency)
            )
            load.append(os.getloadavg())

    rows = args.rows
    direct = (before + after) / 2
    print(
        f"batch size {args.batch_size}, concurrency {args.concurrency}, page size "
        f"{args.page_size}, {args.pages_in_flight} pages in flight, {os.cpu_count()} CPUs; "
        f"seeding {rows:,} rows took {seeded:.0f} s"
    )
    print_load_and_direct(load, args.direct_rows, before, after)
    print_stream("http", rows, one, direct)
    print(
        f"CPU seconds during that run: model server {cpu[0]:.1f}, storage service {cpu[1]:.1f}, "
        f"runner {one['cpuSeconds']:.1f} (with its start), for {one['wallSeconds']:.1f} s wall"
    )
    print(
        f"runner's own cost: {one['runCpuSeconds'] / rows * 1e6:.2f} CPU-us per row "
        f"({one['runCpuSeconds']:.1f} CPU-s from the run's start, imports excluded)"
    )
    print(
        f"stored: {one_check['count']:,} rows, {one_check['keys']:,} distinct keys, positions "
        f"{one_check['min']}..{one_check['max']}"
    )
    if killed is not None:
        print(
            f"kill at {args.kill_at:.0%}: SIGKILL once {killed['seenAtKill']:,} rows were stored "
            f"({killed['storedAfterKill']:,} after the kill landed; the first pod had "
            f"predicted {killed['predictedByFirst']:,}); the second pod resumed at "
            f"{killed['resumedRows']:,} and finished in {killed['second']['seconds']:.1f} s; "
            f"rows predicted twice: {killed['redoneRows']:,} "
            f"({killed['redoneRows'] / args.page_size:.2f} pages of {args.page_size:,}); "
            f"stored {killed['count']:,} rows, {killed['keys']:,} distinct keys, positions "
            f"{killed['min']}..{killed['max']}; second pod peak RSS "
            f"{killed['second']['peakRssMiB']:.0f} MiB"
        )
    if sharded is not None:
        print_sharded(args.shards, rows, one, sharded)
    if compat is not None:
        print(
            f"unpaged runner (krateo, one read, as upstream), {args.compat_rows:,} rows: "
            f"inference {args.compat_rows / compat['inferenceSeconds']:,.0f} rows/s, "
            f"{compat['wallSeconds']:.1f} s wall, peak RSS {compat['peakRssMiB']:.0f} MiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
