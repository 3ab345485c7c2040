"""A test-only node agent: the kubelet (and scheduler) of the local control plane.

It registers one Ready Node, binds every unscheduled pod to it and runs each
pod's containers as local processes, so that the real Job controller sees real
outcomes. For each pod it:

- materialises ConfigMap, Secret, emptyDir, downwardAPI and projected volumes
  (including service-account tokens from the TokenRequest API, ``ca.crt`` and
  ``namespace``) under a per-pod directory;
- lays the pod's filesystem out under ``<pod dir>/root``: a mount path ``P`` is
  ``$NODE_AGENT_ROOT/P`` (a symlink to the volume, ``subPath`` honoured).
  ``NODE_AGENT_ROOT`` is in the process's environment: that is the one way a
  process learns where its "absolute" paths are;
- builds the environment from ``env`` (values, ``fieldRef`` including
  ``metadata.uid``, ``secretKeyRef``, ``configMapKeyRef``) and ``envFrom``,
  plus ``KUBERNETES_SERVICE_HOST/PORT`` pointing at the local API server;
- runs ``command + args`` (``$(VAR)`` expanded); for a container without a
  command the ``--image-command IMAGE=JSON-LIST`` mapping says what to run;
- reports Running, then the real exit code, reason and termination message
  (``terminationMessagePath`` read from the fake root, with the
  ``FallbackToLogsOnError`` policy) through the pod's status;
- on deletion, SIGTERMs the process group, waits the grace period, SIGKILLs,
  and confirms the deletion like a kubelet does;
- serves the kubelet's ``/containerLogs`` endpoint over mutual TLS, so
  ``kubectl logs`` and the ``pods/log`` API work.

Everything is raw JSON over aiohttp, with its own small client rather than
``controller.kube``: test infrastructure must not share bugs with the code it
tests.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import ctypes
import datetime as dt
import json
import os
import re
import shutil
import signal
import ssl
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiohttp
import yaml
from aiohttp import web

Json = dict[str, Any]

# Environment passed through from the agent to pod processes. KSC_* carries the
# test session's marker so the suite can prove no process outlived it.
PASS_ENV = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "VIRTUAL_ENV", "TZ")
MAX_TERMINATION_MESSAGE = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:500]}")
        self.status = status


class Api:
    """The smallest useful Kubernetes client: JSON in, JSON out."""

    def __init__(self, kubeconfig: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
        cluster = next(c for c in config["clusters"] if c["name"] == context["context"]["cluster"])
        user = next(u for u in config["users"] if u["name"] == context["context"]["user"])
        self.server = cluster["cluster"]["server"].rstrip("/")
        self.ca_file = cluster["cluster"]["certificate-authority"]
        self._headers = {"Authorization": f"Bearer {user['user']['token']}"}
        self._ssl = ssl.create_default_context(cafile=self.ca_file)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers, connector=aiohttp.TCPConnector(ssl=self._ssl)
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Json | None = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> Json:
        data = json.dumps(body) if body is not None else None
        async with self.session.request(
            method,
            self.server + path,
            data=data,
            params=params,
            headers={"Content-Type": content_type},
        ) as resp:
            text = await resp.text()
            if resp.status >= 400:
                raise ApiError(resp.status, text)
            return json.loads(text) if text else {}

    async def watch(self, path: str, params: dict[str, str]) -> AsyncIterator[Json]:
        query = {**params, "watch": "true"}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with self.session.get(self.server + path, params=query, timeout=timeout) as resp:
            if resp.status >= 400:
                raise ApiError(resp.status, await resp.text())
            async for line in resp.content:
                if line.strip():
                    yield json.loads(line)


def _die_with_parent() -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion; ``$$(VAR)`` escapes, unknown names stay as written."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0).startswith("$$"):
            return m.group(0)[1:]
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$\([A-Za-z_][A-Za-z0-9_]*\)|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, value)


def field_ref(pod: Json, path: str) -> str:
    meta = pod["metadata"]
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return str(meta.get(m.group(1), {}).get(m.group(2), ""))
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.hostIP": "127.0.0.1",
        "status.podIP": "127.0.0.1",
    }
    if path not in simple:
        raise ValueError(f"unsupported fieldRef {path!r}")
    return str(simple[path])


class WaitingError(Exception):
    """The pod cannot start yet (e.g. a missing Secret): kubelet keeps it waiting."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class PodRun:
    pod: Json
    root: Path
    task: asyncio.Task[None] | None = None
    procs: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    deleting: bool = False


class NodeAgent:
    def __init__(
        self,
        api: Api,
        node_name: str,
        work_dir: Path,
        port: int,
        image_commands: dict[str, list[str]],
    ) -> None:
        self.api = api
        self.node = node_name
        self.work_dir = work_dir
        self.port = port
        self.image_commands = image_commands
        self.pods: dict[str, PodRun] = {}  # by uid
        self._background: set[asyncio.Task[None]] = set()
        parsed = urlparse(api.server)
        self.api_host, self.api_port = parsed.hostname or "127.0.0.1", str(parsed.port or 443)

    # ---- node ------------------------------------------------------------

    async def register(self) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node,
                "labels": {"kubernetes.io/hostname": self.node, "kubernetes.io/os": "linux"},
            },
        }
        with contextlib.suppress(ApiError):
            await self.api.request("POST", "/api/v1/nodes", node)
        await self.heartbeat()

    async def heartbeat(self) -> None:
        status = {
            "status": {
                "capacity": {"cpu": "16", "memory": "64Gi", "pods": "250"},
                "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "250"},
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": self.node},
                ],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "test node agent is ready",
                        "lastHeartbeatTime": now(),
                        "lastTransitionTime": now(),
                    }
                ],
                "nodeInfo": {
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                    "kubeletVersion": "v1.36.3-nodeagent",
                    "kubeProxyVersion": "",
                    "containerRuntimeVersion": "local-process://1",
                    "bootID": "",
                    "kernelVersion": os.uname().release,
                    "machineID": "",
                    "osImage": "local",
                    "systemUUID": "",
                },
            }
        }
        await self.api.request(
            "PATCH",
            f"/api/v1/nodes/{self.node}/status",
            status,
            content_type="application/merge-patch+json",
        )

    # ---- pods ------------------------------------------------------------

    async def run_forever(self) -> None:
        await self.register()
        rv = ""
        while True:
            try:
                if not rv:
                    listing = await self.api.request("GET", "/api/v1/pods")
                    rv = listing["metadata"]["resourceVersion"]
                    seen = set()
                    for pod in listing["items"]:
                        seen.add(pod["metadata"]["uid"])
                        await self.on_pod(pod)
                    for uid in list(self.pods):
                        if uid not in seen:
                            await self.forget(uid)
                params = {"resourceVersion": rv, "allowWatchBookmarks": "true"}
                params["timeoutSeconds"] = "300"
                async for event in self.api.watch("/api/v1/pods", params):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        rv = ""  # 410 Gone or similar: list again
                        break
                    rv = obj["metadata"]["resourceVersion"]
                    if event["type"] == "DELETED":
                        await self.forget(obj["metadata"]["uid"])
                    elif event["type"] != "BOOKMARK":
                        await self.on_pod(obj)
            except (aiohttp.ClientError, ApiError, TimeoutError) as e:
                print(f"node agent: watch error: {e}", file=sys.stderr, flush=True)
                rv = ""
                await asyncio.sleep(1)

    async def on_pod(self, pod: Json) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        phase = pod.get("status", {}).get("phase")
        if not spec.get("nodeName"):
            if not meta.get("deletionTimestamp") and phase not in ("Succeeded", "Failed"):
                await self.bind(pod)
            return
        if spec["nodeName"] != self.node:
            return
        run = self.pods.get(uid)
        if meta.get("deletionTimestamp"):
            if run is None:
                run = self.pods[uid] = PodRun(pod, self.work_dir / uid)
            if not run.deleting:
                run.deleting = True
                task = asyncio.create_task(self.terminate(run))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            return
        if run is None and phase not in ("Succeeded", "Failed"):
            run = self.pods[uid] = PodRun(pod, self.work_dir / uid)
            run.task = asyncio.create_task(self.run_pod(run))

    async def bind(self, pod: Json) -> None:
        meta = pod["metadata"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node},
        }
        try:
            await self.api.request(
                "POST",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
                binding,
            )
        except ApiError as e:
            if e.status not in (404, 409):
                raise

    async def forget(self, uid: str) -> None:
        run = self.pods.pop(uid, None)
        if run is None:
            return
        await self.kill(run, grace=0)
        if run.task is not None:
            run.task.cancel()
        shutil.rmtree(run.root, ignore_errors=True)

    async def kill(self, run: PodRun, grace: float) -> None:
        procs = [p for p in run.procs.values() if p.returncode is None]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        if procs and grace > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), grace)
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in procs:
            await proc.wait()

    async def terminate(self, run: PodRun) -> None:
        meta = run.pod["metadata"]
        grace = float(meta.get("deletionGracePeriodSeconds") or 0)
        await self.kill(run, grace=min(grace, 30))
        if run.task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(run.task, 10)
        # Like kubelet: confirm the deletion once nothing runs any more.
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        with contextlib.suppress(ApiError):
            await self.api.request("DELETE", path, body)

    # ---- one pod -----------------------------------------------------------

    async def get(self, kind: str, namespace: str, name: str) -> Json | None:
        try:
            return await self.api.request("GET", f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    @staticmethod
    def _data(obj: Json) -> dict[str, bytes]:
        out = {k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()}
        if obj.get("kind") == "Secret":
            out.update({k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()})
        else:
            out.update({k: v.encode() for k, v in (obj.get("data") or {}).items()})
        return out

    async def _source_files(self, pod: Json, src: Json, kind: str) -> dict[str, bytes]:
        """Files of a configMap/secret volume source (``items`` honoured)."""
        ns = pod["metadata"]["namespace"]
        name = src.get("name") or src.get("secretName", "")
        plural = "secrets" if kind == "secret" else "configmaps"
        obj = await self.get(plural, ns, name)
        if obj is None:
            if src.get("optional"):
                return {}
            raise WaitingError("CreateContainerConfigError", f'{kind} "{name}" not found')
        data = self._data(obj)
        if not src.get("items"):
            return data
        files = {}
        for item in src["items"]:
            if item["key"] not in data:
                if src.get("optional"):
                    continue
                raise WaitingError(
                    "CreateContainerConfigError",
                    f"couldn't find key {item['key']} in {kind} {name}",
                )
            files[item["path"]] = data[item["key"]]
        return files

    async def _token(self, pod: Json, src: Json) -> bytes:
        meta, spec = pod["metadata"], pod["spec"]
        sa = spec.get("serviceAccountName") or "default"
        body: Json = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": int(src.get("expirationSeconds", 3607)),
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        if src.get("audience"):
            body["spec"]["audiences"] = [src["audience"]]
        answer = await self.api.request(
            "POST", f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{sa}/token", body
        )
        return str(answer["status"]["token"]).encode()

    async def materialise_volume(self, pod: Json, volume: Json, target: Path) -> None:
        target.mkdir(parents=True, exist_ok=True)
        files: dict[str, bytes] = {}
        if "emptyDir" in volume:
            return
        if "configMap" in volume:
            files = await self._source_files(pod, volume["configMap"], "configMap")
        elif "secret" in volume:
            files = await self._source_files(pod, volume["secret"], "secret")
        elif "downwardAPI" in volume:
            for item in volume["downwardAPI"].get("items", []):
                files[item["path"]] = field_ref(pod, item["fieldRef"]["fieldPath"]).encode()
        elif "projected" in volume:
            for source in volume["projected"].get("sources", []):
                if "serviceAccountToken" in source:
                    sat = source["serviceAccountToken"]
                    files[sat["path"]] = await self._token(pod, sat)
                elif "configMap" in source:
                    files.update(await self._source_files(pod, source["configMap"], "configMap"))
                elif "secret" in source:
                    files.update(await self._source_files(pod, source["secret"], "secret"))
                elif "downwardAPI" in source:
                    for item in source["downwardAPI"].get("items", []):
                        files[item["path"]] = field_ref(pod, item["fieldRef"]["fieldPath"]).encode()
        else:
            raise WaitingError("CreateContainerConfigError", f"unsupported volume {volume['name']}")
        for rel, content in files.items():
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)

    async def container_env(self, pod: Json, container: Json, root: Path) -> dict[str, str]:
        ns = pod["metadata"]["namespace"]
        env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
        env.update({k: v for k, v in os.environ.items() if k.startswith("KSC_")})
        env.update(
            {
                "HOSTNAME": pod["metadata"]["name"],
                "HOME": str(root),
                "NODE_AGENT_ROOT": str(root),
                "KUBERNETES_SERVICE_HOST": self.api_host,
                "KUBERNETES_SERVICE_PORT": self.api_port,
                "KUBERNETES_SERVICE_PORT_HTTPS": self.api_port,
            }
        )
        for source in container.get("envFrom", []):
            prefix = source.get("prefix", "")
            for kind in ("configMapRef", "secretRef"):
                if kind in source:
                    ref = source[kind]
                    plural = "secrets" if kind == "secretRef" else "configmaps"
                    obj = await self.get(plural, ns, ref["name"])
                    if obj is None:
                        if ref.get("optional"):
                            continue
                        raise WaitingError(
                            "CreateContainerConfigError", f'{plural[:-1]} "{ref["name"]}" not found'
                        )
                    env.update({prefix + k: v.decode() for k, v in self._data(obj).items()})
        for var in container.get("env", []):
            name = var["name"]
            if "value" in var:
                env[name] = expand(var["value"], env)
                continue
            source = var.get("valueFrom", {})
            if "fieldRef" in source:
                env[name] = field_ref(pod, source["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in source:
                env[name] = "0"
            else:
                for kind, plural in (
                    ("secretKeyRef", "secrets"),
                    ("configMapKeyRef", "configmaps"),
                ):
                    if kind not in source:
                        continue
                    ref = source[kind]
                    obj = await self.get(plural, ns, ref["name"])
                    value = self._data(obj).get(ref["key"]) if obj else None
                    if value is None:
                        if ref.get("optional"):
                            break
                        raise WaitingError(
                            "CreateContainerConfigError",
                            f'{plural[:-1]} "{ref["name"]}" key "{ref["key"]}" not found',
                        )
                    env[name] = value.decode()
        return env

    def command_for(self, container: Json, env: dict[str, str]) -> list[str]:
        command = list(container.get("command") or [])
        if not command:
            image = container.get("image", "")
            mapped = next(
                (cmd for pattern, cmd in self.image_commands.items() if fnmatch(image, pattern)),
                None,
            )
            if mapped is None:
                raise WaitingError(
                    "ErrImagePull",
                    f"node agent has no command for image {image!r} (--image-command)",
                )
            command = list(mapped)
        return [expand(a, env) for a in command + list(container.get("args") or [])]

    async def prepare(self, run: PodRun) -> None:
        pod, root = run.pod, run.root
        volumes_dir = run.root.parent / f"{run.root.name}-volumes"
        for volume in pod["spec"].get("volumes", []):
            await self.materialise_volume(pod, volume, volumes_dir / volume["name"])
        root.mkdir(parents=True, exist_ok=True)
        (root / "dev").mkdir(exist_ok=True)
        mounts = [m for c in pod["spec"]["containers"] for m in c.get("volumeMounts", [])]
        for mount in sorted(mounts, key=lambda m: m["mountPath"].count("/")):
            source = volumes_dir / mount["name"] / mount.get("subPath", "")
            target = root / mount["mountPath"].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink() or target.exists():
                continue
            if mount.get("subPath") and not source.exists():
                source.mkdir(parents=True)
            target.symlink_to(source)

    async def run_pod(self, run: PodRun) -> None:
        pod = run.pod
        while True:
            try:
                await self.prepare(run)
                break
            except WaitingError as e:
                await self.report_waiting(run, e.reason, str(e))
                await asyncio.sleep(2)
            except (ApiError, aiohttp.ClientError) as e:
                await self.report_waiting(run, "ContainerCreating", str(e))
                await asyncio.sleep(2)
        containers = pod["spec"]["containers"]
        restart = pod["spec"].get("restartPolicy", "Always")
        statuses: dict[str, Json] = {}
        start = now()
        results = await asyncio.gather(
            *(self.run_container(run, c, statuses, start, restart) for c in containers)
        )
        phase = "Succeeded" if all(code == 0 for code in results) else "Failed"
        if run.deleting:
            phase = "Failed" if any(code != 0 for code in results) else "Succeeded"
        await self.report(run, phase, statuses, start)

    async def run_container(
        self, run: PodRun, container: Json, statuses: dict[str, Json], start: str, restart: str
    ) -> int:
        name = container["name"]
        log_path = run.root.parent / f"{run.root.name}-{name}.log"
        restarts = 0
        while True:
            try:
                env = await self.container_env(run.pod, container, run.root)
                command = self.command_for(container, env)
            except WaitingError as e:
                statuses[name] = self._cstatus(
                    container, {"waiting": {"reason": e.reason, "message": str(e)}}, restarts
                )
                await self.report(run, "Pending", statuses, start)
                if run.deleting:
                    return 1
                await asyncio.sleep(2)
                continue
            with log_path.open("ab") as log:
                try:
                    proc = await asyncio.create_subprocess_exec(
                        *command,
                        stdout=log,
                        stderr=log,
                        stdin=asyncio.subprocess.DEVNULL,
                        env=env,
                        cwd=str(run.root),
                        preexec_fn=_die_with_parent,
                        start_new_session=True,
                    )
                except OSError as e:
                    statuses[name] = self._terminated(
                        container, 128, "StartError", str(e), restarts
                    )
                    return 128
            run.procs[name] = proc
            started = now()
            statuses[name] = self._cstatus(
                container, {"running": {"startedAt": started}}, restarts, ready=True
            )
            await self.report(run, "Running", statuses, start)
            code = await proc.wait()
            if code < 0:  # killed by a signal: report like a container runtime does
                code = 128 - code
            message = self.termination_message(run, container, code, log_path)
            reason = "Completed" if code == 0 else "Error"
            statuses[name] = self._terminated(container, code, reason, message, restarts, started)
            if code == 0 or restart == "Never" or run.deleting:
                return code
            restarts += 1
            await self.report(run, "Running", statuses, start)
            await asyncio.sleep(min(10, 2**restarts))

    def termination_message(self, run: PodRun, container: Json, code: int, log_path: Path) -> str:
        path = container.get("terminationMessagePath") or "/dev/termination-log"
        file = run.root / path.lstrip("/")
        message = ""
        if file.is_file():
            message = file.read_bytes()[:MAX_TERMINATION_MESSAGE].decode(errors="replace")
        if (
            not message
            and code != 0
            and container.get("terminationMessagePolicy") == "FallbackToLogsOnError"
        ):
            lines = (
                log_path.read_bytes().splitlines()[-FALLBACK_LOG_LINES:]
                if log_path.exists()
                else []
            )
            message = b"\n".join(lines)[-FALLBACK_LOG_BYTES:].decode(errors="replace")
        return message

    @staticmethod
    def _cstatus(container: Json, state: Json, restarts: int, ready: bool = False) -> Json:
        return {
            "name": container["name"],
            "image": container.get("image", ""),
            "imageID": "",
            "containerID": f"local://{container['name']}",
            "ready": ready,
            "started": "running" in state,
            "restartCount": restarts,
            "state": state,
        }

    def _terminated(
        self,
        container: Json,
        code: int,
        reason: str,
        message: str,
        restarts: int,
        started: str = "",
    ) -> Json:
        term: Json = {
            "exitCode": code,
            "reason": reason,
            "startedAt": started or now(),
            "finishedAt": now(),
        }
        if message:
            term["message"] = message
        return self._cstatus(container, {"terminated": term}, restarts)

    async def report_waiting(self, run: PodRun, reason: str, message: str) -> None:
        statuses = {
            c["name"]: self._cstatus(c, {"waiting": {"reason": reason, "message": message}}, 0)
            for c in run.pod["spec"]["containers"]
        }
        await self.report(run, "Pending", statuses, now())

    async def report(self, run: PodRun, phase: str, statuses: dict[str, Json], start: str) -> None:
        meta = run.pod["metadata"]
        ready = phase == "Running" and all(s.get("ready") for s in statuses.values())
        t = now()
        cond = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": start},
            {"type": "Initialized", "status": "True", "lastTransitionTime": start},
            {"type": "ContainersReady", "status": str(ready), "lastTransitionTime": t},
            {"type": "Ready", "status": str(ready), "lastTransitionTime": t},
        ]
        status: Json = {
            "phase": phase,
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": start,
            "conditions": cond,
            "containerStatuses": [
                statuses[c["name"]] for c in run.pod["spec"]["containers"] if c["name"] in statuses
            ],
        }
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
        try:
            await self.api.request(
                "PATCH", path, {"status": status}, content_type="application/merge-patch+json"
            )
        except ApiError as e:
            if e.status != 404:
                print(f"node agent: status of {meta['name']}: {e}", file=sys.stderr, flush=True)

    # ---- kubelet API: logs -------------------------------------------------

    async def container_logs(self, request: web.Request) -> web.StreamResponse:
        ns, name, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
        run = next(
            (
                r
                for r in self.pods.values()
                if r.pod["metadata"]["namespace"] == ns and r.pod["metadata"]["name"] == name
            ),
            None,
        )
        if run is None:
            raise web.HTTPNotFound(text=f"pod {ns}/{name} is not on this node")
        log_path = run.root.parent / f"{run.root.name}-{container}.log"
        if request.query.get("follow") == "true":
            return await self._follow_log(request, run, container, log_path)
        data = log_path.read_bytes() if log_path.exists() else b""
        if "tailLines" in request.query:
            n = int(request.query["tailLines"])
            data = b"".join(data.splitlines(keepends=True)[-n:]) if n > 0 else b""
        if "limitBytes" in request.query:
            data = data[: int(request.query["limitBytes"])]
        return web.Response(body=data, content_type="text/plain")

    async def _follow_log(
        self, request: web.Request, run: PodRun, container: str, log_path: Path
    ) -> web.StreamResponse:
        """``follow=true``: what the log holds, then what the process adds, until it exits."""
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        offset = 0
        while True:
            proc = run.procs.get(container)
            finished = run.deleting or (proc is not None and proc.returncode is not None)
            if log_path.exists():
                with log_path.open("rb") as f:
                    f.seek(offset)
                    data = f.read()
                if data:
                    offset += len(data)
                    await response.write(data)
            if finished:
                break
            await asyncio.sleep(0.2)
        await response.write_eof()
        return response

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def serve(self, cert: Path, key: Path, client_ca: Path) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self.container_logs)
        app.router.add_get("/healthz", self.healthz)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(client_ca))
        ctx.load_cert_chain(str(cert), str(key))
        ctx.verify_mode = ssl.CERT_REQUIRED  # only the API server (our CA's client cert) may ask
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port, ssl_context=ctx).start()
        return runner

    async def shutdown(self) -> None:
        await asyncio.gather(*(self.kill(r, grace=2) for r in self.pods.values()))


def parse_image_command(spec: str) -> tuple[str, list[str]]:
    image, _, command = spec.partition("=")
    try:
        parsed = json.loads(command)
    except json.JSONDecodeError:
        parsed = None
    if not image or not isinstance(parsed, list) or not all(isinstance(a, str) for a in parsed):
        raise argparse.ArgumentTypeError(f'--image-command wants IMAGE=["cmd", ...], got {spec!r}')
    return image, parsed


async def amain(args: argparse.Namespace) -> None:
    api = Api(args.kubeconfig)
    agent = NodeAgent(api, args.node_name, args.work_dir, args.port, dict(args.image_command))
    args.work_dir.mkdir(parents=True, exist_ok=True)
    runner = await agent.serve(args.tls_cert, args.tls_key, args.client_ca)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    work = asyncio.create_task(agent.run_forever())
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
    work.cancel()
    if work in done:
        work.result()  # surface a crash
    await agent.shutdown()
    await runner.cleanup()
    await api.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hack.nodeagent", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--node-name", default="local-node")
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True, help="kubelet API (logs) port")
    parser.add_argument("--tls-cert", type=Path, required=True)
    parser.add_argument("--tls-key", type=Path, required=True)
    parser.add_argument("--client-ca", type=Path, required=True)
    parser.add_argument(
        "--image-command",
        type=parse_image_command,
        action="append",
        default=[],
        help='GLOB=["cmd", "arg"]: what to run for a container without a command whose '
        "image matches GLOB (first match wins)",
    )
    asyncio.run(amain(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
