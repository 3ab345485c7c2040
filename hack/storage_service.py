"""A loopback storage service speaking Krateo's finops-database-handler API, on SQLite.

``python -m hack.storage_service --port P --db PATH --user U --password PW [--seed-iris TABLE]``
serves ``POST /compute/<notebook>`` as finops-database-handler does, with the
behaviour that matters to a client of the upstream finops-database-handler:

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
  float: ``{"result": [[...], ...]}``. With the runner's paging arguments
  (``offset``, ``limit``, and for a sharded run ``shard_index``/``shard_count``)
  one page of the shard: ``{"result": [...], "total": <rows in the shard>}``
  (see "Paging" below);
- ``sklearnoutput``/``tritonoutput(output_table_name, job_uid, pod_uid, predictions)``:
  creates the table if needed and inserts one row per prediction
  ``(jobuid, poduid, prediction, counter)``; prints nothing. The optional
  ``predictions_offset`` (the runner's chunked writes) is added to ``counter``.
  With ``idempotency_key`` (the runner's keyed writes, see "Exactly once") each
  prediction is stored once per key and the answer is ``{"stored", "duplicates"}``.
  With ``progress=true`` (and ``output_table_name, job_uid, shard_index,
  shard_count``) it stores nothing and answers what the run's shard already
  stored, ``{"stored": n, "next": k}`` (the runner's resume);
- ``tritoninput(input_table_name, input_data_length, input_table_column_name,
  key_name, key_value)``: the series ``ORDER BY timestamp`` where
  ``key_name = key_value``, NULL as 0.0, gaps zero-filled at the smallest time
  step, the last ``input_data_length`` values: ``{"result": [[...]]}`` (or
  ``{"result": []}`` when there is no data).

**Paging.** A row's *position* is its place in the table (the stand-in uses
``rowid - 1``: its tables are written once, so rowids are dense). Shard ``s`` of
``c`` is the rows whose position ``p`` has ``p % c == s``; ``offset``/``limit``
count within the shard, so the page ``(offset k, limit n)`` is the shard's rows
``k .. k+n-1``, i.e. positions ``s + c*k`` onwards. A page shorter than ``limit``
is the last.

**Exactly once.** A keyed write (``idempotency_key`` present) stores prediction
``i`` at ``counter = s + c*(predictions_offset + i)`` (the row's position) with
the key ``<job_uid>/<s>/<position>`` in a unique column ``rowkey`` (added to an
older table); a key already there is skipped, so a chunk written twice (a
retried request, a retried pod) is stored once. Unkeyed writes are unchanged.
A table that a keyed write creates has ``rowkey`` as its one unique index
(upstream's primary key would be a second, redundant for keyed rows).

**Cost.** Each worker thread keeps one SQLite connection (WAL) for its
requests, inserts go through one ``executemany``, and float rows go out as
sqlite3's tuples: the look-alike must not be what limits a benchmark.

**Rows as objects.** With the argument ``rows_as=objects`` (for the runner's join
keys: ``columns``, ``keyColumn``, ``passthroughColumns``) ``sklearninput`` and
``GET /tables/{t}/rows`` answer each row as an object keyed by column name, its
values as stored (not made floats). A prediction that is an object or a list
(the runner's joined output rows) is stored as its JSON text.

**Plain JSON routes** (for the runner's ``http`` provider; same Basic auth):
``GET /tables/{t}/rows?offset&limit&shard_index&shard_count`` ->
``{"rows": [...], "total": n}``; ``POST /tables/{t}/predictions`` with a JSON body
``{"job_uid", "pod_uid", "predictions": [...], "predictions_offset", "shard_index",
"shard_count", "idempotency_key"}`` -> ``{"stored", "duplicates"}``; ``GET
/tables/{t}/progress?job_uid&shard_index&shard_count`` -> ``{"stored", "next"}``.

**Test hooks**: ``hold_writes_after(n)`` makes every prediction write after the
``n``-th wait (``writes_held`` is set while one waits) until
``release_writes()``: a storage stalled mid-run, as ``SIGSTOP`` would make it.

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
import threading
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


def _integer(arguments: dict[str, str], name: str, default: int, least: int = 0) -> int:
    raw = arguments.get(name, "")
    try:
        value = int(raw) if raw != "" else default
    except ValueError:
        raise NotebookFailed(f"{name} must be an integer, got {raw!r}") from None
    if value < least:
        raise NotebookFailed(f"{name} must be at least {least}, got {value}")
    return value


def partition(arguments: dict[str, str]) -> tuple[int, int]:
    """``(shard_index, shard_count)``, ``(0, 1)`` when absent."""
    count = _integer(arguments, "shard_count", 1, least=1)
    index = _integer(arguments, "shard_index", 0)
    if index >= count:
        raise NotebookFailed(f"shard_index {index} is not below shard_count {count}")
    return index, count


def shaped(cursor: sqlite3.Cursor, arguments: dict[str, str]) -> list[Any]:
    """The cursor's rows as float lists, or as objects with ``rows_as=objects`` (above).

    Rows whose values are all floats already are returned as sqlite3's tuples
    (orjson writes a tuple as a JSON array): checked in C loops, no list per row.
    """
    if arguments.get("rows_as") == "objects":
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor]
    rows = cursor.fetchall()
    if set(map(type, itertools.chain.from_iterable(rows))) <= {float}:
        return rows
    return [list(map(float, row)) for row in rows]


def stored_value(value: Any) -> Any:
    """A prediction as stored: an object or a list (a joined output row) as JSON text."""
    return orjson.dumps(value).decode() if isinstance(value, dict | list) else value


def page_rows(
    db: sqlite3.Connection, table: str, arguments: dict[str, str]
) -> tuple[list[Any], int]:
    """One page of one shard (see "Paging"), and the number of rows in the shard."""
    quoted = identifier(table, "table name")
    index, count = partition(arguments)
    offset = _integer(arguments, "offset", 0)
    limit = _integer(arguments, "limit", 1 << 62, least=1)
    last = db.execute(f"SELECT max(rowid) FROM {quoted}").fetchone()[0] or 0
    total = max(0, -(-(last - index) // count))
    low = index + count * offset + 1
    high = index + count * (offset + min(limit, total) - 1) + 1
    if count == 1:
        cursor = db.execute(
            f"SELECT * FROM {quoted} WHERE rowid BETWEEN ? AND ? ORDER BY rowid", (low, high)
        )
    else:
        cursor = db.execute(
            f"SELECT * FROM {quoted} WHERE rowid BETWEEN ? AND ? AND (rowid - 1) % ? = ? "
            "ORDER BY rowid",
            (low, high, count, index),
        )
    return shaped(cursor, arguments), total


def sklearn_input(db: sqlite3.Connection, arguments: dict[str, str]) -> str:
    (table,) = require(arguments, "input_table_name")
    if any(name in arguments for name in ("offset", "limit", "shard_count")):
        rows, total = page_rows(db, table, arguments)
        return orjson.dumps({"result": rows, "total": total}).decode() + "\n"
    cursor = db.execute(f"SELECT * FROM {identifier(table, 'table name')}")
    return orjson.dumps({"result": shaped(cursor, arguments)}).decode() + "\n"


_OUTPUT_TABLE = (
    "CREATE TABLE IF NOT EXISTS {t} (jobuid TEXT, poduid TEXT, prediction DOUBLE, "
    "counter INT, created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP, "
    "PRIMARY KEY (jobuid, poduid, prediction, counter))"
)


# A table created by a keyed write: the key is ``rowkey``, its one index (upstream's
# primary key would be a second index, redundant for keyed rows, and as costly).
_KEYED_TABLE = (
    "CREATE TABLE IF NOT EXISTS {t} (jobuid TEXT, poduid TEXT, prediction DOUBLE, "
    "counter INT, created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP, shard INT, rowkey TEXT)"
)


def _keyed_table(db: sqlite3.Connection, table: str) -> str:
    """The output table with its ``shard`` and unique ``rowkey`` columns (added if missing)."""
    quoted = identifier(table, "table name")
    db.execute(_KEYED_TABLE.format(t=quoted))
    columns = {row[1] for row in db.execute(f"PRAGMA table_info({quoted})")}
    if "shard" not in columns:
        db.execute(f"ALTER TABLE {quoted} ADD COLUMN shard INT")
    if "rowkey" not in columns:
        db.execute(f"ALTER TABLE {quoted} ADD COLUMN rowkey TEXT")
    db.execute(f'CREATE UNIQUE INDEX IF NOT EXISTS "{table}_rowkey" ON {quoted} (rowkey)')
    return quoted


def store_keyed(
    db: sqlite3.Connection,
    table: str,
    job_uid: str,
    pod_uid: str,
    values: list[Any],
    arguments: dict[str, str],
) -> dict[str, int]:
    """Each prediction once per ``<job_uid>/<shard>/<position>`` (see "Exactly once")."""
    index, count = partition(arguments)
    offset = _integer(arguments, "predictions_offset", 0)
    with db:
        quoted = _keyed_table(db, table)
        before = db.total_changes
        first = index + count * offset
        positions = range(first, first + count * len(values), count)
        prefix = f"{job_uid}/{index}/"
        if not set(map(type, values)) <= {int, float}:
            values = list(map(stored_value, values))
        db.executemany(
            f"INSERT OR IGNORE INTO {quoted} (jobuid, poduid, prediction, counter, shard, rowkey) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            zip(
                itertools.repeat(job_uid),
                itertools.repeat(pod_uid),
                values,
                positions,
                itertools.repeat(index),
                map(prefix.__add__, map(str, positions)),
            ),
        )
        stored = db.total_changes - before
    return {"stored": stored, "duplicates": len(values) - stored}


def stored_progress(
    db: sqlite3.Connection, table: str, job_uid: str, arguments: dict[str, str]
) -> dict[str, int]:
    """``stored``: keyed predictions of the shard; ``next``: the shard offset they reach
    without a gap (where a resumed runner continues)."""
    index, count = partition(arguments)
    quoted = identifier(table, "table name")
    exists = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    if not exists:
        return {"stored": 0, "next": 0}
    columns = {row[1] for row in db.execute(f"PRAGMA table_info({quoted})")}
    if "rowkey" not in columns:
        return {"stored": 0, "next": 0}
    where = "WHERE jobuid = ? AND shard = ? AND rowkey IS NOT NULL"
    stored, last = db.execute(
        f"SELECT count(*), max(counter) FROM {quoted} {where}", (job_uid, index)
    ).fetchone()
    if not stored:
        return {"stored": 0, "next": 0}
    if (last - index) // count + 1 == stored:
        return {"stored": stored, "next": stored}
    following = 0
    for (position,) in db.execute(
        f"SELECT counter FROM {quoted} {where} ORDER BY counter", (job_uid, index)
    ):
        if position != index + count * following:
            break
        following += 1
    return {"stored": stored, "next": following}


def output_progress(db: sqlite3.Connection, arguments: dict[str, str]) -> str:
    table, job_uid = require(arguments, "output_table_name", "job_uid")
    return orjson.dumps(stored_progress(db, table, job_uid, arguments)).decode() + "\n"


def store_output(db: sqlite3.Connection, arguments: dict[str, str]) -> str:
    if arguments.get("progress") == "true":
        return output_progress(db, arguments)
    table, job_uid, pod_uid, predictions = require(
        arguments, "output_table_name", "job_uid", "pod_uid", "predictions"
    )
    offset = int(arguments.get("predictions_offset", "0") or "0")
    values = orjson.loads(predictions)
    if not isinstance(values, list):
        raise NotebookFailed("predictions is not a JSON list")
    if "idempotency_key" in arguments:
        answer = store_keyed(db, table, job_uid, pod_uid, values, arguments)
        return orjson.dumps(answer).decode() + "\n"
    quoted = identifier(table, "table name")
    with db:
        db.execute(
            f"CREATE TABLE IF NOT EXISTS {quoted} (jobuid TEXT, poduid TEXT, prediction DOUBLE, "
            "counter INT, created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP, "
            "PRIMARY KEY (jobuid, poduid, prediction, counter))"
        )
        db.executemany(
            f"INSERT INTO {quoted} (jobuid, poduid, prediction, counter) VALUES (?, ?, ?, ?)",
            ((job_uid, pod_uid, stored_value(v), offset + i) for i, v in enumerate(values)),
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
_WRITERS = frozenset({"sklearnoutput", "tritonoutput"})


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
        self.app.router.add_get("/tables/{table}/rows", self._rows)
        self.app.router.add_post("/tables/{table}/predictions", self._predictions)
        self.app.router.add_get("/tables/{table}/progress", self._progress)
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.writes = 0
        self._hold_after: int | None = None
        self._released = asyncio.Event()
        self.writes_held = asyncio.Event()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []

    def hold_writes_after(self, count: int) -> None:
        """Prediction writes after the ``count``-th wait until :meth:`release_writes`."""
        self._hold_after = count
        self._released.clear()

    def release_writes(self) -> None:
        self._hold_after = None
        self._released.set()

    async def _write_gate(self) -> None:
        self.writes += 1
        if self._hold_after is not None and self.writes > self._hold_after:
            self.writes_held.set()
            await self._released.wait()

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
        self.close_connections()

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
        if name in _WRITERS and "progress=true" not in argv:
            await self._write_gate()
        result = await asyncio.to_thread(self.run_notebook, notebook, argv)
        output = result.stdout if result.exit_code == 0 else result.stderr or result.stdout
        json_wanted = request.headers.get("Accept") == "application/json"
        return web.Response(
            status=200,
            text=output,
            content_type="application/json" if json_wanted else "text/html",
        )

    # -- plain JSON routes (the http provider's paging and keyed writes) ----------------

    async def _sql(self, request: web.Request, work: Callable[[sqlite3.Connection], Any]) -> Any:
        if not self._authorised(request):
            raise web.HTTPUnauthorized(text="Unauthorized Access")
        self.calls[request.path] += 1

        try:
            return await asyncio.to_thread(work, self._thread_db())
        except NotebookFailed as failure:
            raise web.HTTPBadRequest(text=str(failure)) from None
        except sqlite3.OperationalError as error:
            raise web.HTTPNotFound(text=str(error)) from None

    async def _rows(self, request: web.Request) -> web.StreamResponse:
        table, query = request.match_info["table"], dict(request.query)
        rows, total = await self._sql(request, lambda db: page_rows(db, table, query))
        body = orjson.dumps({"rows": rows, "total": total})
        return web.Response(body=body, content_type="application/json")

    async def _predictions(self, request: web.Request) -> web.StreamResponse:
        table = request.match_info["table"]
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            raise web.HTTPBadRequest(text="the body is not JSON") from None
        if not isinstance(body, dict) or not {"job_uid", "predictions"} <= body.keys():
            raise web.HTTPBadRequest(text="job_uid and predictions are required")
        values = body["predictions"]
        if isinstance(values, str):
            values = orjson.loads(values)
        if not isinstance(values, list):
            raise web.HTTPBadRequest(text="predictions is not a list")
        arguments = {k: str(v) for k, v in body.items() if k != "predictions"}
        if "idempotency_key" not in arguments:
            raise web.HTTPBadRequest(text="idempotency_key is required")
        await self._write_gate()
        answer = await self._sql(
            request,
            lambda db: store_keyed(
                db, table, arguments["job_uid"], arguments.get("pod_uid", ""), values, arguments
            ),
        )
        return web.json_response(answer)

    async def _progress(self, request: web.Request) -> web.StreamResponse:
        table, query = request.match_info["table"], dict(request.query)
        if "job_uid" not in query:
            raise web.HTTPBadRequest(text="job_uid is required")
        answer = await self._sql(
            request, lambda db: stored_progress(db, table, query["job_uid"], query)
        )
        return web.json_response(answer)

    # -- notebooks ----------------------------------------------------------------------

    def connect(self, check_same_thread: bool = True) -> sqlite3.Connection:
        db = sqlite3.connect(self.db_path, timeout=30, check_same_thread=check_same_thread)
        # WAL: readers (a test, a benchmark polling the output) never block a write.
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    def _thread_db(self) -> sqlite3.Connection:
        """This thread's connection, opened on its first request (kept until :meth:`stop`).

        The HTTP handlers run SQL in worker threads (``asyncio.to_thread``); a
        connection per request cost more than a page's rows.
        """
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self.connect(check_same_thread=False)
            with self._lock:
                self._connections.append(db)
        return db

    def close_connections(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
        for db in connections:
            db.close()
        self._local = threading.local()

    def run_notebook(
        self, notebook: Callable[[sqlite3.Connection, dict[str, str]], str], argv: list[str]
    ) -> NotebookResult:
        db = self._thread_db()
        try:
            return NotebookResult(0, notebook(db, parse_arguments(argv)), "")
        except NotebookFailed as failure:
            # Upstream prints "missing agument ..." on stdout, then dies on the name.
            return NotebookResult(1, f"{failure}\n", traceback.format_exc())
        except Exception:
            return NotebookResult(1, "", traceback.format_exc())
        finally:
            if db.in_transaction:  # a notebook that failed mid-write stores nothing
                db.rollback()

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

    def stored_values(self, table: str) -> list[tuple[int, Any]]:
        """``(counter, prediction)`` of every row, in counter order; JSON text decoded."""
        with contextlib.closing(self.connect()) as db:
            rows = db.execute(
                f"SELECT counter, prediction FROM {identifier(table, 'table name')} "
                "ORDER BY counter"
            ).fetchall()
        return [(int(c), orjson.loads(v) if isinstance(v, str) else v) for c, v in rows]

    def keyed_predictions(self, table: str) -> list[tuple[str, int, int, str, float]]:
        """``(jobuid, shard, counter, rowkey, prediction)`` of keyed rows, in counter order."""
        with contextlib.closing(self.connect()) as db:
            return [
                (str(j), int(s), int(c), str(k), float(v))
                for j, s, c, k, v in db.execute(
                    f"SELECT jobuid, shard, counter, rowkey, prediction FROM "
                    f"{identifier(table, 'table name')} WHERE rowkey IS NOT NULL ORDER BY counter"
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
