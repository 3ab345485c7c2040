"""What the runner's PostgreSQL tests connect with: the secret, the entry, a storage context."""

from __future__ import annotations

from typing import Any

from hack.postgres import SUPERUSER
from runner.logs import get_logger
from runner.retry import Deadline
from runner.storage.base import StorageContext
from tests.runner.conftest import InMemorySecrets
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
