"""``make demo``: the whole system end to end on a local control plane.

1. Starts the control plane and the node agent (``hack.cluster``).
2. Starts KServe's own model server with an iris model trained on the spot
   (``hack.model_server``) and the finops-database-handler look-alike
   (``hack.storage_service``) seeded with the iris rows.
3. Installs the CRDs and the Helm chart's RBAC, and starts the controller as
   the chart's ServiceAccount, watching the ``inference-demo`` namespace.
4. Applies ``examples/iris-oneshot.yaml`` unchanged but for the two addresses a
   laptop has instead of cluster DNS (model URL; the endpoint Secret points at
   the loopback storage service), waits for the run, and prints what a user
   would look at: ``kubectl get infrun``, its status, the stored predictions.
5. Tears everything down, unless ``--keep``.

``--storage postgres`` (``make demo DEMO_ARGS=--storage postgres``) runs
``examples/postgres.yaml`` instead, against a private PostgreSQL server
(``hack.postgres``) seeded with the iris rows: features read by a ``SELECT``,
predictions stored once per row beside its ``id``, the first ones printed.

``--storage s3`` (``make demo DEMO_ARGS=--storage s3``) runs
``examples/s3-parquet.yaml`` against a real S3 server (versitygw, ``hack.s3server``)
whose bucket holds the iris rows as Parquet: two shards read every other row
group, write Parquet chunks and their manifests, and the first stored
predictions are printed from the objects.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hack import chart
from hack.cluster import (
    REPO,
    LocalCluster,
    free_port,
    running_cluster,
    spawn,
    stop_process,
    wait_http,
)
from hack.crds import install_crds
from hack.postgres import SUPERUSER, PostgresServer
from hack.postgres import running as postgres_running
from hack.s3server import ROOT_ACCESS_KEY, ROOT_SECRET_KEY, S3Server, running_s3

NAMESPACE = "inference-demo"
SECRET_NAMESPACE = "krateo-system"
SECRET = "finops-database-handler-endpoint"
STORAGE_USER, STORAGE_PASSWORD = "finops", "demo-only-password"
INPUT_TABLE = "kserve_controller_input"
OUTPUT_TABLE = "kserve_controller_output"
PG_DATABASE = "features"
PG_SECRET_NAMESPACE, PG_SECRET = "analytics", "features-db"
PG_DAY = "2024-05-01"
S3_BUCKET, S3_SECRET = "ml-data", "s3-credentials"
S3_INPUT, S3_OUTPUT = "features/iris/", "predictions/iris/"


@dataclass(frozen=True)
class DemoStorage:
    """What the demo applies and shows for one kind of storage."""

    example: str
    config: str
    run: str
    secret_namespace: str
    secret: str


STORAGES = {
    "krateo": DemoStorage(
        "iris-oneshot.yaml", "iris-inference-config", "iris-once", SECRET_NAMESPACE, SECRET
    ),
    "postgres": DemoStorage(
        "postgres.yaml", "iris-postgres-config", "iris-postgres-daily", PG_SECRET_NAMESPACE,
        PG_SECRET,
    ),
    # The example's s3 Secret has no namespace: the run's own.
    "s3": DemoStorage("s3-parquet.yaml", "iris-s3-config", "iris-s3", NAMESPACE, S3_SECRET),
}  # fmt: skip


def step(message: str) -> None:
    print(f"\n==> {message}", flush=True)


@contextlib.contextmanager
def process(args: list[str], log: Path, ready_url: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = spawn(args, log, cwd=REPO)
    try:
        wait_http(ready_url, proc, log)
        yield proc
    finally:
        stop_process(proc)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def demo_manifests(
    model_port: int,
    example: str = "iris-oneshot.yaml",
    postgres: PostgresServer | None = None,
    s3: S3Server | None = None,
) -> list[dict[str, Any]]:
    """``examples/<example>``, with the model (and the database or bucket) reachable here."""
    docs = list(yaml.safe_load_all((REPO / "examples" / example).read_text()))
    for doc in docs:
        if doc["kind"] == "InferenceConfig":
            doc["spec"]["kserve"]["modelUrl"] = (
                f"127.0.0.1:{model_port}/v2/models/sklearn-iris/infer"
            )
            for entry in doc["spec"]["storage"].values():
                if postgres is not None and "postgres" in entry:
                    entry["postgres"].update(
                        host=postgres.host, port=postgres.port, database=PG_DATABASE,
                        sslmode="disable",
                    )  # fmt: skip
                if s3 is not None and "s3" in entry:
                    entry["s3"]["endpointUrl"] = s3.url
    return docs


def seed_postgres(server: PostgresServer) -> None:
    """The iris rows as examples/postgres.yaml's ``iris_samples``, ids not in row order."""
    from sklearn.datasets import load_iris

    server.create_database(PG_DATABASE)
    server.execute(
        PG_DATABASE,
        "CREATE TABLE iris_samples (id bigint PRIMARY KEY, sepal_length float8, "
        "sepal_width float8, petal_length float8, petal_width float8, species text, "
        "sampled_on date)",
    )
    iris = load_iris()
    server.execute(
        PG_DATABASE,
        "INSERT INTO iris_samples VALUES (%s, %s, %s, %s, %s, %s, %s)",
        [
            (1000 + 7 * ((i * 37) % 150), *map(float, row), str(iris.target_names[t]), PG_DAY)
            for i, (row, t) in enumerate(zip(iris.data, iris.target, strict=True))
        ],
    )


def seed_s3(server: S3Server, row_group: int = 25) -> None:
    """The iris rows as Parquet objects under examples/s3-parquet.yaml's input prefix.

    Two objects of 75 rows in row groups of 25: six row groups, three per shard.
    Written straight into versitygw's directory, which its POSIX backend serves.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sklearn.datasets import load_iris

    iris = load_iris()
    names = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
    server.create_bucket(S3_BUCKET)
    folder = server.data / S3_BUCKET / S3_INPUT
    folder.mkdir(parents=True)
    for number, start in enumerate((0, 75)):
        rows = iris.data[start : start + 75]
        table = pa.table({name: rows[:, i] for i, name in enumerate(names)})
        pq.write_table(table, folder / f"part-{number}.parquet", row_group_size=row_group)


def s3_secret() -> dict[str, Any]:
    """The Secret examples/s3-parquet.yaml names: the S3 server's access key and secret."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": S3_SECRET, "namespace": NAMESPACE},
        "data": {
            "AWS_ACCESS_KEY_ID": b64(ROOT_ACCESS_KEY),
            "AWS_SECRET_ACCESS_KEY": b64(ROOT_SECRET_KEY),
        },
    }


def print_s3_predictions(server: S3Server, run_uid: str, limit: int = 10) -> None:
    """The run's manifest, then the first rows of its first chunks (read as a user would)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = server.data / S3_BUCKET
    manifest = json.loads((root / S3_OUTPUT / run_uid / "_manifest.json").read_text())
    keys = [part["key"] for part in manifest["parts"]]
    print(f"s3://{S3_BUCKET}/{S3_OUTPUT}{run_uid}/_manifest.json: {manifest['rows']} rows")
    for key in keys:
        print(f"  s3://{S3_BUCKET}/{key}")
    tables = [pq.read_table(io.BytesIO((root / key).read_bytes())) for key in keys]
    every = pa.concat_tables(tables)
    classes = every.column("prediction").value_counts().to_pylist()
    counted = ", ".join(f"class {c['values']}: {c['counts']}" for c in classes)
    print(f"{every.num_rows} predictions in {len(keys)} chunk(s) ({counted})")
    table = every.slice(0, limit)
    print(f"the first {table.num_rows} predictions:")
    print(f"  {'shard':>5}  {'row':>4}  prediction")
    for shard, row, prediction in zip(
        *(table.column(c).to_pylist() for c in ("shard", "row", "prediction")), strict=True
    ):
        print(f"  {shard:>5}  {row:>4}  {prediction}")


def postgres_secret(server: PostgresServer) -> dict[str, Any]:
    """The Secret examples/postgres.yaml names: the database's user and password."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": PG_SECRET, "namespace": PG_SECRET_NAMESPACE},
        "data": {"username": b64(SUPERUSER), "password": b64(server.password)},
    }


def print_postgres_predictions(server: PostgresServer, limit: int = 10) -> None:
    ((total,),) = server.query(PG_DATABASE, "SELECT count(*) FROM iris_predictions")
    rows = server.query(
        PG_DATABASE,
        "SELECT shard, row_index, id, species, prediction FROM iris_predictions "
        f"ORDER BY row_index LIMIT {int(limit)}",
    )
    print(f"{total} predictions stored in iris_predictions; the first {len(rows)}:")
    print(f"  {'shard':>5}  {'row_index':>9}  {'id':>6}  {'species':12}  prediction")
    for shard, row_index, key, species, prediction in rows:
        print(f"  {shard:>5}  {row_index:>9}  {key:>6}  {species!s:12}  {prediction}")


def setup_rbac(cluster: LocalCluster, workdir: Path, storage: DemoStorage) -> Path:
    """The chart's RBAC for the demo namespace; returns the controller's kubeconfig."""
    access = [{"namespace": storage.secret_namespace, "secretNames": [storage.secret]}]
    values = {"runner": {"extraSecretAccess": access}}
    objects = chart.controller_rbac_objects(NAMESPACE, [NAMESPACE], values=values)
    chart.apply(cluster, objects)
    return chart.service_account_kubeconfig(
        cluster, NAMESPACE, path=workdir / "controller.kubeconfig"
    )


def print_predictions(db: Path, limit: int = 10) -> None:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        total = conn.execute(f"SELECT COUNT(*) FROM {OUTPUT_TABLE}").fetchone()[0]
        rows = conn.execute(
            f"SELECT jobuid, poduid, prediction, counter FROM {OUTPUT_TABLE} "
            "ORDER BY counter LIMIT ?",
            (limit,),
        ).fetchall()
    print(f"{total} predictions stored in {OUTPUT_TABLE}; the first {len(rows)}:")
    print(f"  {'jobuid':36}  {'poduid':36}  prediction  counter")
    for job, pod, prediction, counter in rows:
        print(f"  {job:36}  {pod:36}  {prediction:10}  {counter:7}")


@dataclass(frozen=True)
class DemoServers:
    model_port: int
    storage_port: int
    db: Path


@contextlib.contextmanager
def demo_servers(workdir: Path) -> Iterator[DemoServers]:
    """KServe's model server (iris) and the storage service seeded with iris, on loopback."""
    servers = DemoServers(free_port(), free_port(), workdir / "storage.sqlite")
    step("starting KServe's model server (iris, trained now) and the storage service")
    model_cmd = [sys.executable, "-m", "hack.model_server", "--port", str(servers.model_port)]
    storage_cmd = [
        sys.executable, "-m", "hack.storage_service", "--port", str(servers.storage_port),
        "--db", str(servers.db), "--user", STORAGE_USER, "--password", STORAGE_PASSWORD,
        "--seed-iris", INPUT_TABLE,
    ]  # fmt: skip
    model_ready = f"http://127.0.0.1:{servers.model_port}/v2/health/ready"
    storage_ready = f"http://127.0.0.1:{servers.storage_port}/"
    with (
        process(model_cmd, workdir / "model-server.log", model_ready),
        process(storage_cmd, workdir / "storage.log", storage_ready),
    ):
        yield servers


def endpoint_secret(storage_port: int) -> dict[str, Any]:
    """The finops-database-handler endpoint Secret the example's config names."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": SECRET_NAMESPACE},
        "data": {
            "server-url": b64(f"http://127.0.0.1:{storage_port}"),
            "username": b64(STORAGE_USER),
            "password": b64(STORAGE_PASSWORD),
        },
    }


def apply_and_complete(
    cluster: LocalCluster, manifests: list[dict[str, Any]], timeout: str, run: str = "iris-once"
) -> None:
    """Apply the demo's manifests (showing kubectl's answer); wait until its run is Complete."""
    applied = cluster.kubectl(
        "apply", "-n", NAMESPACE, "-f", "-", input=yaml.safe_dump_all(manifests)
    )
    print(applied.stdout)
    cluster.kubectl(
        "wait", "-n", NAMESPACE, "--for=condition=Complete", f"infrun/{run}",
        f"--timeout={timeout}",
    )  # fmt: skip


def run_demo(cluster: LocalCluster, workdir: Path, keep: bool, storage: str = "krateo") -> None:
    with contextlib.ExitStack() as stack:
        postgres, s3 = None, None
        if storage == "s3":
            step("starting a real S3 server (versitygw, hack.s3server), iris as Parquet")
            s3 = stack.enter_context(running_s3())
            seed_s3(s3)
        if storage == "postgres":
            step("starting a private PostgreSQL server (hack.postgres), seeded with iris")
            # Its own temporary directory (the server's user could not enter the demo's).
            postgres = stack.enter_context(postgres_running())
            seed_postgres(postgres)
        _run_demo(cluster, workdir, keep, STORAGES[storage], postgres, s3)


def _run_demo(
    cluster: LocalCluster,
    workdir: Path,
    keep: bool,
    storage: DemoStorage,
    postgres: PostgresServer | None,
    s3: S3Server | None = None,
) -> None:
    kubectl = cluster.kubectl
    with demo_servers(workdir) as servers:
        model_port, db = servers.model_port, servers.db
        step("installing the CRDs and the chart's RBAC")
        install_crds(cluster)
        for ns in sorted({NAMESPACE, storage.secret_namespace}):
            kubectl("create", "namespace", ns)
        kubeconfig = setup_rbac(cluster, workdir, storage)
        secret = endpoint_secret(servers.storage_port)
        if postgres is not None:
            secret = postgres_secret(postgres)
        if s3 is not None:
            secret = s3_secret()
        kubectl("apply", "-f", "-", input=json.dumps(secret))

        step("starting the controller (python -m controller) as the chart's ServiceAccount")
        env = {
            "PATH": "/usr/bin:/bin",
            "KUBECONFIG": str(kubeconfig),
            "WATCH_NAMESPACE": NAMESPACE,
            "RUNNER_SERVICE_ACCOUNT": chart.RUNNER_SERVICE_ACCOUNT,
            "POLLING_INTERVAL": "1m",
            "HEALTH_PORT": str(free_port()),
            "METRICS_PORT": str(free_port()),
            "BIND_ADDRESS": "127.0.0.1",
            "LOG_FORMAT": "json",
        }
        controller_log = workdir / "controller.log"
        controller = spawn([sys.executable, "-m", "controller"], controller_log, env=env, cwd=REPO)
        try:
            wait_http(f"http://127.0.0.1:{env['HEALTH_PORT']}/readyz", controller, controller_log)
            step(f"kubectl apply -f examples/{storage.example} (addresses pointed at loopback)")
            manifests = demo_manifests(model_port, storage.example, postgres, s3)
            apply_and_complete(cluster, manifests, timeout="180s", run=storage.run)
            step("kubectl get infrun")
            print(kubectl("get", "infrun", "-n", NAMESPACE, "-o", "wide").stdout)
            # The config's live probe (a short Job running the runner's --check)
            # runs beside the run; wait for its verdict before showing it.
            kubectl(
                "wait", "-n", NAMESPACE, "--for=jsonpath={.status.lastProbeTime}",
                f"infcfg/{storage.config}", "--timeout=60s",
            )  # fmt: skip
            step("kubectl get infcfg (READY: usable as written; PROBED: Secrets, storage, model)")
            print(kubectl("get", "infcfg", "-n", NAMESPACE, "-o", "wide").stdout)
            run = json.loads(
                kubectl("get", "infrun", storage.run, "-n", NAMESPACE, "-o", "json").stdout
            )
            status = run["status"]
            step("the run's status")
            summary = {
                k: status.get(k)
                for k in ("phase", "result", "progress", "startTime", "completionTime", "jobStatus")
            }
            print(yaml.safe_dump(summary, sort_keys=False))
            step("events")
            print(kubectl("events", "-n", NAMESPACE, "--for", f"infrun/{storage.run}").stdout)
            if postgres is not None:
                step("stored predictions (the PostgreSQL table, keyed to the input's id)")
                print_postgres_predictions(postgres)
            elif s3 is not None:
                step("stored predictions (Parquet objects in the bucket, under the run's uid)")
                print_s3_predictions(s3, run["metadata"]["uid"])
            else:
                step("stored predictions (the storage service's database)")
                print_predictions(db)
            if keep:
                step("still running: try it yourself (Ctrl-C stops everything)")
                print(f"  export KUBECONFIG={cluster.kubeconfig}")
                print(f"  alias kubectl={cluster.bin_dir / 'kubectl'}")
                print(f"  kubectl get infrun,infcfg,jobs,pods -n {NAMESPACE}")
                print(f"  logs: controller {controller_log}, cluster {cluster.log_dir}", flush=True)
                with contextlib.suppress(KeyboardInterrupt):
                    while controller.poll() is None:
                        time.sleep(1)
        except BaseException:
            print(f"--- controller log (last lines) ---\n{controller_log.read_text()[-4000:]}")
            raise
        finally:
            stop_process(controller)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep everything running until Ctrl-C")
    parser.add_argument(
        "--storage",
        choices=sorted(STORAGES),
        default="krateo",
        help="krateo: examples/iris-oneshot.yaml on the storage look-alike (default); "
        "postgres: examples/postgres.yaml on a private PostgreSQL server; "
        "s3: examples/s3-parquet.yaml on a real S3 server (versitygw)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ksc-demo-") as tmp, running_cluster() as cluster:
        print(f"control plane up in {time.monotonic() - started:.1f}s at {cluster.server}")
        run_demo(cluster, Path(tmp), args.keep, args.storage)
    print(f"\ndemo finished in {time.monotonic() - started:.1f}s; everything stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
