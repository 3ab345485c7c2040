"""What the runner's PostgreSQL tests share.

The Secret, the entry, a storage context, the iris table the runs read
(:func:`seed`) and the contract of a run over it (:func:`contract`).
"""

from __future__ import annotations

from typing import Any

from hack.postgres import SUPERUSER
from hack.storage_service import IRIS_COLUMNS
from runner.logs import get_logger
from runner.retry import Deadline
from runner.storage.base import StorageContext
from tests.runner.conftest import InMemorySecrets, random_iris_rows
from tests.servers import Database

SECRET = "features-db"
NAMESPACE = "data"
JOB = "run-8d2f-uid"


def secrets(db: Database, password: str | None = None) -> InMemorySecrets:
    """The Secret ``NAMESPACE/SECRET`` with ``db``'s superuser (and its password, by default)."""
    return InMemorySecrets(
        {
            (NAMESPACE, SECRET): {
                "username": SUPERUSER,
                "password": db.server.password if password is None else password,
            }
        }
    )


def connection(db: Database, **more: Any) -> dict[str, Any]:
    """A ``postgres`` input or output entry for ``db`` (credentials in the Secret), and ``more``."""
    return {
        "host": db.server.host,
        "port": db.server.port,
        "database": db.name,
        "secretRef": {"name": SECRET, "namespace": NAMESPACE},
        "sslmode": "disable",
        **more,
    }


def context(
    db: Database, *, pod_uid: str = "pod-0", parameters: dict[str, str] | None = None
) -> StorageContext:
    """What a provider of the run ``JOB`` is given in the pod ``pod_uid``: ``db``'s Secret."""
    return StorageContext(
        session=None,
        secrets=secrets(db),
        namespace=NAMESPACE,
        job_id=JOB,
        pod_uid=pod_uid,
        parameters=parameters or {},
        deadline=Deadline(None),
        log=get_logger(),
    )


def seed(
    db: Database, count: int, table: str = "samples", seed_value: int = 3
) -> dict[int, list[float]]:
    """``count`` iris rows whose ids (not their order of insertion) give the order."""
    features = random_iris_rows(count, seed_value)
    ids = [100_000 - 7 * i for i in range(count)]
    columns = ", ".join(f"{c} double precision" for c in IRIS_COLUMNS)
    db.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, {columns}, species text, day date)")
    db.execute(
        f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s, %s, %s)",
        [
            (i, *row, f"s-{i}", "2024-05-01" if i % 2 else "2024-05-02")
            for i, row in zip(ids, features, strict=True)
        ],
    )
    return dict(zip(ids, features, strict=True))


def contract(
    model_url: str,
    db: Database,
    *,
    query: str = "SELECT * FROM samples",
    page_size: int | None = 100,
    table: str = "predictions",
    input_extra: dict[str, Any] | None = None,
    output_extra: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    source: dict[str, Any] = {
        **connection(db),
        "query": query,
        "columns": list(IRIS_COLUMNS),
        "keyColumn": "id",
        "passthroughColumns": ["species"],
    }
    if page_size:
        source["paging"] = {"pageSize": page_size, "key": "id"}
    return {
        "jobId": JOB,
        "jobName": "inf-pg-8d2f",
        "kserve": {"modelUrl": model_url},
        "input": {"postgres": {**source, **(input_extra or {})}},
        "output": {
            "postgres": {
                **connection(db),
                "table": table,
                "createTable": True,
                **(output_extra or {}),
            }
        },
        "batching": {"batchSize": 40, "concurrency": 3},
        **extra,
    }
