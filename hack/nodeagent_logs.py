"""The node agent's kubelet API (:mod:`hack.nodeagent`): ``/containerLogs`` over mutual TLS.

So ``kubectl logs`` and the ``pods/log`` API work against pods the agent runs:
the whole log, ``tailLines``, ``limitBytes`` and ``follow`` until the
container exits.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

from aiohttp import web

from hack.nodeagent_pod import PodRun


class LogServer:
    """Serves the logs of the pods in ``pods`` (the agent's own map, by uid) on ``port``."""

    def __init__(self, pods: dict[str, PodRun], port: int) -> None:
        self.pods = pods
        self.port = port

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
        log_path = run.log_path(container)
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
