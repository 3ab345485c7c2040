"""Prompts per second through the runner against an OpenAI endpoint, beside a direct client.

    python -m bench.openai_throughput [--prompts 20000] [--concurrency 16]
        [--page-size 2000] [--direct-prompts 10000] [--max-tokens 64] [--server-delay 0]

Everything on loopback, in separate processes, on this machine:

1. The OpenAI-compatible test server (``python -m hack.openai_server``: KServe's
   OpenAI types, the ``echo`` model, one process; ``--server-delay`` seconds of
   "generation" per answer, an asyncio sleep, so that the server's latency and
   not its CPU sets the pace, as a model's does) and the storage look-alike
   (``python -m hack.storage_service``) holding a table of ``--prompts`` prompts
   (``id``, ``prompt``).
2. **Direct load generator**: the same chat-completion requests the runner
   sends (``model``, ``messages``, ``max_tokens``, ``temperature``), bodies
   encoded before the clock starts, ``--concurrency`` in flight, answers read
   and checked for a status of 200. That is the most any client gets from the
   server. Measured before and after the runner: on a shared machine they
   differ, and the spread says how far to trust the ratio.
3. **The runner** (``python -m runner``'s code in a child process, Secrets
   given in code, as ``bench.runner_throughput`` runs it): every prompt through
   the ``http`` provider with paging (``--page-size``), ``keyColumn: id``, one
   request per prompt, ``--concurrency`` in flight, answers stored as keyed
   chunks. Its rate is prompts over the whole stream (reads, requests and
   writes overlap; the runner's own ``stream done`` line).

Printed: both rates, their ratio (the goal is at least 0.9: the runner's own
work per prompt, reading, building requests, parsing answers and storing them,
must not be what limits a run), CPU seconds of each process, load averages.
Measured and printed, never asserted: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import orjson

from bench.common import load_average, machine, proc_cpu_seconds
from bench.runner_throughput import post_all, run_runner, server, storage_command
from hack.cluster import free_port

MODEL = "echo"


def prompt(index: int) -> str:
    return f"Summarise item {index} of the catalogue in one short sentence, please."


def seed(db: Path, table: str, count: int) -> None:
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(f'DROP TABLE IF EXISTS "{table}"')
        conn.execute(f'CREATE TABLE "{table}" (id TEXT, prompt TEXT)')
        conn.executemany(
            f'INSERT INTO "{table}" VALUES (?, ?)',
            ((f"p-{i:07d}", prompt(i)) for i in range(count)),
        )


def request_body(text: str, max_tokens: int) -> dict[str, Any]:
    """What the runner sends for one prompt (runner.openai.build_request)."""
    return {
        "max_tokens": max_tokens,
        "temperature": 0,
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
    }


def direct(url: str, count: int, concurrency: int, max_tokens: int) -> tuple[float, float]:
    """:func:`direct_prompts_per_second`, and this process's CPU-us per prompt meanwhile."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    rate = asyncio.run(direct_prompts_per_second(url, count, concurrency, max_tokens))
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return rate, cpu / count * 1e6


async def direct_prompts_per_second(
    url: str, count: int, concurrency: int, max_tokens: int
) -> float:
    """The server's own rate: pre-encoded chat requests, ``concurrency`` in flight."""
    bodies = [orjson.dumps(request_body(prompt(i), max_tokens)) for i in range(count)]
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    return count / await post_all(url, bodies, headers, concurrency)


def runner_contract(
    base_url: str, table: str, out: str, args: argparse.Namespace
) -> dict[str, Any]:
    ref = {"secretRef": {"name": "storage", "namespace": "bench"}}
    return {
        "jobId": "bench-openai",
        "jobName": "inf-bench-openai",
        "kserve": {
            "modelName": MODEL,
            "modelUrl": base_url,
            "modelVersion": "openai",
            "openai": {"request": {"max_tokens": args.max_tokens, "temperature": 0}},
        },
        "input": {
            "http": {
                **ref,
                "method": "GET",
                "path": f"/tables/{table}/rows",
                "rowsField": "rows",
                "paging": {"pageSize": args.page_size},
                "keyColumn": "id",
            }
        },
        "output": {
            "http": {
                **ref,
                "path": f"/tables/{out}/predictions",
                "resumePath": f"/tables/{out}/progress",
            }
        },
        "parameters": {"rows_as": "objects"},
        "batching": {"concurrency": args.concurrency},
    }


def stored(db: Path, table: str) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        count, keys, low, high = conn.execute(
            f'SELECT count(*), count(DISTINCT rowkey), min(counter), max(counter) FROM "{table}"'
        ).fetchone()
        answer = conn.execute(
            f'SELECT prediction FROM "{table}" ORDER BY counter LIMIT 1'
        ).fetchone()
    first = orjson.loads(answer[0]) if answer else {}
    return {"count": count, "keys": keys, "min": low, "max": high, "first": first}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.openai_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--prompts", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--page-size", type=int, default=2000)
    parser.add_argument("--direct-prompts", type=int, default=10_000)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--server-delay", type=float, default=0.0, help="seconds per answer")
    args = parser.parse_args(argv)

    model_port, storage_port = free_port(), free_port()
    base_url = f"http://127.0.0.1:{model_port}/openai/v1"
    chat_url = f"{base_url}/chat/completions"
    loads = [load_average()]
    with tempfile.TemporaryDirectory(prefix="openai-bench-") as tmp:
        workdir = Path(tmp)
        db = workdir / "bench.sqlite"
        table = f"prompts{args.prompts}"
        seed(db, table, args.prompts)
        storage_cmd = storage_command(storage_port, db)
        storage_url = f"http://127.0.0.1:{storage_port}"
        with (
            server(
                [
                    "hack.openai_server",
                    "--port",
                    str(model_port),
                    "--delay",
                    str(args.server_delay),
                ],
                f"{base_url}/models",
            ) as model_process,
            server(storage_cmd, f"{storage_url}/compute/none") as storage_process,
        ):
            first, first_cpu = direct(
                chat_url, args.direct_prompts, args.concurrency, args.max_tokens
            )
            cpu_before = [proc_cpu_seconds(p.pid) for p in (model_process, storage_process)]
            loads.append(load_average())
            one = run_runner(
                workdir, "openai", runner_contract(base_url, table, "answers", args), storage_url
            )
            cpu = [
                proc_cpu_seconds(p.pid) - b
                for p, b in zip((model_process, storage_process), cpu_before, strict=True)
            ]
            loads.append(load_average())
            after, after_cpu = direct(
                chat_url, args.direct_prompts, args.concurrency, args.max_tokens
            )
            loads.append(load_average())
            check = stored(db, "answers")

    rate = args.prompts / one["seconds"]
    mean = (first + after) / 2
    print(f"machine: {machine()}")
    print(
        f"prompts {args.prompts:,}, concurrency {args.concurrency}, page size {args.page_size}, "
        f"max_tokens {args.max_tokens}, server delay {args.server_delay} s per answer"
    )
    print("load averages (start, before the runner, after it, at the end): " + "; ".join(loads))
    print(
        f"direct load generator ({args.direct_prompts:,} prompts): {mean:,.0f} prompts/s "
        f"(before the runner {first:,.0f}, after {after:,.0f}); its own CPU "
        f"{first_cpu:.0f} / {after_cpu:.0f} us per prompt (encoding the bodies included)"
    )
    print(
        f"runner, http provider paged, {args.prompts:,} prompts: {rate:,.0f} prompts/s over the "
        f"whole stream ({one['seconds']:.1f} s; {one['wallSeconds']:.1f} s wall with process "
        f"start) = {rate / mean:.2f} of the direct rate ({rate / first:.2f} of before, "
        f"{rate / after:.2f} of after)"
    )
    per_prompt = one["runCpuSeconds"] / args.prompts * 1e6
    print(
        f"CPU seconds during the run: server {cpu[0]:.1f}, storage {cpu[1]:.1f}, runner "
        f"{one['runCpuSeconds']:.1f} from the run's start ({per_prompt:.0f} CPU-us per prompt), "
        f"for {one['wallSeconds']:.1f} s wall"
    )
    print(
        f"stored: {check['count']:,} answers, {check['keys']:,} distinct keys, positions "
        f"{check['min']}..{check['max']}; first: {check['first']}"
    )
    if check["count"] != args.prompts or check["keys"] != args.prompts:
        print("ERROR: the stored answers do not match the prompts")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
