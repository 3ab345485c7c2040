"""Python programs started by forking a process that has already imported them.

The tests start ``python -m controller`` about 165 times in a suite run, and
each start spent ~1.3 of its ~1.6 CPU-seconds importing (the controller,
aiohttp, pydantic, kubernetes_asyncio for its kubeconfig loader) before it did
anything: the controllers took ~4 CPU-minutes of a suite run, forked ~1. A fork server
imports them once per test process; each program is then a ``fork()`` of it
that runs the module as ``python -m`` would (``runpy``, as ``__main__``, with
its own argv, environment, working directory, log and session).

What a forked program does not get is what the interpreter reads only when it
starts: ``PYTHON*`` variables (``PYTHONHASHSEED``, ``PYTHONWARNINGS``...) and
``-X`` options. :meth:`ForkServer.start_module` refuses an environment with
``PYTHON*`` variables, so a caller needing them execs instead.

The server (``python -m hack.forkserver SOCKET MODULE...``) is one thread: it
accepts a connection per program, forks, answers the child's pid, and when
the child exits answers its exit status (``subprocess``'s convention: the
negative signal number if a signal ended it) and closes the connection. Each
child asks the kernel to SIGKILL it when the server dies, and the server is
:func:`hack.cluster.spawn`-ed, so it dies with the test process: nothing
outlives the test run.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import runpy
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1
# What a killed server leaves its children: PR_SET_PDEATHSIG's signal.
_KILLED_WITH_SERVER = -signal.SIGKILL


@dataclass(frozen=True)
class Request:
    """One program to run: ``python -m module *args`` in ``cwd`` with exactly ``env``."""

    module: str
    args: list[str]
    env: dict[str, str]
    cwd: str
    log: str

    def encode(self) -> bytes:
        return json.dumps(self.__dict__).encode() + b"\n"

    @classmethod
    def decode(cls, line: bytes) -> Request:
        return cls(**json.loads(line))


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def serve(path: str, preload: Sequence[str]) -> Request:
    """Import ``preload``, then fork a child per connection to ``path``; returns only in a child.

    The parent never returns: it runs until it is killed (by
    :meth:`ForkServer.stop` or with the process that spawned it).
    """
    for module in preload:
        importlib.import_module(module)
    # A child's buffered output would otherwise be written twice, by it and by us.
    sys.stdout.flush()
    sys.stderr.flush()
    children: dict[int, socket.socket] = {}
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    # The wakeup fd is written only for a signal with a Python handler.
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w)
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener,
        selectors.DefaultSelector() as selector,
    ):
        listener.bind(path)
        listener.listen(64)
        selector.register(listener, selectors.EVENT_READ)
        selector.register(wake_r, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj is listener:
                    conn, _ = listener.accept()
                    conn.settimeout(10)  # ForkServer sends its request at once
                    try:
                        request = Request.decode(_read_line(conn))
                    except (OSError, ValueError, TypeError) as exc:
                        print(f"refused a request: {exc!r}", file=sys.stderr, flush=True)
                        conn.close()
                        continue
                    conn.settimeout(None)
                    pid = os.fork()
                    if pid == 0:
                        # The child: nothing of the server's stays open in it.
                        signal.set_wakeup_fd(-1)
                        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                        for held in (conn, *children.values()):
                            held.close()
                        os.close(wake_r)
                        os.close(wake_w)
                        return request  # the with-blocks close the listener and selector
                    with contextlib.suppress(OSError):  # the caller may be gone
                        conn.sendall(f"{pid}\n".encode())
                    children[pid] = conn
                else:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_r, 4096)
                    _reap(children)


def _reap(children: dict[int, socket.socket]) -> None:
    """Answer each child that has exited with its exit status."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            conn.close()


def run_child(request: Request, server: int) -> None:
    """In a forked child: become ``python -m request.module *request.args``."""
    os.setsid()  # a session of its own, as hack.cluster.spawn gives a child
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != server:  # the server died before prctl took
        os._exit(-_KILLED_WITH_SERVER)
    log = os.open(request.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(devnull)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    sys.argv = [request.module, *request.args]
    # The program's own module runs afresh, as `python -m` runs it (runpy warns
    # if it was imported already); what it imports stays imported: the gain.
    for name in (request.module, f"{request.module}.__main__"):
        sys.modules.pop(name, None)
    # Raises SystemExit with the program's status, which ends this interpreter
    # the way it ends `python -m module`: atexit handlers, threads joined, flushed.
    runpy.run_module(request.module, run_name="__main__", alter_sys=True)


class ForkedProcess:
    """A program the fork server started: the part of ``subprocess.Popen`` callers use."""

    def __init__(self, args: list[str], pid: int, conn: socket.socket) -> None:
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self._conn = conn
        self._lock = threading.Lock()

    def _collect(self, timeout: float | None) -> int | None:
        with self._lock:
            if self.returncode is None:
                ready, _, _ = select.select([self._conn], [], [], timeout)
                if ready:
                    answer = _read_line(self._conn)
                    self._conn.close()
                    # No answer: the server died, and PR_SET_PDEATHSIG killed the child with it.
                    self.returncode = int(answer) if answer.strip() else _KILLED_WITH_SERVER
            return self.returncode

    def poll(self) -> int | None:
        return self._collect(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._collect(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """One server per process, started on first use, that forks programs from ``preload``."""

    def __init__(self, preload: Sequence[str], cwd: Path) -> None:
        self.preload = tuple(preload)
        self.cwd = cwd
        self._lock = threading.Lock()
        self._server: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None

    @property
    def pid(self) -> int | None:
        return None if self._server is None else self._server.pid

    def _socket(self) -> Path:
        # Imported here: hack.cluster is what this module's server has no need of.
        from hack.cluster import spawn

        with self._lock:
            if self._server is None or self._server.poll() is not None:
                self._dir = Path(tempfile.mkdtemp(prefix="ksc-forkserver-"))
                socket_path = str(self._dir / "socket")
                self._server = spawn(
                    [sys.executable, "-m", "hack.forkserver", socket_path, *self.preload],
                    self._dir / "server.log",
                    cwd=self.cwd,
                )
            assert self._dir is not None
            return self._dir / "socket"

    def _connect(self, within: float = 60.0) -> socket.socket:
        path = self._socket()
        deadline = time.monotonic() + within
        while True:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(str(path))
                return conn
            except (FileNotFoundError, ConnectionRefusedError):
                conn.close()
                server = self._server
                if server is not None and server.poll() is not None:
                    raise RuntimeError(
                        f"the fork server exited {server.returncode}: {self._log_tail()}"
                    ) from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the fork server did not listen on {path}") from None
                time.sleep(0.05)

    def _log_tail(self) -> str:
        log = None if self._dir is None else self._dir / "server.log"
        return log.read_text(errors="replace")[-2000:] if log and log.exists() else ""

    def start_module(
        self, module: str, args: Sequence[str], log: Path, *, env: dict[str, str], cwd: Path
    ) -> ForkedProcess:
        """``python -m module *args`` with exactly ``env``, output appended to ``log``."""
        startup = sorted(name for name in env if name.startswith("PYTHON"))
        if startup:
            raise ValueError(f"a forked program cannot take {startup}: exec it instead")
        log.parent.mkdir(parents=True, exist_ok=True)
        conn = self._connect()
        try:
            conn.sendall(Request(module, list(args), env, str(cwd), str(log)).encode())
            conn.settimeout(30)
            answer = _read_line(conn)
            conn.settimeout(None)
        except BaseException:
            conn.close()
            raise
        if not answer.strip():
            conn.close()
            raise RuntimeError(f"the fork server did not start {module}: {self._log_tail()}")
        return ForkedProcess(["-m", module, *args], int(answer), conn)

    def stop(self) -> None:
        """Stop the server; a child still running is killed with it."""
        from hack.cluster import stop_process

        with self._lock:
            if self._server is not None:
                stop_process(self._server, grace=5)
                self._server = None
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None


def main(argv: Sequence[str]) -> None:
    path, *preload = argv
    server = os.getpid()
    request = serve(path, preload)
    run_child(request, server)


if __name__ == "__main__":
    main(sys.argv[1:])
