"""A real, local Kubernetes control plane for tests, benchmarks and the demo.

``LocalCluster`` starts etcd, kube-apiserver and kube-controller-manager
(built from their Go modules by ``hack/controlplane/build.sh``) on free
loopback ports, plus the test node agent (``hack.nodeagent``) that plays the
kubelet. It writes one kubeconfig per user:

========== ============================ ===========================================
user       identity                     used by
========== ============================ ===========================================
admin      ``admin`` (system:masters)   tests' set-up, kubectl, the node agent
controller ``kserve-inference-controller`` the controller under test (RBAC applies)
runner     ``kserve-inference-runner``  runner processes started outside pods
========== ============================ ===========================================

Every request except the control plane's own is recorded in a JSON audit log
(``audit_log``) so tests and benchmarks can count requests per user.

Every child process gets ``PR_SET_PDEATHSIG`` so that it dies with its
parent even when the parent is killed outright, and :meth:`LocalCluster.stop`
terminates them in reverse order. Run ``python -m hack.cluster up`` for a
cluster in the foreground (see docs/development.md).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import yaml

from contract.termination import RunResult, success_message
from hack.commands import run_tool
from hack.pki import Pki, make_pki

REPO = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO / "hack" / "controlplane" / "build.sh"
NODE_NAME = "local-node"

# The garbage collector's user (kube-controller-manager runs each controller
# under its own ServiceAccount).
GARBAGE_COLLECTOR = "system:serviceaccount:kube-system:generic-garbage-collector"

# kube-controller-manager controllers a Job-orchestrating controller relies on.
KCM_CONTROLLERS = (
    "job-controller",
    "cronjob-controller",
    "garbage-collector-controller",
    "ttl-after-finished-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    "pod-garbage-collector-controller",
    # Fills the default admin/edit/view ClusterRoles from aggregated ones (the chart ships some).
    "clusterrole-aggregation-controller",
)


# Stand-in runner images for controller tests and benchmarks: known outcomes, no
# model or storage needed. Real runner images (``*runner*``) run the real runner.
# What a real runner leaves as its termination message on success, written by
# the runner's own function so the stand-ins (here and in hack.kwok) cannot drift.
SUCCESS_MESSAGE = success_message(RunResult(rows=3, predictions=3, duration_seconds=0.1))
_TERMINATION = '"$NODE_AGENT_ROOT/dev/termination-log"'
STAND_IN_RUNNERS = {
    "test.local/fake-ok*": [
        "sh",
        "-c",
        f'test -s "$NODE_AGENT_ROOT/tmp/contract.json" || exit 2; '
        f'echo \'{{"event":"progress","rowsDone":3,"rowsTotal":3}}\'; '
        f"printf '%s' '{SUCCESS_MESSAGE}' > {_TERMINATION}",
    ],
    # Succeeds after 8 s: a run that is under way and then ends while a test's fault lasts.
    "test.local/fake-brief*": [
        "sh",
        "-c",
        f'test -s "$NODE_AGENT_ROOT/tmp/contract.json" || exit 2; sleep 8; '
        f'echo \'{{"event":"progress","rowsDone":3,"rowsTotal":3}}\'; '
        f"printf '%s' '{SUCCESS_MESSAGE}' > {_TERMINATION}",
    ],
    "test.local/fake-fail*": [
        "sh",
        "-c",
        f"printf 'inference: model answered 503 Service Unavailable' > {_TERMINATION}; exit 4",
    ],
    # The model refused the request (exit 7): retrying cannot help.
    "test.local/fake-rejected*": [
        "sh",
        "-c",
        f"printf 'inference: model answered 422: unsupported protocol v1' > {_TERMINATION}; exit 7",
    ],
    "test.local/fake-slow*": [
        "sh",
        "-c",
        "i=0; while [ $i -lt 600 ]; do i=$((i+1)); "
        'echo "{\\"event\\":\\"progress\\",\\"rowsDone\\":$i,\\"rowsTotal\\":600}"; '
        "sleep 0.5; done",
    ],
}


@dataclass(frozen=True)
class User:
    name: str
    token: str
    groups: tuple[str, ...] = ()


USERS = {
    "admin": User("admin", "admin-token", ("system:masters",)),
    "controller": User("kserve-inference-controller", "controller-token"),
    "runner": User("kserve-inference-runner", "runner-token"),
    "kcm": User("system:kube-controller-manager", "kcm-token"),
}


def ensure_binaries() -> Path:
    """Return the directory holding the control-plane binaries, building them if needed."""
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=True
    )
    return Path(done.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """preexec_fn: ask the kernel to SIGKILL the child when its parent dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


# PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, not the
# process: a child started from a short-lived thread (asyncio.to_thread, whose
# pool is shut down with its event loop) would be killed with that thread. So
# one thread that lives as long as the process forks every child.
_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="spawner")


def spawn(
    args: Sequence[str],
    log: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start a child that logs to ``log`` and cannot outlive this process."""

    def start() -> subprocess.Popen[bytes]:  # on the spawner thread
        log.parent.mkdir(parents=True, exist_ok=True)
        out: IO[bytes] = log.open("ab")
        try:
            return subprocess.Popen(
                list(args),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=cwd,
                preexec_fn=_die_with_parent,
                # Ctrl-C in a terminal reaches us only; we stop them in order.
                start_new_session=True,
            )
        finally:
            out.close()

    return _SPAWNER.submit(start).result()


def stop_process(
    proc: subprocess.Popen[bytes], grace: float = 10.0, *, sig: int = signal.SIGTERM
) -> None:
    """``sig`` (SIGTERM) to a :func:`spawn`-ed child's process group; SIGKILL after ``grace``."""
    if proc.poll() is not None:
        return
    # spawn() made the child a session leader: its group holds anything it started.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


class Child(Protocol):
    """What :func:`wait_http` needs of a process: a ``subprocess.Popen`` or the like."""

    args: Any
    returncode: int | None

    def poll(self) -> int | None: ...


def wait_http(url: str, proc: Child, log: Path, within: float = 120.0) -> None:
    """Wait until ``url`` answers below 500 (it is up), failing early if ``proc`` exits."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status < 500:
                    return
        except urllib.error.HTTPError as answer:
            if answer.code < 500:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {within}s; log: {log}")


def mutating_policy(
    name: str,
    expression: str,
    *,
    group: str = "",
    resource: str = "pods",
    namespaces: dict[str, Any] | None = None,
    conditions: dict[str, str] | None = None,
    reinvocation: str = "Never",
) -> list[dict[str, Any]]:
    """A MutatingAdmissionPolicy and its binding: apply ``expression`` to CREATEs of ``resource``.

    Test stand-ins for admission webhooks (a scheduler's, Kueue's, a CNI's)
    are all this shape. ``namespaces`` (a namespace selector) limits both the
    policy and its binding; ``conditions`` maps matchCondition names to CEL;
    failures reject the object (``failurePolicy: Fail``), so a stand-in that
    does not apply cannot pass unnoticed.
    """
    constraints: dict[str, Any] = {}
    if namespaces is not None:
        constraints["namespaceSelector"] = namespaces
    constraints["resourceRules"] = [
        {
            "apiGroups": [group],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": [resource],
        }
    ]
    spec: dict[str, Any] = {"matchConstraints": constraints}
    if conditions:
        spec["matchConditions"] = [{"name": n, "expression": e} for n, e in conditions.items()]
    spec["failurePolicy"] = "Fail"
    spec["reinvocationPolicy"] = reinvocation
    spec["mutations"] = [
        {"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": expression}}
    ]
    binding_spec: dict[str, Any] = {"policyName": name}
    if namespaces is not None:
        binding_spec["matchResources"] = {"namespaceSelector": namespaces}
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": spec,
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": binding_spec,
        },
    ]


# --------------------------------------------------------------------------------------------
# A small synchronous API client: the harness's and the fuzz's (test infrastructure
# must not share the controller's).


class ApiError(Exception):
    """The API server answered with an HTTP error: its code and its Status's message."""

    def __init__(self, code: int, body: str) -> None:
        self.code = code
        self.body = body
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = {}
        self.status: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
        self.message = str(self.status.get("message") or body[:2000])
        super().__init__(f"{code}: {self.message[:500]}")


class Api:
    def __init__(self, server: str, token: str, ca: Path) -> None:
        self.server = server
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.ssl = ssl.create_default_context(cafile=str(ca))

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        timeout: float = 60,
        *,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One request; the answer's JSON (``{}`` when empty), or ``ApiError``."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {**self.headers, "Content-Type": content_type}
        req = urllib.request.Request(self.server + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, context=self.ssl, timeout=timeout) as resp:
                out: dict[str, Any] = json.loads(resp.read() or b"{}")
                return out
        except urllib.error.HTTPError as e:
            raise ApiError(e.code, e.read().decode(errors="replace")) from None

    def watch(self, path: str, stop: threading.Event) -> Iterator[dict[str, Any]]:
        """Watch events of a collection, reconnecting (every 10 s) until ``stop`` is set."""
        version = ""
        while not stop.is_set():
            if not version:
                listed = self.request("GET", path)
                for item in listed.get("items") or []:
                    yield {"type": "ADDED", "object": item}
                version = listed["metadata"]["resourceVersion"]
            query = urllib.parse.urlencode(
                {"watch": "1", "resourceVersion": version, "timeoutSeconds": "10"}
            )
            sep = "&" if "?" in path else "?"
            req = urllib.request.Request(f"{self.server}{path}{sep}{query}", headers=self.headers)
            try:
                with urllib.request.urlopen(req, context=self.ssl, timeout=30) as resp:
                    for line in resp:
                        event = json.loads(line)
                        if event.get("type") == "ERROR":
                            version = ""  # 410 Gone: list again
                            break
                        version = event["object"]["metadata"]["resourceVersion"]
                        yield event
                        if stop.is_set():
                            return
            except (OSError, ValueError):
                if stop.wait(0.5):
                    return


@dataclass
class LocalCluster:
    bin_dir: Path
    workdir: Path
    node_agent: bool = True
    # Identities beyond USERS (token -> user), e.g. real kubelets (hack.realnode).
    extra_users: dict[str, User] = field(default_factory=dict)
    # kube-controller-manager controllers beyond KCM_CONTROLLERS.
    extra_controllers: tuple[str, ...] = ()
    # Image glob -> command for containers without a command (see hack/nodeagent.py).
    # Any runner image runs this checkout's runner.
    image_commands: dict[str, list[str]] = field(
        default_factory=lambda: {**STAND_IN_RUNNERS, "*runner*": [sys.executable, "-m", "runner"]}
    )

    etcd_port: int = 0
    etcd_peer_port: int = 0
    api_port: int = 0
    kcm_port: int = 0
    node_port: int = 0
    pki: Pki | None = None
    _procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    _apis: dict[str, Api] = field(default_factory=dict)
    # apiVersion -> kind -> (path template, namespaced), from discovery.
    _discovered: dict[str, dict[str, tuple[str, bool]]] = field(default_factory=dict)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def ca_path(self) -> Path:
        assert self.pki is not None
        return self.pki.ca_cert

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def kubeconfig(self) -> Path:
        return self.kubeconfig_for("admin")

    def kubeconfig_for(self, user: str) -> Path:
        return self.workdir / f"kubeconfig-{user}"

    @property
    def users(self) -> dict[str, User]:
        return {**USERS, **self.extra_users}

    def token_for(self, user: str) -> str:
        return self.users[user].token

    def pids(self) -> list[int]:
        return [p.pid for _, p in self._procs]

    # ---- lifecycle -------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        self.pki = make_pki(self.workdir / "pki")
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.api_port, self.kcm_port, self.node_port = free_port(), free_port(), free_port()
        self._write_auth_files()
        try:
            self._start_etcd()
            self._start_apiserver()
            self._wait_ready(timeout)
            self._start_kcm()
            if self.node_agent:
                self._start_node_agent()
            self._wait_kcm(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for _, proc in reversed(self._procs):
            stop_process(proc)
        self._procs.clear()

    def stop_apiserver(self, *, graceful: bool = False) -> None:
        """Stop kube-apiserver alone (a control-plane outage); etcd, KCM and the node agent stay.

        By default it is killed outright, as a crashed or OOM-killed API
        server would be (and at once: on SIGTERM it keeps serving open watches
        for its whole grace period); ``graceful`` sends SIGTERM first.
        """
        for entry in list(self._procs):
            if entry[0] == "kube-apiserver":
                stop_process(entry[1], grace=10.0 if graceful else 0.0)
                self._procs.remove(entry)

    def start_apiserver(self, timeout: float = 120.0) -> float:
        """Start kube-apiserver again on the same port and state; seconds until it was ready."""
        if any(name == "kube-apiserver" for name, _ in self._procs):
            raise RuntimeError("kube-apiserver is running already")
        started = time.monotonic()
        self._start_apiserver()
        self._wait_ready(timeout)
        return time.monotonic() - started

    def _process(self, name: str) -> subprocess.Popen[bytes] | None:
        return next((proc for n, proc in self._procs if n == name), None)

    def stop_etcd(self) -> None:
        """Kill etcd outright (a crashed etcd); everything else stays up and sees it gone."""
        proc = self._process("etcd")
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)  # a stopped process dies only once continued
            stop_process(proc, grace=0.0)
            self._procs.remove(("etcd", proc))

    def start_etcd(self, timeout: float = 120.0) -> float:
        """Start etcd again on its ports and data; seconds until kube-apiserver was ready again."""
        if self._process("etcd") is not None:
            raise RuntimeError("etcd is running already")
        started = time.monotonic()
        self._start_etcd()
        self._procs.insert(0, self._procs.pop())  # stopped last, as when started first
        self._wait_ready(timeout)
        return time.monotonic() - started

    def pause_etcd(self) -> None:
        """SIGSTOP etcd: connections stay open and requests hang (a stalled disk or VM)."""
        proc = self._process("etcd")
        if proc is None:
            raise RuntimeError("etcd is not running")
        os.kill(proc.pid, signal.SIGSTOP)

    def resume_etcd(self) -> None:
        proc = self._process("etcd")
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- helpers ---------------------------------------------------------

    def kubectl(
        self,
        *args: str,
        user: str = "admin",
        check: bool = True,
        input: str | None = None,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        return run_tool(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig_for(user)}", *args],
            shown=f"kubectl {' '.join(args)}",
            check=check,
            input=input,
            timeout=timeout,
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        user: str = "admin",
        content_type: str = "application/json",
        timeout: float = 60.0,
    ) -> dict[str, Any]:
        """One API request as ``user``; the answer parsed, or ``ApiError``.

        The harness's own set-up (applying objects, asking for tokens) is a
        request, not a kubectl process: kubectl costs 0.1-0.2 CPU-seconds and a
        discovery round each time, and the set-up runs hundreds of times a run.
        """
        api = self._apis.get(user)
        if api is None:
            api = self._apis[user] = Api(self.server, self.token_for(user), self.ca_path)
        return api.request(method, path, body, timeout, content_type=content_type)

    def resource_path(self, api_version: str, kind: str, name: str, namespace: str | None) -> str:
        """The URL path of object ``name`` of ``kind``, as discovery names its resource.

        A namespaced kind without ``namespace`` goes to ``default``, as kubectl
        sends it; a kind the API server does not serve raises ``LookupError``.
        """
        resources = self._discovered.get(api_version)
        if resources is None:
            base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
            listing = self.request("GET", base)
            resources = {
                r["kind"]: (f"{base}/{{}}{r['name']}", bool(r.get("namespaced")))
                for r in listing.get("resources") or []
                if "/" not in r["name"]  # subresources
            }
            self._discovered[api_version] = resources
        if kind not in resources:
            raise LookupError(f"the API server serves no {kind} in {api_version}")
        template, namespaced = resources[kind]
        scope = f"namespaces/{namespace or 'default'}/" if namespaced else ""
        return template.format(scope) + f"/{name}"

    def audit_events(self, user: str | None = None) -> list[dict[str, Any]]:
        """Parsed audit events so far, optionally only those of one user (by kubeconfig name)."""
        name = self.users[user].name if user else None
        events: list[dict[str, Any]] = []
        if not self.audit_log.exists():
            return events
        with self.audit_log.open() as f:
            for line in f:
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the last line of an API server killed mid-write

                if name is None or event.get("user", {}).get("username") == name:
                    events.append(event)
        return events

    def _write_auth_files(self) -> None:
        lines = [
            f'{u.token},{u.name},{i},"{",".join(u.groups)}"'
            for i, u in enumerate(self.users.values())
        ]
        (self.workdir / "tokens.csv").write_text("\n".join(lines) + "\n")
        (self.workdir / "tokens.csv").chmod(0o600)
        # Count what clients do; leave the control plane's own chatter out so the log stays small.
        policy = {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [
                # The garbage collector's deletes of Jobs and CronJobs: whether a deleted
                # run's workload was already gone (hack/invariants.py).
                {
                    "level": "Metadata",
                    "users": [GARBAGE_COLLECTOR],
                    "verbs": ["delete"],
                    "resources": [{"group": "batch", "resources": ["jobs", "cronjobs"]}],
                },
                {"level": "None", "users": ["system:kube-controller-manager", "system:apiserver"]},
                {"level": "None", "userGroups": ["system:serviceaccounts:kube-system"]},
                # Real nodes and the scheduler (hack.realnode) heartbeat constantly.
                {"level": "None", "users": ["system:kube-scheduler"]},
                {"level": "None", "userGroups": ["system:nodes"]},
                {"level": "None", "nonResourceURLs": ["/healthz*", "/readyz*", "/livez*"]},
                {"level": "Metadata"},
            ],
        }
        (self.workdir / "audit-policy.yaml").write_text(yaml.safe_dump(policy))
        for key in self.users:
            self._write_kubeconfig(key)

    def _write_kubeconfig(self, key: str) -> None:
        user = self.users[key]
        self.write_token_kubeconfig(self.kubeconfig_for(key), user.name, user.token, context=key)

    def write_token_kubeconfig(
        self, path: Path, user: str, token: str, *, context: str, namespace: str | None = None
    ) -> Path:
        """Write a kubeconfig (mode 0600) for this API server, as ``user`` with bearer ``token``.

        ``context`` names its one context; ``namespace``, when given, is its default namespace.
        """
        target: dict[str, str] = {"cluster": "local", "user": user}
        if namespace is not None:
            target["namespace"] = namespace
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca_path)},
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": context, "context": target}],
            "current-context": context,
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def _start_etcd(self) -> None:
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        args = [
            str(self.bin_dir / "etcd"),
            "--name=local",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=local={peer}",
            "--unsafe-no-fsync=true",  # test data is throw-away; fsync dominates latency otherwise
            "--quota-backend-bytes=2147483648",
            "--log-level=warn",
        ]
        self._procs.append(("etcd", spawn(args, self.log_dir / "etcd.log")))

    def _start_apiserver(self) -> None:
        assert self.pki is not None
        pki = self.pki
        args = [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.api_port}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={pki.apiserver_cert}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--token-auth-file={self.workdir / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--kubelet-client-certificate={pki.kubelet_client_cert}",
            f"--kubelet-client-key={pki.kubelet_client_key}",
            f"--kubelet-certificate-authority={pki.ca_cert}",
            "--kubelet-preferred-address-types=InternalIP",
            "--allow-privileged=false",
            f"--audit-policy-file={self.workdir / 'audit-policy.yaml'}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",  # events are on disk before the response: exact counts
            # Never rotate (the default rotates at 100 MiB): one file holds the whole
            # record of a run, for every reader (hack.invariants follows a
            # rotation too, the benchmarks' counters do not). The workdir is throw-away.
            "--audit-log-maxsize=0",
            # Two cores: no priority-and-fairness bookkeeping, nothing to protect against.
            "--enable-priority-and-fairness=false",
            "--profiling=false",
        ]
        self._procs.append(("kube-apiserver", spawn(args, self.log_dir / "kube-apiserver.log")))

    def _start_kcm(self) -> None:
        assert self.pki is not None
        kubeconfig = self.kubeconfig_for("kcm")
        args = [
            str(self.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            f"--controllers={','.join(KCM_CONTROLLERS + self.extra_controllers)}",
            "--use-service-account-credentials=true",  # each controller under its own RBAC
            f"--service-account-private-key-file={self.pki.sa_key}",
            f"--root-ca-file={self.pki.ca_cert}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.kcm_port}",
            f"--cert-dir={self.workdir / 'kcm-certs'}",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            # Pods are reported gone quickly by the node agent; keep GC loops short.
            "--concurrent-job-syncs=5",
        ]
        self._procs.append(
            ("kube-controller-manager", spawn(args, self.log_dir / "kube-controller-manager.log"))
        )

    def _start_node_agent(self) -> None:
        assert self.pki is not None
        args = [
            sys.executable,
            "-m",
            "hack.nodeagent",
            f"--kubeconfig={self.kubeconfig}",
            f"--node-name={NODE_NAME}",
            f"--work-dir={self.workdir / 'pods'}",
            f"--port={self.node_port}",
            f"--tls-cert={self.pki.node_cert}",
            f"--tls-key={self.pki.node_key}",
            f"--client-ca={self.pki.ca_cert}",
        ]
        for image, command in self.image_commands.items():
            args.append(f"--image-command={image}={json.dumps(command)}")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        self._procs.append(
            ("node-agent", spawn(args, self.log_dir / "node-agent.log", env=env, cwd=REPO))
        )

    def _get(self, path: str, port: int | None = None) -> int:
        assert self.pki is not None
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        if port is not None:
            # kube-controller-manager serves a self-signed certificate of its own.
            ctx = ssl._create_unverified_context()  # loopback health probe only
        req = urllib.request.Request(
            f"https://127.0.0.1:{port or self.api_port}{path}",
            headers={"Authorization": f"Bearer {USERS['admin'].token}"},
        )
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as e:
            return e.code

    def _check_alive(self) -> None:
        for name, proc in self._procs:
            if proc.poll() is not None:
                log = self.log_dir / f"{name}.log"
                tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")

    def _wait_until(self, ready: Callable[[], bool], what: str, timeout: float) -> None:
        """Poll ``ready`` until true, failing early with the log of any child that died."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            with contextlib.suppress(OSError):
                if ready():
                    return
            time.sleep(0.25)
        raise TimeoutError(f"{what} not ready after {timeout}s; logs in {self.log_dir}")

    def _wait_ready(self, timeout: float) -> None:
        self._wait_until(lambda: self._get("/readyz") == 200, "kube-apiserver", timeout)

    def _wait_kcm(self, timeout: float) -> None:
        """The controller manager is useful once it serves and has made the default SA."""

        def ready() -> bool:
            return (
                self._get("/healthz", port=self.kcm_port) == 200
                and self._get("/api/v1/namespaces/default/serviceaccounts/default") == 200
                and (not self.node_agent or self._get(f"/api/v1/nodes/{NODE_NAME}") == 200)
            )

        self._wait_until(ready, "control plane", timeout)


def leftover_processes(marker_env: str, value: str) -> list[tuple[int, str]]:
    """Processes (other than this one) whose environment carries ``marker_env=value``.

    The test session sets the marker in its own environment, so every process
    it starts, and every process those start, inherits it.
    """
    needle = f"{marker_env}={value}".encode()
    found: list[tuple[int, str]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            if needle not in environ.split(b"\0"):
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if not cmdline:  # a zombie already reaped by the time we look
                continue
            found.append((int(entry.name), cmdline.strip()))
        except OSError:
            continue
    return found


@contextlib.contextmanager
def running_cluster(workdir: Path | None = None, keep: bool = False) -> Iterator[LocalCluster]:
    """Build (if needed) and start a cluster; stop it and remove its files on exit."""
    bin_dir = ensure_binaries()
    own = workdir is None
    path = Path(tempfile.mkdtemp(prefix="ksc-cluster-")) if workdir is None else workdir
    cluster = LocalCluster(bin_dir=bin_dir, workdir=path)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        if own and not keep:
            shutil.rmtree(path, ignore_errors=True)


class StopSignals:
    """SIGTERM/SIGINT set a flag instead of interrupting, so a foreground command stops in order."""

    def __init__(self) -> None:
        self.requested = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.requested = True

    def wait(self, check_alive: Callable[[], None], interval: float = 0.5) -> None:
        """Return once a stop was asked for; ``check_alive`` raises if something died meanwhile."""
        while not self.requested:
            time.sleep(interval)
            check_alive()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hack.cluster", description="A local Kubernetes control plane."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the control plane in the foreground until Ctrl-C")
    up.add_argument("--workdir", type=Path, help="keep state here (default: a temp dir)")
    sub.add_parser("build", help="build or locate the control-plane binaries and print their dir")
    args = parser.parse_args(argv)

    if args.command == "build":
        print(ensure_binaries())
        return 0

    stop = StopSignals()
    with running_cluster(args.workdir, keep=args.workdir is not None) as cluster:
        print(f"control plane ready at {cluster.server}")
        print(f"  logs:     {cluster.log_dir}   audit log: {cluster.audit_log}")
        print(next_steps(cluster.kubeconfig, cluster.bin_dir))
        print("Ctrl-C stops it and removes its files.", flush=True)
        stop.wait(cluster._check_alive)
    return 0


def next_steps(kubeconfig: Path, bin_dir: Path) -> str:
    """What ``make cluster`` tells a newcomer to do next: the CRDs, then the controller."""
    return "\n".join(
        [
            "Next, in another shell at the repository's root:",
            f"  export KUBECONFIG={kubeconfig} PATH={bin_dir}:$PWD/.venv/bin:$PATH",
            "  kubectl apply --server-side -f crds/            # the two kinds",
            "  kubectl wait --for=condition=Established crd --all",
            "  kubectl create namespace demo",
            "  WATCH_NAMESPACE=demo LEADER_ELECT=false python -m controller   # the controller",
            "  kubectl infer -n demo list                      # then submit runs to it",
            "`make demo DEMO_ARGS=--keep` does all of this, with a model server, storage and an"
            " iris run.",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
