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
``kubeclient``: test infrastructure must not share bugs with the code it
tests.

The agent is split by concern: :mod:`hack.nodeagent_api` (its own small
client), :mod:`hack.nodeagent_pod` (volumes, environment, command, filesystem),
:mod:`hack.nodeagent_status` (container and pod statuses) and
:mod:`hack.nodeagent_logs` (the kubelet API); this module is the node itself,
the pod watch and the processes' lifecycle.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import aiohttp
from aiohttp import web

from hack.nodeagent_api import Api, ApiError, Json, now, until_landed
from hack.nodeagent_logs import LogServer
from hack.nodeagent_pod import PodRun, PodSetup, WaitingError
from hack.nodeagent_status import StatusReporter


def _die_with_parent() -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class NodeAgent:
    """The node: registers itself, binds and runs pods, and supervises their processes."""

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
        self.pods: dict[str, PodRun] = {}  # by uid
        self._background: set[asyncio.Task[None]] = set()
        self._binding: set[str] = set()  # uids of pods being bound
        self.setup = PodSetup(api, image_commands)
        self.status = StatusReporter(api)
        self.logs = LogServer(self.pods, port)

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
                self.bind_soon(pod)
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

    def bind_soon(self, pod: Json) -> None:
        """Bind ``pod`` in the background (once at a time per pod): the watch goes on meanwhile."""
        uid = pod["metadata"]["uid"]
        if uid in self._binding:
            return
        self._binding.add(uid)
        task = asyncio.create_task(self.bind(pod))
        self._background.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._background.discard(task)
            self._binding.discard(uid)
            if not task.cancelled() and task.exception() is not None:
                name = pod["metadata"]["name"]
                print(
                    f"node agent: binding {name}: {task.exception()!r}", file=sys.stderr, flush=True
                )

        task.add_done_callback(done)

    async def bind(self, pod: Json) -> None:
        """Bind ``pod`` to this node, however long the API server takes to store it.

        A 409 is not proof that the pod is bound: while etcd goes away the
        binding may conflict and leave the pod unbound (and the watch brings no
        new event of it). So the pod is read again, and bound again until it
        has a node or is gone.
        """
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node},
        }

        async def attempt() -> None:
            try:
                await self.api.request("POST", f"{path}/binding", binding)
                return
            except ApiError as e:
                if e.status == 404:
                    return  # gone
                if e.status != 409:
                    raise
            try:
                current = await self.api.request("GET", path)
            except ApiError as e:
                if e.status == 404:
                    return
                raise
            if (
                current["metadata"]["uid"] != meta["uid"]
                or current["spec"].get("nodeName")
                or current["metadata"].get("deletionTimestamp")
            ):
                return  # bound (by us or another), or going: nothing to do
            raise ApiError(503, "the binding conflicted and the pod is still unbound")

        await until_landed(attempt, f"binding of {meta['namespace']}/{meta['name']}")

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
        # Like kubelet: confirm the deletion once nothing runs any more, however
        # long the API server takes to be able to store it (a pod left Terminating
        # would hold its Job and its run up for ever).
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        with contextlib.suppress(ApiError):  # 404 gone, 409 another pod by now
            await until_landed(
                lambda: self.api.request("DELETE", path, body),
                f"deletion of {meta['namespace']}/{meta['name']}",
            )

    async def run_pod(self, run: PodRun) -> None:
        pod = run.pod
        while True:
            try:
                await self.setup.prepare(run.pod, run.root)
                break
            except WaitingError as e:
                await self.status.report_waiting(run.pod, e.reason, str(e))
                await asyncio.sleep(2)
            except (ApiError, aiohttp.ClientError) as e:
                await self.status.report_waiting(run.pod, "ContainerCreating", str(e))
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
        await self.status.report(run.pod, phase, statuses, start)

    async def run_container(
        self, run: PodRun, container: Json, statuses: dict[str, Json], start: str, restart: str
    ) -> int:
        name = container["name"]
        log_path = run.log_path(name)
        restarts = 0
        while True:
            try:
                env = await self.setup.container_env(run.pod, container, run.root)
                command = self.setup.command_for(container, env)
            except WaitingError as e:
                statuses[name] = self.status.container(
                    container, {"waiting": {"reason": e.reason, "message": str(e)}}, restarts
                )
                await self.status.report(run.pod, "Pending", statuses, start)
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
                    statuses[name] = self.status.terminated(
                        container, 128, "StartError", str(e), restarts
                    )
                    return 128
            run.procs[name] = proc
            started = now()
            statuses[name] = self.status.container(
                container, {"running": {"startedAt": started}}, restarts, ready=True
            )
            await self.status.report(run.pod, "Running", statuses, start)
            code = await proc.wait()
            if code < 0:  # killed by a signal: report like a container runtime does
                code = 128 - code
            message = self.status.termination_message(run.root, container, code, log_path)
            reason = "Completed" if code == 0 else "Error"
            statuses[name] = self.status.terminated(
                container, code, reason, message, restarts, started
            )
            if code == 0 or restart == "Never" or run.deleting:
                return code
            restarts += 1
            await self.status.report(run.pod, "Running", statuses, start)
            await asyncio.sleep(min(10, 2**restarts))

    async def serve(self, cert: Path, key: Path, client_ca: Path) -> web.AppRunner:
        return await self.logs.serve(cert, key, client_ca)

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
