"""Runner throughput against the model server's own limit, and runner peak memory.

    python -m bench.runner_throughput [--rows 1000000] [--batch-size 1000] [--concurrency 4]

Everything on loopback, in separate processes, on this machine:

1. KServe's model server (``python -m hack.model_server``) serving iris.
2. **Model server limit**: a direct aiohttp load generator sends the same rows in
   requests of ``--batch-size`` rows, ``--concurrency`` in flight, bodies encoded
   before the clock starts. That is the most any client could get.
3. **Runner**: ``python -m runner``'s code in a child process (Secrets given in
   code, as the tests do) reading ``--rows`` rows from the storage look-alike
   (``python -m hack.storage_service``), predicting them with the same batch size
   and concurrency, and storing the predictions in chunks. Its inference stage
   is timed by the runner itself (the ``stage timings`` log line); its peak
   memory is the child's own ``VmHWM`` (``ru_maxrss`` would also count the
   forking parent's pages from before ``exec``).

The direct rate is measured before and after the runner, and both are printed:
on a shared machine they differ, and the spread says how far to trust a ratio.

Measured and printed, never asserted: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson

REPO = Path(__file__).resolve().parents[1]
USER, PASSWORD = "bench", "bench-password"
MODEL = "sklearn-iris"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


@contextlib.contextmanager
def server(args: list[str], ready_url: str) -> Iterator[None]:
    process = subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until_ready(ready_url, process)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


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
    queue = iter(bodies)
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            for body in queue:
                async with session.post(url, data=body, headers=headers) as answer:
                    await answer.read()
                    if answer.status != 200:
                        raise RuntimeError(f"model answered {answer.status}")

        # One warm-up request so connection set-up is not measured.
        async with session.post(url, data=bodies[0], headers=headers) as answer:
            await answer.read()
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return len(rows) / (time.perf_counter() - started)


def child(contract_path: str, storage_url: str) -> int:
    """The runner, with its Secret given in code (run as ``--child``)."""
    from runner import app, logs

    class Secrets:
        async def read(self, namespace: str, name: str) -> dict[str, str]:
            return {"server-url": storage_url, "username": USER, "password": PASSWORD}

    logs.configure("info")
    environ = {
        **os.environ,
        "CONTRACT_PATH": contract_path,
        "TERMINATION_LOG_PATH": contract_path + ".termination",
        "pod_uid": "bench-pod",
    }
    code = asyncio.run(app.run(environ, secrets=Secrets()))
    status = Path("/proc/self/status").read_text()
    peak_kib = next(
        int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")
    )
    print(orjson.dumps({"event": "bench peak", "vmHwmKiB": peak_kib}).decode(), flush=True)
    return code


def run_runner(
    workdir: Path, model_url: str, storage_url: str, rows: int, batch: int, concurrency: int
) -> dict[str, Any]:
    api = {
        "endpointRef": {"name": "storage", "namespace": "bench"},
        "verb": "POST",
        "headers": ["Accept: application/json"],
    }
    contract = {
        "jobId": "bench-job",
        "jobName": "inf-bench-00000000",
        "kserve": {"modelName": MODEL, "modelUrl": model_url, "modelVersion": "v2"},
        "input": {"krateo": {"api": {**api, "path": "/compute/sklearninput"}}},
        "output": {
            "krateo": {"api": {**api, "path": "/compute/sklearnoutput"}, "chunkSize": 40_000}
        },
        "parameters": {"input_table_name": f"rows{rows}", "output_table_name": f"out{rows}"},
        "batching": {"batchSize": batch, "concurrency": concurrency},
    }
    contract_path = workdir / f"contract-{rows}.json"
    contract_path.write_bytes(orjson.dumps(contract))
    log_path = workdir / f"runner-{rows}.log"
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
        )
        started = time.perf_counter()
        process.wait()
        wall = time.perf_counter() - started
    events = [orjson.loads(line) for line in log_path.read_bytes().splitlines() if line[:1] == b"{"]
    if process.returncode != 0:
        raise RuntimeError(f"the runner failed ({process.returncode}): {events[-1]}")
    timings = next(e for e in events if e["event"] == "stage timings")
    peak = next(e for e in events if e["event"] == "bench peak")
    return {"rows": rows, "wallSeconds": wall, "peakRssMiB": peak["vmHwmKiB"] / 1024, **timings}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runner_throughput", description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--direct-rows", type=int, default=200_000)
    parser.add_argument(
        "--child", nargs=2, metavar=("CONTRACT", "STORAGE_URL"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child)

    model_port, storage_port = free_port(), free_port()
    model_url = f"http://127.0.0.1:{model_port}/v2/models/{MODEL}/infer"
    with tempfile.TemporaryDirectory(prefix="runner-bench-") as tmp:
        workdir = Path(tmp)
        db = workdir / "bench.sqlite"
        from hack.storage_service import IRIS_COLUMNS, StorageService

        seeding = StorageService(db, USER, PASSWORD)
        for count in sorted({1000, args.rows}):
            seeding.seed_table(f"rows{count}", IRIS_COLUMNS, iris_rows(count))
        storage_cmd = [
            "hack.storage_service",
            "--port",
            str(storage_port),
            "--db",
            str(db),
            "--user",
            USER,
            "--password",
            PASSWORD,
        ]
        storage_url = f"http://127.0.0.1:{storage_port}"
        with (
            server(
                ["hack.model_server", "--port", str(model_port)],
                f"http://127.0.0.1:{model_port}/v2/health/ready",
            ),
            server(storage_cmd, f"{storage_url}/compute/none"),
        ):
            direct_rows = iris_rows(args.direct_rows)
            before = asyncio.run(
                direct_rows_per_second(model_url, direct_rows, args.batch_size, args.concurrency)
            )
            small = run_runner(
                workdir, model_url, storage_url, 1000, args.batch_size, args.concurrency
            )
            big = run_runner(
                workdir, model_url, storage_url, args.rows, args.batch_size, args.concurrency
            )
            after = asyncio.run(
                direct_rows_per_second(model_url, direct_rows, args.batch_size, args.concurrency)
            )

    runner_rate = big["rows"] / big["inferenceSeconds"]
    direct = (before + after) / 2
    print(f"batch size {args.batch_size}, concurrency {args.concurrency}, {os.cpu_count()} CPUs")
    print(
        f"model server, direct load generator ({args.direct_rows} rows): {direct:,.0f} rows/s "
        f"(before the runner {before:,.0f}, after {after:,.0f})"
    )
    print(
        f"runner, inference stage ({big['rows']} rows): {runner_rate:,.0f} rows/s "
        f"= {runner_rate / direct:.2f} of the direct rate"
    )
    print(
        f"runner, whole run ({big['rows']} rows): {big['wallSeconds']:.1f} s wall "
        f"(input {big['inputSeconds']:.1f} s, inference {big['inferenceSeconds']:.1f} s, "
        f"output {big['outputSeconds']:.1f} s, process start included in wall)"
    )
    print(
        f"runner peak RSS: {big['peakRssMiB']:.0f} MiB for {big['rows']} rows, "
        f"{small['peakRssMiB']:.0f} MiB for {small['rows']} rows"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
