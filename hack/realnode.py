"""Real nodes for the local control plane: containerd, the kubelet and kube-scheduler.

Where :mod:`hack.nodeagent` imitates a kubelet, this module runs the real
thing, so the project's two images and its Helm chart run as users run them:

1. :func:`prepare` gets everything that is cached across runs: the Debian
   packages (``hack/node/packages.sh``: containerd, runc, the CNI plugins,
   docker.io, debootstrap, iptables), kubelet, kube-scheduler and the pause
   binary (``hack/node/build.sh``) and the Debian base image
   (``hack/node/baseimage.sh``). It needs root, and says so when it is not.
2. :func:`build_images` starts a private dockerd (its layer cache outside the
   repository), builds ``Dockerfile.controller`` and ``Dockerfile.runner``
   unchanged but for ``PYTHON_IMAGE`` (the debootstrap image: there is no
   registry here), and saves them with a pause image into one archive.
3. :class:`RealCluster` starts a :class:`~hack.cluster.LocalCluster` without
   the node agent, kube-scheduler, and :class:`RealNode` s: each a containerd
   and a kubelet of its own (state under ``/var/lib/ksc-nodes``, a cgroup root
   of its own, the images imported), registered with InternalIP ``127.0.0.N``.

Networking stays on loopback: a MutatingAdmissionPolicy (:data:`HOST_NETWORK_POLICY`)
gives every pod ``hostNetwork: true`` and ``KUBERNETES_SERVICE_HOST``/``PORT``
of the API server, so no pod network, kube-proxy or DNS is needed. Host
networking is also why there are two nodes: each node's pods see its own
address as their pod IP, so two controller replicas (the chart's
``hostNetwork`` value binds them to the pod IP) do not clash on one port.

:meth:`RealCluster.stop` removes everything it started: pods' processes (by
cgroup), shims, containerd, the kubelet, mounts, cgroups, the kubelet's
iptables chains and the state directories. :func:`clean_leftovers` does the
same for runs whose owner died without stopping (a killed test session);
``python -m hack.realnode clean`` runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import io
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hack.cluster import (
    REPO,
    LocalCluster,
    StopSignals,
    User,
    ensure_binaries,
    free_port,
    mutating_policy,
    spawn,
    stop_process,
)
from hack.commands import run_tool
from hack.pki import issue

NODE_DIR = REPO / "hack" / "node"
STATE_ROOT = Path("/var/lib/ksc-nodes")
CGROUP_ROOT = Path("/sys/fs/cgroup")
DOCKER = "/usr/bin/docker"  # Debian's client, matching its dockerd (BuildKit built in)
CNI_BIN_DIR = "/usr/lib/cni"

TAG = "dev"
CONTROLLER_IMAGE = f"ksc.local/kserve-inference-controller:{TAG}"
RUNNER_IMAGE = f"ksc.local/kserve-inference-runner:{TAG}"
PAUSE_IMAGE = "ksc.local/pause:3.10"
IMAGES = (CONTROLLER_IMAGE, RUNNER_IMAGE, PAUSE_IMAGE)

# kube-controller-manager controllers a real node and the chart need beyond the
# Job-orchestrating set: node health, NoExecute taints (since 1.29 the taint
# manager is its own controller: without it a NoExecute taint, including the
# ``out-of-service`` one and the node lifecycle's ``unreachable``, evicts
# nothing), and Deployments with their disruption budget.
NODE_CONTROLLERS = (
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "deployment-controller",
    "replicaset-controller",
    "disruption-controller",
)
# Chains the kubelet creates (pkg/kubelet/kubelet_network_linux.go).
KUBELET_CHAINS = ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT")
UNINITIALIZED_TAINT = "node.cloudprovider.kubernetes.io/uninitialized"


def cache_root() -> Path:
    base = os.environ.get("KSC_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kserve-controller"
    )
    return Path(base)


class NodeUnavailable(RuntimeError):
    """This machine cannot run a real node; the message says what is missing."""


def _script(name: str) -> Path:
    done = subprocess.run(["bash", str(NODE_DIR / name)], capture_output=True, text=True)
    if done.returncode != 0:
        raise NodeUnavailable(f"hack/node/{name}: {done.stderr.strip()[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else Path()


def missing_prerequisites() -> str | None:
    """Why a real node cannot run here (one line), or None when it can be set up."""
    if sys.platform != "linux":
        return "a real node needs Linux"
    if os.geteuid() != 0:
        return "a real node needs root (containerd, the kubelet, debootstrap)"
    if not (CGROUP_ROOT / "memory").is_dir() and not (CGROUP_ROOT / "cgroup.controllers").exists():
        return f"no cgroup filesystem at {CGROUP_ROOT}"
    for tool in ("go", "gcc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (kubelet and pause are built here)"
    return None


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` found or built; all of it cached outside the repository."""

    control_plane: Path
    node_bin: Path
    base_tar: Path


def prepare() -> Prepared:
    """Packages, binaries and the base image, each installed or built once and reused."""
    why = missing_prerequisites()
    if why:
        raise NodeUnavailable(why)
    _script("packages.sh")
    return Prepared(
        control_plane=ensure_binaries(),
        node_bin=_script("build.sh"),
        base_tar=_script("baseimage.sh"),
    )


# ---- images ----------------------------------------------------------------


def _run(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 900) -> str:
    return run_tool(args, shown=" ".join(args), env=env, timeout=timeout, tail=3000).stdout


@contextlib.contextmanager
def dockerd() -> Iterator[dict[str, str]]:
    """A private dockerd for building images; yields the environment for the docker client.

    Its layer cache lives in the cache directory, so unchanged layers (the
    base image, the dependency installs) are reused by later runs. One build
    at a time uses it (a lock), and it leaves no bridge or iptables rules:
    builds use the host's network.
    """
    data_root = cache_root() / "node" / "docker"
    data_root.mkdir(parents=True, exist_ok=True)
    lock = (cache_root() / "node" / "docker.lock").open("w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    exec_root = Path(tempfile.mkdtemp(prefix="ksc-docker-", dir="/run"))
    sock = exec_root / "docker.sock"
    args = [
        "dockerd",
        f"--data-root={data_root}",
        f"--exec-root={exec_root}",
        f"--pidfile={exec_root / 'docker.pid'}",
        f"--host=unix://{sock}",
        "--iptables=false",
        "--ip-masq=false",
        "--bridge=none",
        "--storage-driver=overlay2",
        "--exec-opt=native.cgroupdriver=cgroupfs",
        "--log-level=warn",
    ]
    log = exec_root / "dockerd.log"
    proc = spawn(args, log)
    env = {**os.environ, "DOCKER_HOST": f"unix://{sock}", "DOCKER_BUILDKIT": "1"}
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([DOCKER, "version"], env=env, capture_output=True).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
        yield env
    finally:
        stop_process(proc, grace=20)
        _unmount_under(exec_root)
        shutil.rmtree(exec_root, ignore_errors=True)
        lock.close()


def _pause_tar(pause_bin: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tar.gettarinfo(str(pause_bin), arcname="pause")
        info.mode, info.uid, info.gid = 0o755, 0, 0
        with pause_bin.open("rb") as f:
            tar.addfile(info, f)
    return buf.getvalue()


def build_images(prepared: Prepared, out: Path) -> Path:
    """Build both images from the repository's Dockerfiles; return one archive of all three."""
    archive = out / "images.tar"
    with dockerd() as env:
        _build_images(prepared, env)
        _run([DOCKER, "save", "-o", str(archive), *IMAGES], env=env)
    return archive


def fill_layer_cache(prepared: Prepared) -> bool:
    """Build both images if the layer cache never built on this base image; whether it did.

    On a cold cache the images' dependency layers take minutes; filled ahead
    of the node tier, its own :func:`build_images` reuses every layer.
    """
    with dockerd() as env:
        if _has_image(env, _base_image(prepared)):
            return False
        _build_images(prepared, env)
    return True


def _base_image(prepared: Prepared) -> str:
    return f"ksc.local/python:bookworm-{prepared.base_tar.stem.rsplit('-', 1)[-1]}"


def _has_image(env: dict[str, str], image: str) -> bool:
    inspected = subprocess.run([DOCKER, "image", "inspect", image], env=env, capture_output=True)
    return inspected.returncode == 0


def _build_images(prepared: Prepared, env: dict[str, str]) -> None:
    """Both images and the pause image, in the dockerd of ``env``."""
    base_image = _base_image(prepared)
    if not _has_image(env, base_image):
        _run(
            [DOCKER, "import", "--change", "ENV LANG=C.UTF-8", str(prepared.base_tar), base_image],
            env=env,
        )
    pause = subprocess.run(
        [DOCKER, "import", "--change", 'ENTRYPOINT ["/pause"]', "-", PAUSE_IMAGE],
        input=_pause_tar(prepared.node_bin / "pause"),
        env=env,
        capture_output=True,
    )
    if pause.returncode != 0:
        raise RuntimeError(f"docker import pause failed: {pause.stderr.decode()[-2000:]}")
    for image, dockerfile in (
        (CONTROLLER_IMAGE, "Dockerfile.controller"),
        (RUNNER_IMAGE, "Dockerfile.runner"),
    ):
        _run(
            [
                DOCKER, "build", "--network=host", "--progress=plain",
                "-f", str(REPO / dockerfile), "--build-arg", f"PYTHON_IMAGE={base_image}",
                "-t", image, str(REPO),
            ],
            env=env,
            timeout=1800,
        )  # fmt: skip


# ---- nodes -----------------------------------------------------------------


def _unmount_under(root: Path) -> None:
    """Unmount everything mounted below ``root``, deepest first (lazily: busy is fine)."""
    prefix = str(root).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    for point in sorted(
        (p for p in points if p.startswith(prefix) or p == str(root)), key=len, reverse=True
    ):
        subprocess.run(["umount", "-l", point], capture_output=True)


def _cgroup_dirs(name: str) -> list[Path]:
    """The directories of cgroup root ``name`` in every mounted v1 hierarchy (or the v2 one)."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return [CGROUP_ROOT / name]
    found: list[Path] = []
    for hierarchy in CGROUP_ROOT.iterdir():
        if hierarchy.is_dir() and not hierarchy.is_symlink() and (hierarchy / name).is_dir():
            found.append(hierarchy / name)
    return found


def _make_cgroup(name: str) -> None:
    """Create cgroup root ``name`` in every hierarchy: the kubelet needs its cgroupRoot to exist."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        (CGROUP_ROOT / name).mkdir(exist_ok=True)
        return
    for hierarchy in CGROUP_ROOT.iterdir():
        if (
            not hierarchy.is_dir()
            or hierarchy.is_symlink()
            or not (hierarchy / "cgroup.procs").exists()
        ):
            continue
        (hierarchy / name).mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":
            # A new v1 cpuset has no CPUs or memory nodes until given its parent's.
            for knob in ("cpuset.cpus", "cpuset.mems"):
                (hierarchy / name / knob).write_text((hierarchy / knob).read_text())


def _cgroup_tree(top: Path) -> list[Path]:
    """``top`` and every cgroup below it, deepest first.

    The walk skips what vanishes under it: a container's shim removes its
    cgroup as the container dies, while this walks (``Path.rglob`` raised
    ``FileNotFoundError`` then, failing the tier's teardown).
    """
    found = [Path(root) for root, _, _ in os.walk(top)]  # os.walk ignores scandir errors
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _kill_cgroup(name: str) -> None:
    """SIGKILL every process under cgroup root ``name`` until none is left; remove the cgroups."""
    dirs = _cgroup_dirs(name)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids: set[int] = set()
        for top in dirs:
            for cgroup in _cgroup_tree(top):
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in (cgroup / "cgroup.procs").read_text().split())
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    for top in dirs:
        for cgroup in _cgroup_tree(top):  # deepest first, ``top`` last
            with contextlib.suppress(OSError):
                cgroup.rmdir()


def _kill_matching(needle: str) -> None:
    """SIGKILL processes whose command line contains ``needle`` (containerd shims of a node)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace"
            ):
                os.kill(int(entry.name), signal.SIGKILL)


def _iptables_chains() -> dict[str, set[str]]:
    chains: dict[str, set[str]] = {}
    for table in ("filter", "nat", "mangle"):
        done = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True)
        chains[table] = {
            line.split()[1] for line in done.stdout.splitlines() if line.startswith("-N ")
        }
    return chains


def _remove_iptables_chains(keep: dict[str, set[str]]) -> None:
    """Delete the kubelet's chains (and rules jumping to them) that were not there before."""
    for table in ("filter", "nat", "mangle"):
        done = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True)
        if done.returncode != 0:
            continue
        ours = {c for c in KUBELET_CHAINS if c not in keep.get(table, set())}
        for line in done.stdout.splitlines():
            parts = line.split()
            jumps = parts[:1] == ["-A"] and "-j" in parts and parts[parts.index("-j") + 1] in ours
            if jumps and parts[1] not in ours:
                subprocess.run(["iptables", "-t", table, "-D", *parts[1:]], capture_output=True)
        for chain in ours:
            subprocess.run(["iptables", "-t", table, "-F", chain], capture_output=True)
            subprocess.run(["iptables", "-t", table, "-X", chain], capture_output=True)


@dataclass
class RealNode:
    """One containerd and one kubelet, registered as ``name`` with InternalIP ``ip``."""

    name: str
    ip: str
    state: Path
    node_bin: Path
    kubelet_port: int = 0
    healthz_port: int = 0
    _procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    @property
    def cgroup_root(self) -> str:
        return f"ksc-{self.state.parent.name}-{self.name}"

    @property
    def containerd_sock(self) -> Path:
        return self.state / "containerd.sock"

    @property
    def log_dir(self) -> Path:
        return self.state / "logs"

    def ctr(self, *args: str, timeout: float = 300) -> str:
        return _run(
            ["ctr", f"--address={self.containerd_sock}", "--namespace=k8s.io", *args],
            timeout=timeout,
        )

    def start_containerd(self) -> None:
        (self.state / "cni").mkdir(parents=True, exist_ok=True)
        # Every pod here uses the host network, so the CNI config is only the
        # loopback plugin; the runtime reports its network ready with it.
        (self.state / "cni" / "10-loopback.conflist").write_text(
            json.dumps(
                {"cniVersion": "0.4.0", "name": "ksc-loopback", "plugins": [{"type": "loopback"}]}
            )
        )
        config = f"""version = 2
root = "{self.state / "containerd"}"
state = "{self.state / "containerd-state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{self.containerd_sock}"
[ttrpc]
  address = "{self.state / "containerd.sock.ttrpc"}"
[debug]
  level = "warn"
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # This machine lacks CAP_SYS_RESOURCE: without it every sandbox fails with
  # "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{self.state / "cni"}"
"""
        (self.state / "containerd.toml").write_text(config)
        proc = spawn(
            ["containerd", f"--config={self.state / 'containerd.toml'}"],
            self.log_dir / "containerd.log",
        )
        self._procs.append(("containerd", proc))
        deadline = time.monotonic() + 60
        while subprocess.run(
            ["ctr", f"--address={self.containerd_sock}", "version"], capture_output=True
        ).returncode:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "containerd did not start:\n"
                    + (self.log_dir / "containerd.log").read_text()[-3000:]
                )
            time.sleep(0.2)

    def start_kubelet(self, cluster: LocalCluster, user: str) -> None:
        assert cluster.pki is not None
        cert, key = issue(
            cluster.pki, f"kubelet-{self.name}", self.name, server=True, ips=(self.ip,)
        )
        self.kubelet_port, self.healthz_port = free_port(), free_port()
        _make_cgroup(self.cgroup_root)
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.ip,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": self.ip,
            "healthzPort": self.healthz_port,
            "tlsCertFile": str(cert),
            "tlsPrivateKeyFile": str(key),
            # The API server is the only client (kubectl logs/exec): its client
            # certificate from the cluster CA is the authentication.
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(cluster.pki.ca_cert)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_sock}",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup_root}",
            "cgroupsPerQOS": True,
            "failCgroupV1": False,  # this machine has cgroup v1
            "failSwapOn": False,
            "podLogsDir": str(self.state / "pod-logs"),
            "resolvConf": "/etc/resolv.conf",
            "serializeImagePulls": False,
            # Images come from an archive (pull policy Never): never collect them,
            # and never evict for a disk that is merely full-ish.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "nodeStatusUpdateFrequency": "10s",
            "shutdownGracePeriod": "0s",
            "localStorageCapacityIsolation": True,
            "maxPods": 50,
        }
        (self.state / "kubelet.yaml").write_text(yaml.safe_dump(config))
        args = [
            str(self.node_bin / "kubelet"),
            f"--config={self.state / 'kubelet.yaml'}",
            f"--kubeconfig={cluster.kubeconfig_for(user)}",
            f"--hostname-override={self.name}",
            f"--root-dir={self.state / 'kubelet'}",
            f"--cert-dir={self.state / 'kubelet-pki'}",
            # No cloud: this harness sets the node's loopback InternalIP (the
            # kubelet refuses a loopback --node-ip) and clears the taint.
            "--cloud-provider=external",
            "--v=1",
        ]
        self._procs.append(("kubelet", spawn(args, self.log_dir / "kubelet.log")))

    @property
    def kubelet_running(self) -> bool:
        return any(name == "kubelet" and proc.poll() is None for name, proc in self._procs)

    def stop_kubelet(self) -> None:
        """Stop the kubelet alone: containerd and the pods' containers keep running.

        The node then stops reporting, as one cut off from the API server does:
        the node lifecycle controller calls it NotReady, and nothing confirms
        the deletion of its pods. :meth:`start_kubelet` brings it back.
        """
        for entry in [e for e in self._procs if e[0] == "kubelet"]:
            stop_process(entry[1], grace=10)
            self._procs.remove(entry)

    def check_alive(self) -> None:
        for name, proc in self._procs:
            if proc.poll() is not None:
                log = self.log_dir / f"{name}.log"
                tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                raise RuntimeError(f"{self.name}: {name} exited with {proc.returncode}:\n{tail}")

    def stop(self) -> None:
        """Stop the kubelet first (so nothing restarts pods), then the pods, shims, containerd."""
        for name, proc in reversed(self._procs):
            if name == "kubelet":
                stop_process(proc, grace=10)
        _kill_cgroup(self.cgroup_root)
        _kill_matching(f"-address {self.containerd_sock}")
        for name, proc in reversed(self._procs):
            if name != "kubelet":
                stop_process(proc, grace=10)
        self._procs.clear()
        _unmount_under(self.state)


@dataclass
class RealCluster:
    """A local control plane with kube-scheduler and real nodes instead of the node agent."""

    prepared: Prepared
    images: Path
    nodes_count: int = 2
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ksc-realnode-")))
    cluster: LocalCluster | None = None
    nodes: list[RealNode] = field(default_factory=list)
    state: Path | None = None
    _scheduler: subprocess.Popen[bytes] | None = None
    _chains_before: dict[str, set[str]] = field(default_factory=dict)

    def node_names(self) -> list[str]:
        return [f"ksc-node-{i + 1}" for i in range(self.nodes_count)]

    def start(self, timeout: float = 180) -> None:
        STATE_ROOT.mkdir(parents=True, exist_ok=True)
        self.state = Path(tempfile.mkdtemp(prefix="", dir=STATE_ROOT))
        (self.state / "owner.pid").write_text(str(os.getpid()))
        self._chains_before = _iptables_chains()
        users = {
            f"node-{n}": User(f"system:node:{n}", secrets.token_hex(16), ("system:nodes",))
            for n in self.node_names()
        }
        users["scheduler"] = User("system:kube-scheduler", secrets.token_hex(16))
        self.cluster = LocalCluster(
            bin_dir=self.prepared.control_plane,
            workdir=self.workdir / "cluster",
            node_agent=False,
            extra_users=users,
            extra_controllers=NODE_CONTROLLERS,
        )
        try:
            self.cluster.start(timeout)
            self._setup_api()
            self._start_scheduler()
            for i, name in enumerate(self.node_names()):
                node = RealNode(name, f"127.0.0.{i + 2}", self.state / name, self.prepared.node_bin)
                self.nodes.append(node)
                node.start_containerd()
                node.ctr("images", "import", str(self.images))
                node.start_kubelet(self.cluster, f"node-{name}")
            self._wait_nodes_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def _setup_api(self) -> None:
        assert self.cluster is not None
        kubectl = self.cluster.kubectl
        # The API server authorizes with RBAC only (no Node authorizer): bind the
        # kubelets' group to the role the Node authorizer would grant.
        kubectl(
            "create",
            "clusterrolebinding",
            "ksc-nodes",
            "--clusterrole=system:node",
            "--group=system:nodes",
        )
        kubectl(
            "apply", "-f", "-", input=yaml.safe_dump_all(host_network_policy(self.cluster.api_port))
        )

    def _start_scheduler(self) -> None:
        assert self.cluster is not None
        kubeconfig = self.cluster.kubeconfig_for("scheduler")
        args = [
            str(self.prepared.node_bin / "kube-scheduler"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
        ]
        self._scheduler = spawn(args, self.workdir / "cluster" / "logs" / "kube-scheduler.log")

    def node(self, name: str) -> RealNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no real node {name!r} (nodes: {[n.name for n in self.nodes]})")

    def lose_node(self, name: str) -> None:
        """Cut node ``name`` off: its kubelet stops, its containers keep running."""
        self.node(name).stop_kubelet()

    def restore_node(self, name: str, timeout: float = 300) -> None:
        """Start node ``name``'s kubelet again (if stopped) and wait for the node Ready.

        The kubelet finds the containers of pods the API no longer has (deleted
        while it was away) and stops them.
        """
        assert self.cluster is not None
        node = self.node(name)
        if not node.kubelet_running:
            node.start_kubelet(self.cluster, f"node-{name}")
        self._wait_nodes_ready(timeout, names=(name,))

    def _wait_nodes_ready(self, timeout: float, names: tuple[str, ...] | None = None) -> None:
        """Set each node's loopback address, clear the cloud taint, wait for Ready."""
        assert self.cluster is not None
        deadline = time.monotonic() + timeout
        pending = {n.name: n for n in self.nodes if names is None or n.name in names}
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"nodes not Ready after {timeout}s: {sorted(pending)}; logs in {self.state}"
                )
            for node in self.nodes:
                node.check_alive()
            if self._scheduler is not None and self._scheduler.poll() is not None:
                raise RuntimeError(
                    "kube-scheduler exited; log in " + str(self.workdir / "cluster" / "logs")
                )
            for name, node in list(pending.items()):
                got = self.cluster.kubectl("get", "node", name, "-o", "json", check=False)
                if got.returncode != 0:
                    continue
                obj = json.loads(got.stdout)
                addresses = obj.get("status", {}).get("addresses") or []
                if not any(a == {"type": "InternalIP", "address": node.ip} for a in addresses):
                    patch = {"status": {"addresses": [
                        {"type": "InternalIP", "address": node.ip},
                        {"type": "Hostname", "address": name},
                    ]}}  # fmt: skip
                    self.cluster.kubectl(
                        "patch",
                        "node",
                        name,
                        "--subresource=status",
                        "--type=merge",
                        "-p",
                        json.dumps(patch),
                    )
                taints = obj.get("spec", {}).get("taints") or []
                if any(t.get("key") == UNINITIALIZED_TAINT for t in taints):
                    self.cluster.kubectl(
                        "taint", "node", name, f"{UNINITIALIZED_TAINT}-", check=False
                    )
                    continue
                conditions = {
                    c["type"]: c["status"] for c in obj.get("status", {}).get("conditions", [])
                }
                if conditions.get("Ready") == "True" and addresses:
                    del pending[name]
            time.sleep(0.5)

    def check_alive(self) -> None:
        """Raise if a node's containerd or kubelet has exited."""
        for node in self.nodes:
            node.check_alive()

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()
        if self._scheduler is not None:
            stop_process(self._scheduler)
        if self.cluster is not None:
            self.cluster.stop()
        _remove_iptables_chains(self._chains_before)
        if self.state is not None:
            _unmount_under(self.state)
            shutil.rmtree(self.state, ignore_errors=True)
        self.nodes.clear()

    def __enter__(self) -> RealCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def host_network_policy(api_port: int) -> list[dict[str, Any]]:
    """Test-only admission: every pod on the host network, talking to the API server on loopback.

    Tests here may only send traffic to 127.0.0.0/8, so there is no pod
    network; the ``kubernetes`` Service's cluster IP does not route either.
    Explicit container env wins over the kubelet's service variables.
    """
    env = (
        '[Object.spec.containers.env{name: "KUBERNETES_SERVICE_HOST", value: "127.0.0.1"},'
        f' Object.spec.containers.env{{name: "KUBERNETES_SERVICE_PORT", value: "{api_port}"}}]'
    )
    expression = (
        'Object{spec: Object.spec{hostNetwork: true, dnsPolicy: "ClusterFirstWithHostNet",'
        " containers: object.spec.containers.map(c,"
        f" Object.spec.containers{{name: c.name, env: {env}}})"
        "}}"
    )
    return mutating_policy("ksc-test-host-network", expression, reinvocation="IfNeeded")


def clean_leftovers() -> list[str]:
    """Stop what runs of this module left behind when their owner died; names what it removed."""
    removed: list[str] = []
    if not STATE_ROOT.is_dir():
        return removed
    for state in STATE_ROOT.iterdir():
        owner = state / "owner.pid"
        with contextlib.suppress(OSError, ValueError):
            pid = int(owner.read_text())
            if Path(f"/proc/{pid}").exists():
                continue  # a live run's
        for node_state in (p for p in state.iterdir() if p.is_dir()):
            _kill_cgroup(f"ksc-{state.name}-{node_state.name}")
            _kill_matching(str(node_state))
        _unmount_under(state)
        shutil.rmtree(state, ignore_errors=True)
        removed.append(str(state))
    if removed:
        _remove_iptables_chains({})
    return removed


@contextlib.contextmanager
def real_cluster(nodes: int = 2) -> Iterator[RealCluster]:
    """Prepare, build the images, start a cluster with real nodes; stop and clean on exit."""
    clean_leftovers()
    prepared = prepare()
    out = Path(tempfile.mkdtemp(prefix="ksc-images-"))
    try:
        images = build_images(prepared, out)
        real = RealCluster(prepared=prepared, images=images, nodes_count=nodes)
        try:
            real.start()
            yield real
        finally:
            real.stop()
            shutil.rmtree(real.workdir, ignore_errors=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hack.realnode", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser(
        "prepare", help="install packages, build kubelet/scheduler/pause and the base image"
    )
    prep.add_argument(
        "--if-possible",
        action="store_true",
        help="where a real node cannot run (not root...), say why and exit 0",
    )
    images = sub.add_parser(
        "images", help="prepare, then build both images (a smoke test of the Dockerfiles)"
    )
    images.add_argument(
        "--if-possible",
        action="store_true",
        help="where a real node cannot run (not root...), say why and exit 0",
    )
    images.add_argument(
        "--if-cold",
        action="store_true",
        help="only fill an empty layer cache (the node tier's own build then reuses it)",
    )
    up = sub.add_parser(
        "up", help="a control plane with real nodes in the foreground (Ctrl-C stops it)"
    )
    up.add_argument("--nodes", type=int, default=2)
    sub.add_parser("clean", help="remove what killed runs left behind")
    args = parser.parse_args(argv)
    try:
        if args.command == "clean":
            for path in clean_leftovers():
                print(f"removed {path}")
            return 0
        why = missing_prerequisites()
        if args.command in ("prepare", "images") and args.if_possible and why:
            print(f"real-node tier unavailable here ({why}): it will skip")
            return 0
        prepared = prepare()
        if args.command == "prepare":
            print(prepared)
            return 0
        if args.command == "images" and args.if_cold:
            filled = fill_layer_cache(prepared)
            print("images built into the empty layer cache" if filled else "layer cache warm")
            return 0
        if args.command == "images":
            with tempfile.TemporaryDirectory() as tmp:
                print(build_images(prepared, Path(tmp)))
            return 0
        stop = StopSignals()
        with real_cluster(args.nodes) as real:
            assert real.cluster is not None
            print(f"control plane with {args.nodes} real nodes at {real.cluster.server}")
            print(f"  export KUBECONFIG={real.cluster.kubeconfig}")
            print(f"  kubectl: {real.cluster.bin_dir / 'kubectl'}")
            print("Ctrl-C stops it and removes everything it started.", flush=True)
            stop.wait(real.check_alive)
    except NodeUnavailable as e:
        print(f"real node unavailable: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
