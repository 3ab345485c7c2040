"""Simulated nodes for a :class:`~hack.cluster.LocalCluster`: kwok, fake Nodes, pod stages.

kwok (``sigs.k8s.io/kwok``, built by ``hack/kwok/build.sh``) plays the
kubelet of many Nodes at once without running anything: it moves each pod on
its Nodes through the stages given here, by writing the pod's status.

- **Nodes**: ``count`` Nodes named ``<prefix><i>``, labelled
  ``ksc.kwok/instance=<instance>``; kwok manages only the Nodes with that label
  (``--manage-nodes-with-label-selector``), so it lives beside the node agent
  of the shared test cluster, or beside another kwok, without touching their
  Nodes. No Node lease and no heartbeat: the control plane here runs no node
  lifecycle controller, so nothing marks a silent Node NotReady.
- **Placement**: pods are given ``spec.nodeName`` when they are created, by a
  MutatingAdmissionPolicy (:func:`node_name_policy`) that picks a Node from the
  first two hex digits of the pod's Job uid (``batch.kubernetes.io/controller-uid``).
  No kube-scheduler process: on 2 cores a scheduler's watches, scoring and one
  ``pods/binding`` request per pod cost CPU the benchmark is there to measure
  elsewhere, and the placement itself is not under test. It applies only to
  pods of Jobs in namespaces labelled ``ksc.kwok/pods=<instance>``
  (:meth:`Kwok.namespace_labels`), so nothing else on a shared cluster moves.
- **Stages** (:func:`pod_stages`): ``Pending -> Running`` after
  ``pending_seconds``; ``Running -> Succeeded`` after ``run_seconds`` with a
  real runner's terminated state (exit 0, the result JSON as termination
  message, which the controller reads into ``status.result``); or, for a
  ``failure_share`` of the pods (kwok's weighted choice between stages with the
  same selector), ``Running -> Failed`` with exit code 4 and the runner's
  one-line message. A pod being deleted is removed at once.

Use::

    with Kwok(cluster, workdir, nodes=10, run_seconds=1.0, failure_share=0.1) as kwok:
        cluster.kubectl("label", "namespace", ns, *kwok.namespace_labels_args())
        ...
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hack.cluster import (
    SUCCESS_MESSAGE,
    LocalCluster,
    free_port,
    mutating_policy,
    spawn,
    stop_process,
    wait_http,
)

REPO = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO / "hack" / "kwok" / "build.sh"

INSTANCE_LABEL = "ksc.kwok/instance"
PODS_LABEL = "ksc.kwok/pods"
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
FAILURE_EXIT_CODE = 4
FAILURE_MESSAGE = "inference: model answered 503 Service Unavailable"
# Weights are integers: shares are resolved to 1/WEIGHT_SCALE.
WEIGHT_SCALE = 10000

Obj = dict[str, Any]


def kwok_binary() -> Path:
    """The kwok binary, built (once, cached outside the repository) if needed."""
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=True
    )
    return Path(done.stdout.strip().splitlines()[-1])


def _stage(
    kind: str, name: str, selector: list[Obj], next_: Obj, delay_ms: int = 0, weight: int = 0
) -> Obj:
    """A kwok Stage: objects of ``kind`` matching ``selector`` go ``next_`` after ``delay_ms``."""
    spec: Obj = {
        "resourceRef": {"apiGroup": "v1", "kind": kind},
        "selector": {"matchExpressions": selector},
        "next": next_,
    }
    if delay_ms > 0:
        spec["delay"] = {"durationMilliseconds": delay_ms}
    if weight:
        spec["weight"] = weight
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": spec,
    }


_NOT_DELETING: Obj = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}

_RUNNING = """\
{{ $now := Now }}
conditions:
{{ range list "Initialized" "Ready" "ContainersReady" }}
- type: {{ . }}
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
{{ $meta := .metadata }}
podIP: {{ PodIPWith .spec.nodeName false $meta.uid $meta.name $meta.namespace | Quote }}
phase: Running
startTime: {{ $now | Quote }}
"""


def _terminated(phase: str, exit_code: int, reason: str, message: str) -> str:
    template = """\
{{ $now := Now }}
{{ $root := . }}
conditions:
- type: Initialized
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
{{ range list "Ready" "ContainersReady" }}
- type: {{ . }}
  status: "False"
  reason: PodCompleted
  lastTransitionTime: {{ $now | Quote }}
{{ end }}
containerStatuses:
{{ range $index, $item := .spec.containers }}
{{ $origin := index $root.status.containerStatuses $index }}
- image: {{ $item.image | Quote }}
  name: {{ $item.name | Quote }}
  ready: false
  started: false
  restartCount: 0
  state:
    terminated:
      exitCode: EXIT_CODE
      reason: REASON
      message: MESSAGE
      startedAt: {{ $origin.state.running.startedAt | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
phase: PHASE
"""
    return (
        template.replace("EXIT_CODE", str(exit_code))
        .replace("REASON", reason)
        .replace("MESSAGE", json.dumps(message))
        .replace("PHASE", phase)
    )


def pod_stages(
    *, pending_seconds: float = 0.0, run_seconds: float = 1.0, failure_share: float = 0.0
) -> list[Obj]:
    """kwok Stages: Pending -> Running -> Succeeded, or Failed for ``failure_share`` of pods."""
    if not 0.0 <= failure_share <= 1.0:
        raise ValueError(f"failure_share must be within 0..1, got {failure_share}")
    pending: list[Obj] = [
        _NOT_DELETING,
        {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
    ]
    running: list[Obj] = [
        _NOT_DELETING,
        {"key": ".status.phase", "operator": "In", "values": ["Running"]},
    ]
    run_ms = int(run_seconds * 1000)
    fail_weight = round(failure_share * WEIGHT_SCALE)
    stages = [
        _stage(
            "Pod",
            "ksc-pod-running",
            pending,
            {"statusTemplate": _RUNNING},
            int(pending_seconds * 1000),
        ),
        _stage(
            "Pod",
            "ksc-pod-delete",
            [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
            {"delete": True},
        ),
    ]
    if fail_weight < WEIGHT_SCALE:
        stages.append(
            _stage(
                "Pod",
                "ksc-pod-succeeded",
                running,
                {"statusTemplate": _terminated("Succeeded", 0, "Completed", SUCCESS_MESSAGE)},
                run_ms,
                WEIGHT_SCALE - fail_weight,
            )
        )
    if fail_weight > 0:
        stages.append(
            _stage(
                "Pod",
                "ksc-pod-failed",
                running,
                {
                    "statusTemplate": _terminated(
                        "Failed", FAILURE_EXIT_CODE, "Error", FAILURE_MESSAGE
                    )
                },
                run_ms,
                fail_weight,
            )
        )
    return stages


_NODE_READY = """\
{{ $now := Now }}
conditions:
- type: Ready
  status: "True"
  reason: KubeletReady
  lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
{{ range list "MemoryPressure" "DiskPressure" "PIDPressure" }}
- type: {{ . }}
  status: "False"
  reason: KubeletHasNo{{ . }}
  lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
{{ end }}
addresses:
- {type: InternalIP, address: {{ NodeIP | Quote }}}
- {type: Hostname, address: {{ .metadata.name | Quote }}}
allocatable: {cpu: 1k, memory: 1Ti, pods: 1M}
capacity: {cpu: 1k, memory: 1Ti, pods: 1M}
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  kubeletVersion: kwok
  containerRuntimeVersion: kwok
  kernelVersion: kwok
  kubeProxyVersion: kwok
  osImage: kwok
  machineID: ""
  bootID: ""
  systemUUID: ""
phase: Running
"""


def node_stages() -> list[Obj]:
    """One Stage: a new Node becomes Ready (no heartbeat after that)."""
    not_ready = {
        "key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
        "operator": "NotIn",
        "values": ["True"],
    }
    return [_stage("Node", "ksc-node-ready", [not_ready], {"statusTemplate": _NODE_READY})]


def node_name_policy(name: str, instance: str, nodes: list[str]) -> list[Obj]:
    """A MutatingAdmissionPolicy (and its binding) setting ``spec.nodeName`` of Job pods.

    The Node is ``nodes[(first two hex digits of the Job's uid) % len(nodes)]``:
    spread evenly, stable per Job, and decided once at admission.
    """
    hex_digits = "0123456789abcdef"
    uid = f'object.metadata.labels["{JOB_UID_LABEL}"]'
    bucket = (
        f'16 * "{hex_digits}".indexOf({uid}.substring(0, 1))'
        f' + "{hex_digits}".indexOf({uid}.substring(1, 2))'
    )
    expression = (
        f"Object{{spec: Object.spec{{nodeName: {json.dumps(nodes)}[({bucket}) % {len(nodes)}]}}}}"
    )
    unscheduled_job_pod = (
        "has(object.metadata.labels)"
        f' && "{JOB_UID_LABEL}" in object.metadata.labels'
        ' && (!has(object.spec.nodeName) || object.spec.nodeName == "")'
    )
    return mutating_policy(
        name,
        expression,
        namespaces={"matchLabels": {PODS_LABEL: instance}},
        conditions={"unscheduled-job-pod": unscheduled_job_pod},
    )


def fake_node(name: str, instance: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                INSTANCE_LABEL: instance,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "type": "kwok",
            },
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": {},
    }


@dataclass
class Kwok:
    """kwok managing ``nodes`` fake Nodes of ``cluster``; pods of labelled namespaces run there."""

    cluster: LocalCluster
    workdir: Path
    nodes: int = 10
    pending_seconds: float = 0.0
    run_seconds: float = 1.0
    failure_share: float = 0.0
    instance: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    proc: subprocess.Popen[bytes] | None = None

    @property
    def node_names(self) -> list[str]:
        return [f"kwok-{self.instance}-{i}" for i in range(self.nodes)]

    @property
    def policy_name(self) -> str:
        return f"ksc-kwok-{self.instance}"

    @property
    def log(self) -> Path:
        return self.workdir / "kwok.log"

    def namespace_labels(self) -> dict[str, str]:
        """Labels that send a namespace's Job pods to this kwok's Nodes."""
        return {PODS_LABEL: self.instance}

    def start(self, timeout: float = 60.0) -> None:
        if self.nodes < 1:
            raise ValueError("kwok needs at least one node")
        binary = kwok_binary()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "kwok-stages.yaml"
        stages = node_stages() + pod_stages(
            pending_seconds=self.pending_seconds,
            run_seconds=self.run_seconds,
            failure_share=self.failure_share,
        )
        config.write_text(yaml.safe_dump_all(stages))
        port = free_port()
        args = [
            str(binary),
            f"--kubeconfig={self.cluster.kubeconfig}",
            f"--config={config}",
            f"--manage-nodes-with-label-selector={INSTANCE_LABEL}={self.instance}",
            "--node-ip=127.0.0.1",
            "--cidr=10.128.0.0/12",
            "--node-lease-duration-seconds=0",
            f"--server-address=127.0.0.1:{port}",
        ]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.workdir)}
        self.proc = spawn(args, self.log, env=env, cwd=self.workdir)
        try:
            wait_http(f"http://127.0.0.1:{port}/healthz", self.proc, self.log, timeout)
            objects = node_name_policy(self.policy_name, self.instance, self.node_names)
            objects += [fake_node(name, self.instance) for name in self.node_names]
            self.cluster.kubectl(
                "apply", "--server-side", "--field-manager=ksc-kwok", "-f", "-",
                input=yaml.safe_dump_all(objects),
            )  # fmt: skip
            self._wait_ready(timeout)
            self._wait_policy(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        selector = f"{INSTANCE_LABEL}={self.instance}"
        jsonpath = '{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\\n"}{end}'
        while True:
            self.check_alive()
            out = self.cluster.kubectl(
                "get", "nodes", "-l", selector, "-o", f"jsonpath={jsonpath}"
            ).stdout.split()
            if len(out) == self.nodes and all(s == "True" for s in out):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"kwok nodes not Ready after {timeout}s; log: {self.log}")
            time.sleep(0.2)

    @property
    def probe_namespace(self) -> str:
        return f"ksc-kwok-{self.instance}"

    def _wait_policy(self, timeout: float) -> None:
        """Until the API server applies the new policy (its admission caches lag a moment)."""
        namespace = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": self.probe_namespace, "labels": self.namespace_labels()},
        }
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(namespace))
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "probe",
                "namespace": self.probe_namespace,
                "labels": {JOB_UID_LABEL: "00000000-0000-0000-0000-000000000000"},
            },
            "spec": {"containers": [{"name": "probe", "image": "probe"}]},
        }
        deadline = time.monotonic() + timeout
        while True:
            done = self.cluster.kubectl(
                "create", "--dry-run=server", "-o", "json", "-f", "-",
                input=json.dumps(pod), check=False,
            )  # fmt: skip
            if done.returncode == 0 and json.loads(done.stdout)["spec"].get("nodeName"):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"node placement policy not in effect after {timeout}s")
            time.sleep(0.2)

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"kwok exited with {self.proc.returncode}:\n{tail}")

    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, *, delete: bool = True) -> None:
        """Stop kwok; with ``delete``, remove its policy and Nodes (pods left there are GC'd)."""
        if self.proc is not None:
            stop_process(self.proc)
        if delete:
            self.cluster.kubectl(
                "delete", "mutatingadmissionpolicybinding,mutatingadmissionpolicy",
                self.policy_name, "--ignore-not-found", "--wait=false", check=False,
            )  # fmt: skip
            self.cluster.kubectl(
                "delete", "namespace", self.probe_namespace, "--ignore-not-found",
                "--wait=false", check=False,
            )  # fmt: skip
            self.cluster.kubectl(
                "delete", "nodes", "-l", f"{INSTANCE_LABEL}={self.instance}",
                "--ignore-not-found", "--wait=false", check=False,
            )  # fmt: skip

    def __enter__(self) -> Kwok:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
