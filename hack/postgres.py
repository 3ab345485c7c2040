"""A private PostgreSQL server on loopback, for tests, the demo and the benches.

``python -m hack.postgres prepare [--if-possible]`` installs Debian's
``postgresql`` package when its binaries are missing (as root, the way the
real-node tier installs its packages: ``apt-get install``, ``apt-get update``
first only when that fails, under a lock). ``python -m hack.postgres serve
--port P --password PW`` runs a throwaway server in the foreground.

:class:`PostgresServer` is the importable form: ``initdb`` of a fresh cluster in
a temporary directory, then ``postgres`` listening on ``127.0.0.1`` only (no Unix
socket outside the cluster's directory), TCP connections authenticated with
SCRAM against the superuser ``postgres`` and a generated password; given a
certificate and key (``tls``), it accepts TLS as well as plain connections. PostgreSQL
refuses to run as root: under root both commands run as the unprivileged
``nobody`` user (``setpriv``), the cluster's directory handed to it.

Tests use one server per session (``postgres`` fixture, tests/runner/conftest.py)
and a database of their own each (:meth:`PostgresServer.create_database`).
:meth:`PostgresServer.restart` stops it (fast shutdown: sessions are cut) and
starts it again on the same port and data, as a database restart mid-run does.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from hack.cluster import free_port, stop_process

PACKAGE = "postgresql"
LIB = Path("/usr/lib/postgresql")
SUPERUSER = "postgres"
UNPRIVILEGED = "nobody"
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


class PostgresUnavailable(RuntimeError):
    """PostgreSQL cannot run here; the message says what is missing."""


def bin_dir() -> Path | None:
    """The newest installed server's ``bin`` (``/usr/lib/postgresql/<major>/bin``), if any."""
    found = [p for p in LIB.glob("*/bin") if (p / "postgres").is_file() and p.parent.name.isdigit()]
    return max(found, key=lambda p: int(p.parent.name)) if found else None


def prepare() -> Path:
    """The server's ``bin`` directory, installing Debian's package first if it is missing."""
    found = bin_dir()
    if found is not None:
        return found
    if os.geteuid() != 0:
        raise PostgresUnavailable(
            f"PostgreSQL is not installed (run as root, or: sudo apt-get install {PACKAGE})"
        )
    if shutil.which("apt-get") is None:
        raise PostgresUnavailable(f"PostgreSQL is not installed and there is no apt-get: {PACKAGE}")
    print(f"postgres: installing {PACKAGE}", file=sys.stderr)
    install = f"apt-get install -y -q --no-install-recommends {PACKAGE} >&2"
    script = (
        "exec 9>/var/lib/dpkg/ksc-postgres.lock; flock 9; export DEBIAN_FRONTEND=noninteractive; "
        f"{install} || {{ apt-get update -q >&2 && {install}; }}"
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    found = bin_dir()
    if done.returncode != 0 or found is None:
        raise PostgresUnavailable(f"installing {PACKAGE} failed: {done.stderr.strip()[-2000:]}")
    return found


def _as_user() -> tuple[list[str], int | None, int | None]:
    """The command prefix, uid and gid to run the server with: ``nobody`` under root."""
    if os.geteuid() != 0:
        return [], None, None
    user = pwd.getpwnam(UNPRIVILEGED)
    prefix = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
    return prefix, user.pw_uid, user.pw_gid


class PostgresServer:
    """One throwaway cluster on ``127.0.0.1:port`` (module docstring)."""

    def __init__(
        self,
        root: Path | None = None,
        port: int | None = None,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        """``tls``: a server certificate and its key; the server then also accepts TLS."""
        self.bin = prepare()
        self.tls = tls
        self.root = Path(root or tempfile.mkdtemp(prefix="ksc-postgres-"))
        self.port = port or free_port()
        self.password = secrets.token_urlsafe(18)
        self.host = "127.0.0.1"
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._prefix, self._uid, self._gid = _as_user()

    # -- lifecycle ----------------------------------------------------------------------

    def _own(self, path: Path) -> None:
        if self._uid is not None and self._gid is not None:
            os.chown(path, self._uid, self._gid)

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._own(self.root)
        password_file = self.root / "pwfile"
        password_file.write_text(self.password + "\n")
        password_file.chmod(0o600)
        self._own(password_file)
        done = subprocess.run(
            [
                *self._prefix,
                str(self.bin / "initdb"),
                f"--pgdata={self.data}",
                f"--username={SUPERUSER}",
                f"--pwfile={password_file}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            cwd=self.root,
        )
        password_file.unlink()
        if done.returncode != 0:
            raise PostgresUnavailable(f"initdb failed: {(done.stderr or done.stdout)[-2000:]}")

    def _tls_settings(self) -> list[str]:
        """``-c`` settings for TLS; the files copied where (and as whom) the server reads them."""
        if self.tls is None:
            return []
        settings = ["ssl=on"]
        for (name, source), setting in zip(
            (("server.crt", self.tls[0]), ("server.key", self.tls[1])),
            ("ssl_cert_file", "ssl_key_file"),
            strict=True,
        ):
            target = self.root / name
            shutil.copyfile(source, target)
            target.chmod(0o600)
            self._own(target)
            settings.append(f"{setting}={target}")
        return settings

    def start(self, within: float = 60.0) -> PostgresServer:
        if not (self.data / "PG_VERSION").exists():
            self.init()
        tls = [arg for setting in self._tls_settings() for arg in ("-c", setting)]
        out = self.log.open("ab")
        try:
            self._process = subprocess.Popen(
                [
                    *self._prefix,
                    str(self.bin / "postgres"),
                    "-D",
                    str(self.data),
                    "-p",
                    str(self.port),
                    "-c",
                    f"listen_addresses={self.host}",
                    "-c",
                    f"unix_socket_directories={self.root}",
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=200",
                    *tls,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.root,
                start_new_session=True,
            )
        finally:
            out.close()
        self._wait_ready(within)
        return self

    def _wait_ready(self, within: float) -> None:
        deadline = time.monotonic() + within
        while True:
            if self._process is not None and self._process.poll() is not None:
                raise PostgresUnavailable(
                    f"postgres exited with {self._process.returncode}: {self.log_tail()}"
                )
            try:
                with self.connect():
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise PostgresUnavailable(
                        f"postgres not ready within {within:.0f}s: {self.log_tail()}"
                    ) from None
                time.sleep(0.1)

    def log_tail(self, size: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-size:] if self.log.exists() else ""

    def stop(self, grace: float = 30.0) -> None:
        """Fast shutdown (SIGINT): open sessions are cut, the data is kept."""
        process, self._process = self._process, None
        if process is not None:
            stop_process(process, grace, sig=signal.SIGINT)

    def restart(self) -> None:
        """Stop (cutting every session) and start again on the same port and data."""
        self.stop()
        self.start()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- use --------------------------------------------------------------------------

    def conninfo(self, database: str = "postgres", user: str = SUPERUSER) -> dict[str, str]:
        return {
            "host": self.host,
            "port": str(self.port),
            "dbname": database,
            "user": user,
            "password": self.password,
        }

    def connect(self, database: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        info = make_conninfo(**self.conninfo(database), connect_timeout=5)
        return psycopg.connect(info, autocommit=True)

    def create_database(self, name: str) -> str:
        """A new empty database ``name`` (dropped first if it exists)."""
        if not _NAME.match(name):
            raise ValueError(f"database name {name!r}: expected [a-z_][a-z0-9_]*")
        with self.connect() as db:
            db.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            db.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    def execute(self, database: str, statement: str, rows: Sequence[Sequence[object]] = ()) -> None:
        """``statement`` once, or once per row of ``rows`` (test and demo seeding)."""
        with self.connect(database) as db, db.cursor() as cursor:
            if rows:
                cursor.executemany(statement, rows)
            else:
                cursor.execute(statement)

    def query(self, database: str, statement: str) -> list[tuple[object, ...]]:
        with self.connect(database) as db:
            return db.execute(statement).fetchall()


@contextlib.contextmanager
def running(root: Path | None = None) -> Iterator[PostgresServer]:
    server = PostgresServer(root)
    server.start()
    try:
        yield server
    finally:
        server.remove()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.postgres", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    ready = commands.add_parser("prepare", help="install Debian's postgresql if it is missing")
    ready.add_argument(
        "--if-possible", action="store_true", help="say why instead of failing (not under CI)"
    )
    serve = commands.add_parser("serve", help="a throwaway server in the foreground")
    serve.add_argument("--port", type=int, default=0)
    serve.add_argument("--password", help="the superuser's password (default: generated)")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        try:
            print(prepare())
        except PostgresUnavailable as error:
            if args.if_possible and os.environ.get("CI") != "true":
                print(f"postgres: {error}; the PostgreSQL tests will fail", file=sys.stderr)
                return 0
            print(f"postgres: {error}", file=sys.stderr)
            return 1
        return 0
    server = PostgresServer(port=args.port or None)
    if args.password:
        server.password = args.password
    with contextlib.suppress(KeyboardInterrupt):
        server.start()
        print(f"postgres on {server.host}:{server.port} user {SUPERUSER}", flush=True)
        while True:
            time.sleep(3600)
    server.remove()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
