"""A real S3 server on loopback: versitygw with its POSIX backend, in a directory.

versitygw (built from its Go module by ``hack/versitygw/build.sh``, cached like
the other Go tools) serves ``<directory>/<bucket>/<key>`` over the S3 API, with
one root user (:data:`ROOT_ACCESS_KEY`, :data:`ROOT_SECRET_KEY`) signing with
AWS Signature V4 in region :data:`REGION`. Its internal IAM service keeps more
accounts in ``<directory>/iam`` (:meth:`S3Server.create_user`, through the
gateway's admin API): an account of role ``user`` may use only the buckets it
owns, so a bucket made here by the root is theirs to be refused. The s3
provider's tests start one per session (``tests/servers.py``, ``s3_server``)
and give each test its own bucket; the demo starts one for ``--storage s3``.
Path-style addressing only.

Run alone: ``python -m hack.s3server [--port N] [--dir D]`` serves until Ctrl-C
and prints its URL and credentials.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hack.cluster import free_port, spawn, stop_process, wait_http

if TYPE_CHECKING:
    from obstore.store import S3Credential, S3Store

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "hack" / "versitygw" / "build.sh"
ROOT_ACCESS_KEY = "ksc-s3-root"
ROOT_SECRET_KEY = "ksc-s3-root-secret-9d4e21"
REGION = "us-east-1"


def versitygw_binary() -> Path:
    """The versitygw binary, built into the cache on first use (``VERSITYGW_BINARY`` wins)."""
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=True
    )
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass
class S3Server:
    """One versitygw process serving ``directory`` on ``127.0.0.1:port``.

    ``cert``/``key`` (PEM files) make it serve HTTPS instead of HTTP.
    """

    directory: Path
    port: int = field(default_factory=free_port)
    cert: Path | None = None
    key: Path | None = None
    log: Path | None = None
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        scheme = "https" if self.cert else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def iam(self) -> Path:
        return self.directory / "iam"

    def start(self, within: float = 60.0) -> S3Server:
        self.data.mkdir(parents=True, exist_ok=True)
        self.iam.mkdir(parents=True, exist_ok=True)
        log = self.log or self.directory / "versitygw.log"
        args = [
            str(versitygw_binary()),
            "--port",
            f"127.0.0.1:{self.port}",
            "--access",
            ROOT_ACCESS_KEY,
            "--secret",
            ROOT_SECRET_KEY,
            "--region",
            REGION,
            "--iam-dir",
            str(self.iam),
        ]
        if self.cert and self.key:
            args += ["--cert", str(self.cert), "--key", str(self.key)]
        args += ["posix", str(self.data)]
        self._process = spawn(args, log, cwd=self.directory)
        if self.cert:
            _wait_tls(self.port, self._process, log, within)
        else:
            # Any answer below 500 (an unsigned request gets 403) means it serves.
            wait_http(f"{self.url}/", self._process, log, within=within)
        return self

    def wait(self) -> None:
        """Until the server exits."""
        if self._process is not None:
            self._process.wait()

    def stop(self) -> None:
        if self._process is not None:
            stop_process(self._process, grace=10)
            self._process = None

    def create_user(self, access: str, secret: str, role: str = "user") -> None:
        """A new IAM account (``versitygw admin create-user``, signed by the root user).

        A ``user`` owns no bucket: every request of theirs to a bucket made by
        :meth:`create_bucket` is refused with ``AccessDenied`` (403).
        """
        args = [str(versitygw_binary()), "admin", "--access", ROOT_ACCESS_KEY]
        args += ["--secret", ROOT_SECRET_KEY, "--region", REGION, "--endpoint-url", self.url]
        if self.cert:
            args.append("--allow-insecure")
        args += ["create-user", "--access", access, "--secret", secret, "--role", role]
        done = subprocess.run(args, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"versitygw admin create-user {access}: {done.stderr.strip()}")

    def create_bucket(self, name: str | None = None) -> str:
        """A new, empty bucket (a fresh name unless given): its directory under the root.

        versitygw's POSIX backend serves each directory of its root as a bucket.
        """
        name = name or f"b-{uuid.uuid4().hex[:12]}"
        (self.data / name).mkdir()
        return name

    def root_store(self, bucket: str) -> S3Store:
        """An obstore client of ``bucket`` as the root user, what tests seed and read with."""
        from obstore.store import S3Store  # the runner's S3 client; only tests need it here

        return S3Store(
            bucket,
            config={"endpoint": self.url, "region": REGION},
            client_options={"allow_http": True},
            credential_provider=_root_credential,
        )


def _root_credential() -> S3Credential:
    return {
        "access_key_id": ROOT_ACCESS_KEY,
        "secret_access_key": ROOT_SECRET_KEY,
        "token": None,
        "expires_at": None,
    }


def _wait_tls(port: int, process: subprocess.Popen[bytes], log: Path, within: float) -> None:
    """Wait until ``port`` accepts connections (an HTTPS server whose CA urllib lacks)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"versitygw exited with {process.returncode}; log: {log}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"versitygw did not listen on {port} within {within}s; log: {log}")


@contextlib.contextmanager
def running_s3(directory: Path | None = None, port: int | None = None) -> Iterator[S3Server]:
    """An :class:`S3Server` for the ``with`` block, in ``directory`` (a temporary one)."""
    with tempfile.TemporaryDirectory(prefix="ksc-s3-") as scratch:
        server = S3Server(directory or Path(scratch), port or free_port())
        server.start()
        try:
            yield server
        finally:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    parser.add_argument("--dir", type=Path, default=None, help="default: a temporary directory")
    args = parser.parse_args(argv)
    with running_s3(args.dir, args.port or None) as server:
        print(f"S3 at {server.url} (region {REGION}, path-style)")
        print(f"AWS_ACCESS_KEY_ID={ROOT_ACCESS_KEY} AWS_SECRET_ACCESS_KEY={ROOT_SECRET_KEY}")
        print(f"buckets are the directories of {server.data}; Ctrl-C stops it", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
