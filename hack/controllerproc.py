"""The controller as the tests run it: ``python -m controller`` in a subprocess.

Under pytest it is forked from a server that has already imported it
(:mod:`hack.forkserver`: ~1.3 CPU-seconds less a start, ~165 starts a suite
run); ``KSC_CONTROLLER_START=exec`` execs every one instead, as benchmarks
and the demo always do (they measure the process, imports and all).

It runs under exactly the Helm chart's RBAC: :func:`controller_for`
applies the chart's ServiceAccount, Roles and bindings for one watched
namespace and hands the controller a TokenRequest token of the chart's
controller ServiceAccount, so any permission the chart forgot fails here.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from hack import chart
from hack.cluster import Api, ApiError, LocalCluster, free_port, spawn, wait_http
from hack.crds import install_crds
from hack.forkserver import ForkedProcess, ForkServer
from hack.polling import wait_for

REPO = Path(__file__).resolve().parents[1]
# "fork" (tests/conftest.py sets it) or "exec" (the default): how ControllerProcess starts.
START_ENV = "KSC_CONTROLLER_START"
# What a controller imports before it does anything, kubernetes_asyncio's
# kubeconfig loader included (kubeclient.transport imports it on first use).
FORK_SERVER = ForkServer(("controller.__main__", "kubernetes_asyncio.config"), cwd=REPO)


@dataclass
class ControllerProcess:
    kubeconfig: Path
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | ForkedProcess | None = None
    health_port: int = 0
    metrics_port: int = 0

    def start(self, timeout: float = 30.0) -> None:
        self.health_port, self.metrics_port = free_port(), free_port()
        env = {
            **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")},
            **{k: v for k, v in os.environ.items() if k.startswith("KSC_")},
            "KUBECONFIG": str(self.kubeconfig),
            "HEALTH_PORT": str(self.health_port),
            "METRICS_PORT": str(self.metrics_port),
            "BIND_ADDRESS": "127.0.0.1",
            "LOG_LEVEL": "DEBUG",
            **self.env,
        }
        if os.environ.get(START_ENV, "exec") == "fork":
            self.proc = FORK_SERVER.start_module("controller", [], self.log, env=env, cwd=REPO)
        else:
            self.proc = spawn([sys.executable, "-m", "controller"], self.log, env=env, cwd=REPO)
        wait_http(f"http://127.0.0.1:{self.health_port}/readyz", self.proc, self.log, timeout)

    def _get(self, port: int, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError:
            return 0, ""

    def metrics(self) -> str:
        return self._get(self.metrics_port, "/metrics")[1]

    def metric(self, name: str, page: str | None = None, **labels: str) -> float:
        """The sum of the samples called ``name`` whose labels include ``labels``.

        From ``page`` (a /metrics page already scraped), else a fresh scrape.
        """
        total = 0.0
        for family in text_string_to_metric_families(self.metrics() if page is None else page):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
        return total

    def idle(self) -> bool:
        """No key queued and none being reconciled, in one scrape (one instant of the loop)."""
        page = self.metrics()
        return (
            self.metric("workqueue_depth", page) == 0
            and self.metric("controller_runtime_active_workers", page) == 0
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def controller_user(namespace: str) -> str:
    """The username (in the audit log too) of a controller that :func:`controller_for` made."""
    return chart.service_account_user(namespace, chart.CONTROLLER_SERVICE_ACCOUNT)


@contextlib.contextmanager
def running(proc: ControllerProcess) -> Iterator[ControllerProcess]:
    """``proc`` started for the ``with`` block, then stopped with SIGTERM.

    It must exit 0 then: a controller that cannot shut down cleanly fails the test.
    """
    proc.start()
    try:
        yield proc
    finally:
        code = proc.stop()
        assert code == 0, f"controller exited {code} on SIGTERM:\n{proc.output()[-5000:]}"


def controller_for(
    cluster: LocalCluster,
    namespace: str,
    workdir: Path,
    *,
    env: dict[str, str] | None = None,
    omit: tuple[tuple[str, str], ...] = (),
    name: str = "controller",
) -> ControllerProcess:
    """A (not yet started) controller watching ``namespace`` under the chart's RBAC."""
    install_crds(cluster)
    apply_controller_rbac(cluster, namespace, [namespace], omit=omit)
    kubeconfig = chart.service_account_kubeconfig(
        cluster, namespace, path=workdir / f"{name}.kubeconfig"
    )
    settings = {
        "WATCH_NAMESPACE": namespace,
        "POD_NAMESPACE": namespace,
        "RUNNER_SERVICE_ACCOUNT": chart.RUNNER_SERVICE_ACCOUNT,
        "POLLING_INTERVAL": "30s",
        # Config probes are tested on their own (tests/integration/test_configs.py):
        # elsewhere their Jobs and pods would mix with the runs' in the counts.
        "PROBE_INTERVAL": "0",
        "MAX_RECONCILE_RATE": "2",
        "LEADER_ELECT": "false",
        **(env or {}),
    }
    return ControllerProcess(kubeconfig=kubeconfig, log=workdir / f"{name}.log", env=settings)


def apply_controller_rbac(
    cluster: LocalCluster,
    namespace: str,
    watch_namespaces: Sequence[str],
    *,
    values: dict[str, Any] | None = None,
    omit: tuple[tuple[str, str], ...] = (),
) -> list[chart.Obj]:
    """The chart's RBAC and admission policies (:func:`chart.controller_rbac_objects`), in force.

    Applied, then waited for: the API server loads a new or changed
    ValidatingAdmissionPolicy a moment after it is written, and a forked
    controller is ready a fraction of a second after it starts, so its first
    Job could otherwise go through before the policy (or be refused by the
    policy's previous version). For each policy, a dry run it refuses is sent
    until it is refused with that policy's words, in every watched namespace:
    an unlabelled ConfigMap (own-objects), a labelled Job mounting a hostPath
    (runner-pods: refused for the namespace first while the namespace is not
    yet in its list). They go as the controller's user, impersonated by the
    admin with the system:masters group: the policies match the username,
    RBAC (``omit`` may take create away) lets them through, and the audit log
    holds them as the admin's, not as requests of the controller's.
    """
    objects = chart.controller_rbac_objects(namespace, watch_namespaces, values=values, omit=omit)
    chart.apply(cluster, objects)
    api = Api(cluster.server, cluster.token_for("admin"), cluster.ca_path)
    for policy in objects:
        if policy["kind"] != "ValidatingAdmissionPolicy":
            continue
        name = policy["metadata"]["name"]
        known = [probe for end, probe in _REFUSED_BY.items() if name.endswith(end)]
        if not known:
            raise LookupError(f"no dry run known to be refused by admission policy {name}")
        api.headers |= {
            "Impersonate-User": _matched_user(policy),
            "Impersonate-Group": "system:masters",
        }
        for where in watch_namespaces or [namespace]:
            _until_refused(api, known[0], where, name)
    return objects


def _matched_user(policy: chart.Obj) -> str:
    """The one username a chart policy matches (its ``is-the-controller`` condition)."""
    for condition in policy["spec"].get("matchConditions") or []:
        found = re.fullmatch(r'request\.userInfo\.username == "(.+)"', condition["expression"])
        if found:
            return found.group(1)
    raise LookupError(f"admission policy {policy['metadata']['name']} matches no one username")


@dataclass(frozen=True)
class _Refused:
    """A dry run as the controller that one of the chart's admission policies refuses."""

    collection: str  # in namespace {}
    body: chart.Obj
    says: str


_REFUSED_BY = {
    "-own-objects": _Refused(
        "/api/v1/namespaces/{}/configmaps",
        {"metadata": {"name": "ksc-policy-probe"}},
        "may only write configmaps labelled",
    ),
    "-runner-pods": _Refused(
        "/apis/batch/v1/namespaces/{}/jobs",
        {
            "metadata": {
                "name": "ksc-policy-probe",
                "labels": {"app.kubernetes.io/managed-by": "kserve-inference-controller"},
            },
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "serviceAccountName": chart.RUNNER_SERVICE_ACCOUNT,
                        "containers": [{"name": "probe", "image": "probe"}],
                        "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
                    }
                }
            },
        },
        "may not mount hostPath volumes",
    ),
}


def _until_refused(api: Api, probe: _Refused, namespace: str, policy: str) -> None:
    path = probe.collection.format(namespace) + "?dryRun=All"

    def refused() -> str | None:
        try:
            api.request("POST", path, probe.body)
        except ApiError as exc:
            return exc.body if probe.says in exc.body else None
        return None

    wait_for(
        refused, within=30, what=f"admission policy {policy} in force in {namespace}", every=0.05
    )
