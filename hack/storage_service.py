"""A loopback storage service speaking Krateo's finops-database-handler API, on SQLite.

``python -m hack.storage_service --port P --db PATH --user U --password PW [--seed-iris TABLE]``
serves ``POST /compute/<notebook>`` as finops-database-handler does, with the
behaviour that matters to a client (``reference/upstream-behaviour.md`` §4):

- **HTTP Basic** auth on every call (401 otherwise);
- the JSON body becomes the notebook's ``key=value`` arguments: every value must
  be a string (anything else is a 500 from the handler's global error handler),
  a value is cut at its first ``=``, one argument may not exceed Linux's 128 KiB
  (``MAX_ARG_STRLEN``: 500 "Argument list too long");
- the answer is the notebook's stdout, typed ``application/json`` **only if**
  ``Accept`` is exactly ``application/json`` (``text/html`` otherwise);
- a notebook that fails answers **200** with its error text (a traceback); a
  missing argument prints ``missing agument for call: <name>`` and fails;
- ``GET /compute/list`` answers the notebooks' names as the handler's notebook
  table gives them, ``[["sklearninput"], ...]``, running none (what the runner's
  ``--check`` asks); ``listings`` counts those calls apart from ``calls``.

Notebooks, with upstream's semantics but parameterised SQL and validated
identifiers (``[A-Za-z_][A-Za-z0-9_]*``, quoted):

- ``sklearninput(input_table_name)``: every row of the table, every column as a
  float: ``{"result": [[...], ...]}``;
- ``sklearnoutput``/``tritonoutput(output_table_name, job_uid, pod_uid, predictions)``:
  creates the table if needed and inserts one row per prediction
  ``(jobuid, poduid, prediction, counter)``; prints nothing. The optional
  ``predictions_offset`` (the runner's chunked writes) is added to ``counter``;
- ``tritoninput(input_table_name, input_data_length, input_table_column_name,
  key_name, key_value)``: the series ``ORDER BY timestamp`` where
  ``key_name = key_value``, NULL as 0.0, gaps zero-filled at the smallest time
  step, the last ``input_data_length`` values: ``{"result": [[...]]}`` (or
  ``{"result": []}`` when there is no data).

Importable: :class:`StorageService` runs in the caller's event loop and offers
seeding and read-back helpers for tests.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import collections
import contextlib
import hmac
import itertools
import re
import socket
import sqlite3
import ssl
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

ARGUMENT_LIMIT = 128 * 1024  # MAX_ARG_STRLEN, counting the terminating NUL
IRIS_COLUMNS = ("sepal_length", "sepal_width", "petal_length", "petal_width")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class NotebookFailed(Exception):
    """A notebook's own failure: becomes 200 with this text, like the real handler."""


@dataclass(frozen=True)
class NotebookResult:
    exit_code: int
    stdout: str
    stderr: str


def identifier(name: str, what: str) -> str:
    if not _IDENTIFIER.match(name):
        raise NotebookFailed(f"invalid {what} {name!r}: expected [A-Za-z_][A-Za-z0-9_]*")
    return f'"{name}"'


def argv_from_body(body: Any) -> list[str]:
    """The handler's argv construction; TypeError for non-strings (its 500)."""
    if not isinstance(body, dict):
        raise TypeError("the request body must be a JSON object")
    argv = []
    for key, value in body.items():
        if not isinstance(value, str):
            raise TypeError(
                f"expected str, bytes or os.PathLike object, not {type(value).__name__}"
            )
        argument = f"{key}={value}"
        if len(argument.encode()) + 1 > ARGUMENT_LIMIT:
            raise OSError(7, "Argument list too long")
        argv.append(argument)
    return argv


def parse_arguments(argv: Sequence[str]) -> dict[str, str]:
    """The notebooks' own parsing: ``split('=')``, value = the first segment after the key."""
    arguments = {}
    for argument in argv:
        parts = argument.split("=")
        arguments[parts[0]] = parts[1] if len(parts) > 1 else ""
    return arguments


def require(arguments: dict[str, str], *names: str) -> list[str]:
    missing = [name for name in names if name not in arguments]
    if missing:
        raise NotebookFailed(f"missing agument for call: {missing[0]}")
    return [arguments[name] for name in names]


def sklearn_input(db: sqlite3.Connection, arguments: dict[str, str]) -> str:
    (table,) = require(arguments, "input_table_name")
    cursor = db.execute(f"SELECT * FROM {identifier(table, 'table name')}")
    rows = [[float(value) for value in row] for row in cursor]
    return orjson.dumps({"result": rows}).decode() + "\n"


def store_output(db: sqlite3.Connection, arguments: dict[str, str]) -> str:
    table, job_uid, pod_uid, predictions = require(
        arguments, "output_table_name", "job_uid", "pod_uid", "predictions"
    )
    offset = int(arguments.get("predictions_offset", "0") or "0")
    values = orjson.loads(predictions)
    if not isinstance(values, list):
        raise NotebookFailed("predictions is not a JSON list")
    quoted = identifier(table, "table name")
    with db:
        db.execute(
            f"CREATE TABLE IF NOT EXISTS {quoted} (jobuid TEXT, poduid TEXT, prediction DOUBLE, "
            "counter INT, created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP, "
            "PRIMARY KEY (jobuid, poduid, prediction, counter))"
        )
        db.executemany(
            f"INSERT INTO {quoted} (jobuid, poduid, prediction, counter) VALUES (?, ?, ?, ?)",
            ((job_uid, pod_uid, value, offset + i) for i, value in enumerate(values)),
        )
    return ""


def _seconds(value: Any) -> float:
    if isinstance(value, int | float):
        return float(value)
    return datetime.fromisoformat(str(value)).timestamp()


def triton_input(db: sqlite3.Connection, arguments: dict[str, str]) -> str:
    table, length, column, key_name, key_value = require(
        arguments,
        "input_table_name",
        "input_data_length",
        "input_table_column_name",
        "key_name",
        "key_value",
    )
    cursor = db.execute(
        f"SELECT timestamp, {identifier(column, 'column name')} "
        f"FROM {identifier(table, 'table name')} "
        f"WHERE {identifier(key_name, 'key name')} = ? ORDER BY timestamp ASC",
        (key_value,),
    )
    points = [(_seconds(t), 0.0 if v is None else float(v)) for t, v in cursor]
    if not points:
        return orjson.dumps({"result": []}).decode() + "\n"
    series = zero_filled(points)[-int(length) :]
    return orjson.dumps({"result": [series]}).decode() + "\n"


def zero_filled(points: Sequence[tuple[float, float]]) -> list[float]:
    """Values on a regular timeline at the smallest step, 0.0 where a point is missing."""
    times = [t for t, _ in points]
    steps = [b - a for a, b in itertools.pairwise(times) if b > a]
    if not steps:
        return [points[-1][1]]
    step = min(steps)
    start = times[0]
    slots = round((times[-1] - start) / step) + 1
    values = [0.0] * slots
    for t, v in points:
        values[round((t - start) / step)] = v
    return values


NOTEBOOKS: dict[str, Callable[[sqlite3.Connection, dict[str, str]], str]] = {
    "sklearninput": sklearn_input,
    "sklearnoutput": store_output,
    "tritonoutput": store_output,
    "tritoninput": triton_input,
}


class StorageService:
    """The service on one SQLite file; start it in the current event loop."""

    def __init__(self, db_path: Path | str, user: str, password: str) -> None:
        self.db_path = Path(db_path)
        self._user = user
        self._password = password
        self.calls: collections.Counter[str] = collections.Counter()
        self.listings = 0
        self.app = web.Application(client_max_size=1 << 30)
        self.app.router.add_get("/compute/list", self._list)
        self.app.router.add_post("/compute/{notebook}", self._compute)
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- HTTP -------------------------------------------------------------------------

    async def start(
        self, host: str = "127.0.0.1", port: int = 0, tls: ssl.SSLContext | None = None
    ) -> str:
        # Binding the socket here tells us the port when the caller asked for any (0).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, sock, ssl_context=tls).start()
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://{host}:{sock.getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _authorised(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        return hmac.compare_digest(user, self._user) and hmac.compare_digest(
            password, self._password
        )

    def _refusal(self) -> web.Response:
        return web.Response(
            status=401,
            text="Unauthorized Access",
            headers={"WWW-Authenticate": 'Basic realm="Authentication Required"'},
        )

    async def _list(self, request: web.Request) -> web.StreamResponse:
        if not self._authorised(request):
            return self._refusal()
        self.listings += 1
        return web.json_response([[name] for name in NOTEBOOKS])

    async def _compute(self, request: web.Request) -> web.StreamResponse:
        if not self._authorised(request):
            return self._refusal()
        name = request.match_info["notebook"]
        self.calls[name] += 1
        notebook = NOTEBOOKS.get(name)
        if notebook is None:
            return web.Response(status=404, text=f"notebook {name} not found")
        try:
            argv = argv_from_body(orjson.loads(await request.read()))
        except (orjson.JSONDecodeError, TypeError, OSError) as error:
            # The handler's global error handler: a 500 with the exception's text.
            return web.Response(status=500, text=f"{type(error).__name__}: {error}")
        result = await asyncio.to_thread(self.run_notebook, notebook, argv)
        output = result.stdout if result.exit_code == 0 else result.stderr or result.stdout
        json_wanted = request.headers.get("Accept") == "application/json"
        return web.Response(
            status=200,
            text=output,
            content_type="application/json" if json_wanted else "text/html",
        )

    # -- notebooks ----------------------------------------------------------------------

    def connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.db_path, timeout=30)

    def run_notebook(
        self, notebook: Callable[[sqlite3.Connection, dict[str, str]], str], argv: list[str]
    ) -> NotebookResult:
        db = self.connect()
        try:
            return NotebookResult(0, notebook(db, parse_arguments(argv)), "")
        except NotebookFailed as failure:
            # Upstream prints "missing agument ..." on stdout, then dies on the name.
            return NotebookResult(1, f"{failure}\n", traceback.format_exc())
        except Exception:
            return NotebookResult(1, "", traceback.format_exc())
        finally:
            db.close()

    # -- seeding and reading back, for tests ------------------------------------------------

    def seed_table(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        quoted = identifier(table, "table name")
        names = ", ".join(identifier(c, "column name") for c in columns)
        marks = ", ".join("?" for _ in columns)
        with contextlib.closing(self.connect()) as db, db:
            db.execute(f"DROP TABLE IF EXISTS {quoted}")
            db.execute(f"CREATE TABLE {quoted} ({names})")
            db.executemany(f"INSERT INTO {quoted} ({names}) VALUES ({marks})", rows)

    def seed_iris(self, table: str) -> list[list[float]]:
        from sklearn.datasets import load_iris

        rows = [[float(v) for v in row] for row in load_iris().data]
        self.seed_table(table, IRIS_COLUMNS, rows)
        return rows

    def seed_series(
        self,
        table: str,
        column: str,
        key_name: str,
        points: Iterable[tuple[str, float | None, Any]],
    ) -> None:
        """``points`` are ``(key value, value, timestamp)``."""
        self.seed_table(table, (key_name, column, "timestamp"), ((k, v, t) for k, v, t in points))

    def predictions(self, table: str) -> list[tuple[str, str, float, int]]:
        """``(jobuid, poduid, prediction, counter)`` rows, in job, pod and counter order."""
        with contextlib.closing(self.connect()) as db:
            return [
                (str(j), str(p), float(v), int(c))
                for j, p, v, c in db.execute(
                    f"SELECT jobuid, poduid, prediction, counter FROM "
                    f"{identifier(table, 'table name')} ORDER BY jobuid, poduid, counter"
                )
            ]

    def has_table(self, table: str) -> bool:
        with contextlib.closing(self.connect()) as db:
            found = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
            ).fetchone()
        return found is not None


async def _serve(args: argparse.Namespace) -> None:
    service = StorageService(args.db, args.user, args.password)
    if args.seed_iris:
        service.seed_iris(args.seed_iris)
    url = await service.start(args.host, args.port)
    print(f"storage service on {url}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await service.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hack.storage_service",
        description="A finops-database-handler look-alike on SQLite, for tests.",
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--db", required=True, help="SQLite database file")
    parser.add_argument("--user", required=True)
    parser.add_argument("--password", required=True)
    parser.add_argument("--seed-iris", metavar="TABLE", help="create TABLE with the iris rows")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
