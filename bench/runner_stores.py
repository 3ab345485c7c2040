"""The runner against real object storage and a real database (``runner_throughput --storage``).

``python -m bench.runner_throughput --storage s3`` (or ``postgres``) runs the same
parts as the ``http`` mode, against servers this module starts on loopback:

- **s3**: versitygw (:mod:`hack.s3server`, POSIX backend in a temporary
  directory). Input: ``--rows`` iris rows with an ``id`` column as Parquet
  objects of at most 1,000,000 rows in row groups of ``--page-size`` rows
  (shards split by row group); output: Parquet chunks under ``out/``.
- **postgres**: a private PostgreSQL (:mod:`hack.postgres`). Input: a table
  ``samples (id bigint primary key, 4 double precision columns)`` read by keyset
  paging on ``id``; output: a table created by the runner (``createTable``),
  ``COPY`` then ``INSERT ... ON CONFLICT DO NOTHING``.

Both runs use ``columns`` (the four features) and ``keyColumn: id``, so every
stored prediction carries its input row's key. Checked after each run, from the
store itself: rows stored, distinct ``(shard, row)`` keys, positions.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hack.storage_service import IRIS_COLUMNS

SECRET = {"name": "store", "namespace": "bench"}
OBJECT_ROWS = 1_000_000


def iris_columns(start: int, count: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    low, high = np.array([4.3, 2.0, 1.0, 0.1]), np.array([7.9, 4.4, 6.9, 2.5])
    values = rng.uniform(low, high, size=(count, 4)).round(1)
    return {
        "id": np.arange(start, start + count, dtype=np.int64),
        **{name: values[:, i] for i, name in enumerate(IRIS_COLUMNS)},
    }


def join_keys() -> dict[str, Any]:
    return {"columns": list(IRIS_COLUMNS), "keyColumn": "id"}


@dataclass
class S3Store:
    """versitygw with one bucket: Parquet input under ``in/``, outputs under ``<name>/``."""

    workdir: Path
    server: Any = None
    bucket: str = "bench"
    secret: dict[str, str] = field(default_factory=dict)

    @contextlib.contextmanager
    def running(self) -> Iterator[S3Store]:
        from hack.s3server import ROOT_ACCESS_KEY, ROOT_SECRET_KEY, S3Server

        self.server = S3Server(self.workdir / "s3").start()
        self.server.create_bucket(self.bucket)
        self.secret = {
            "AWS_ACCESS_KEY_ID": ROOT_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": ROOT_SECRET_KEY,
        }
        try:
            yield self
        finally:
            self.server.stop()

    def _client(self) -> Any:
        from obstore.store import S3Store as Client

        from hack.s3server import REGION

        return Client(
            self.bucket,
            config={
                "endpoint": self.server.url,
                "region": REGION,
                "access_key_id": self.secret["AWS_ACCESS_KEY_ID"],
                "secret_access_key": self.secret["AWS_SECRET_ACCESS_KEY"],
            },
            client_options={"allow_http": True},
        )

    def seed(self, rows: int, row_group: int) -> None:
        import obstore

        client = self._client()
        rng = np.random.default_rng(1)
        for number, start in enumerate(range(0, rows, OBJECT_ROWS)):
            table = pa.table(iris_columns(start, min(OBJECT_ROWS, rows - start), rng))
            sink = pa.BufferOutputStream()
            pq.write_table(table, sink, row_group_size=row_group)
            obstore.put(client, f"in/part-{number:05d}.parquet", bytes(sink.getvalue()))

    def entry(self, **settings: Any) -> dict[str, Any]:
        from hack.s3server import REGION

        return {
            "s3": {
                "bucket": self.bucket,
                "endpointUrl": self.server.url,
                "region": REGION,
                "secretRef": SECRET,
                **settings,
            }
        }

    def input(self, page_size: int, pages_in_flight: int) -> dict[str, Any]:
        paging = {"pageSize": page_size, "pagesInFlight": pages_in_flight}
        entry = self.entry(prefix="in/", format="parquet", paging=paging)
        entry["s3"].update(join_keys())
        return entry

    def output(self, name: str) -> dict[str, Any]:
        return self.entry(prefix=f"{name}/", format="parquet")

    def _chunks(self, name: str) -> list[Path]:
        root = self.server.data / self.bucket / name
        if not root.exists():
            return []
        return [
            path
            for path in root.rglob("*.parquet")
            if path.is_file() and not path.name.startswith(("_", "."))
        ]

    def stored_so_far(self, name: str) -> int:
        """Rows in the chunk objects stored so far (their names say how many)."""
        from runner.storage._s3layout import parse_chunk

        total = 0
        for path in self._chunks(name):
            chunk = parse_chunk(path.name)
            total += chunk.rows if chunk is not None else 0
        return total

    def stored(self, name: str) -> dict[str, int]:
        wanted = ["shard", "row", "id"]
        tables = [pq.read_table(path, columns=wanted) for path in self._chunks(name)]
        if not tables:
            return {"count": 0, "keys": 0, "ids": 0, "min": -1, "max": -1}
        table = pa.concat_tables(tables)
        ids = table.column("id").to_numpy()
        keys = np.unique(
            table.column("shard").to_numpy().astype(np.int64) << 40 | table.column("row").to_numpy()
        )
        return {
            "count": table.num_rows,
            "keys": len(keys),
            "ids": len(np.unique(ids)),
            "min": int(ids.min()),
            "max": int(ids.max()),
        }


@dataclass
class PostgresStore:
    """A private PostgreSQL: input table ``samples``, output tables made by the runner."""

    workdir: Path
    server: Any = None
    database: str = "bench"
    secret: dict[str, str] = field(default_factory=dict)

    @contextlib.contextmanager
    def running(self) -> Iterator[PostgresStore]:
        from hack.postgres import SUPERUSER, PostgresServer

        # Its own directory: under root the server runs as nobody, who cannot enter workdir.
        self.server = PostgresServer().start()
        self.server.create_database(self.database)
        self.secret = {"username": SUPERUSER, "password": self.server.password}
        try:
            yield self
        finally:
            self.server.remove()

    def seed(self, rows: int, row_group: int) -> None:
        columns = ", ".join(f"{c} double precision" for c in IRIS_COLUMNS)
        rng = np.random.default_rng(1)
        with self.server.connect(self.database) as db:
            db.execute(f"CREATE TABLE samples (id bigint PRIMARY KEY, {columns})")
            for start in range(0, rows, OBJECT_ROWS):
                batch = iris_columns(start, min(OBJECT_ROWS, rows - start), rng)
                with db.cursor().copy("COPY samples FROM STDIN") as copy:
                    for row in zip(*(batch[name].tolist() for name in batch), strict=True):
                        copy.write_row(row)
            db.execute("VACUUM ANALYZE samples")

    def entry(self, **settings: Any) -> dict[str, Any]:
        return {
            "postgres": {
                "host": self.server.host,
                "port": self.server.port,
                "database": self.database,
                "secretRef": SECRET,
                "sslmode": "disable",
                **settings,
            }
        }

    def input(self, page_size: int, pages_in_flight: int) -> dict[str, Any]:
        paging = {"pageSize": page_size, "key": "id", "pagesInFlight": pages_in_flight}
        return self.entry(query="SELECT * FROM samples", paging=paging, **join_keys())

    def output(self, name: str) -> dict[str, Any]:
        return self.entry(table=name, createTable=True)

    def _query(self, statement: str) -> list[tuple[Any, ...]]:
        try:
            found: list[tuple[Any, ...]] = self.server.query(self.database, statement)
            return found
        except Exception as error:  # the table does not exist yet
            if "does not exist" in str(error):
                return []
            raise

    def stored_so_far(self, name: str) -> int:
        found = self._query(f"SELECT coalesce(max(row_index) + 1, 0) FROM {name} WHERE shard = 0")
        return int(found[0][0]) if found else 0

    def stored(self, name: str) -> dict[str, int]:
        found = self._query(
            f"SELECT count(*), count(DISTINCT (shard, row_index)), count(DISTINCT id), "
            f"min(id), max(id) FROM {name}"
        )
        count, keys, ids, low, high = found[0] if found else (0, 0, 0, -1, -1)
        return {"count": count, "keys": keys, "ids": ids, "min": low, "max": high}


def store_for(kind: str, workdir: Path) -> S3Store | PostgresStore:
    if kind == "s3":
        return S3Store(workdir)
    if kind == "postgres":
        return PostgresStore(workdir)
    raise ValueError(f"unknown storage {kind!r}")


def wait_stored(store: S3Store | PostgresStore, name: str, rows: int, process: Any) -> int:
    """Poll until ``rows`` are stored in ``name`` (the kill's trigger); the count seen."""
    while (done := store.stored_so_far(name)) < rows:
        if process.poll() is not None:
            raise RuntimeError(f"the runner ended ({process.returncode}) before the kill")
        time.sleep(0.05)
    return done
