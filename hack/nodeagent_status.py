"""What the node agent (:mod:`hack.nodeagent`) tells the API server about a pod, as a kubelet would.

Container statuses (waiting, running, terminated with the real exit code and
termination message) and the pod's phase and conditions, patched onto
``pods/status``.
"""

from __future__ import annotations

import asyncio
import sys
from collections import defaultdict
from pathlib import Path

from hack.nodeagent_api import Api, ApiError, Json, now, until_landed

MAX_TERMINATION_MESSAGE = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048


class StatusReporter:
    """Builds container statuses and patches pod statuses through ``api``."""

    def __init__(self, api: Api) -> None:
        self.api = api
        # Per pod uid: the number of its newest report, and one sender at a time,
        # so that a report retried across an outage never lands after a newer one.
        self._newest: dict[str, int] = {}
        self._sending: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._count = 0

    @staticmethod
    def termination_message(root: Path, container: Json, code: int, log_path: Path) -> str:
        """``terminationMessagePath`` under ``root``, else the log tail (FallbackToLogsOnError)."""
        path = container.get("terminationMessagePath") or "/dev/termination-log"
        file = root / path.lstrip("/")
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
    def container(container: Json, state: Json, restarts: int, ready: bool = False) -> Json:
        """One ``containerStatuses`` entry: ``container`` in ``state``."""
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

    def terminated(
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
        return self.container(container, {"terminated": term}, restarts)

    async def report_waiting(self, pod: Json, reason: str, message: str) -> None:
        """Every container waiting for ``reason``: the pod cannot start yet."""
        statuses = {
            c["name"]: self.container(c, {"waiting": {"reason": reason, "message": message}}, 0)
            for c in pod["spec"]["containers"]
        }
        await self.report(pod, "Pending", statuses, now())

    async def report(self, pod: Json, phase: str, statuses: dict[str, Json], start: str) -> None:
        """Patch the pod's status: ``phase``, conditions and the containers' ``statuses``.

        Retried with backoff until it lands (an API server without etcd answers
        5xx, a restarting one refuses connections), the pod is gone (404), or a
        newer report of the same pod replaces it. Returns once one of those is so.
        """
        meta = pod["metadata"]
        uid = meta["uid"]
        self._count += 1
        mine = self._newest[uid] = self._count
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
                statuses[c["name"]] for c in pod["spec"]["containers"] if c["name"] in statuses
            ],
        }
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
        async with self._sending[uid]:
            try:
                await until_landed(
                    lambda: self.api.request(
                        "PATCH",
                        path,
                        {"status": status},
                        content_type="application/merge-patch+json",
                    ),
                    f"status {phase} of {meta['namespace']}/{meta['name']}",
                    wanted=lambda: self._newest.get(uid) == mine,
                )
            except ApiError as e:
                if e.status != 404:
                    print(f"node agent: status of {meta['name']}: {e}", file=sys.stderr, flush=True)
            finally:
                if self._newest.get(uid) == mine:
                    del self._newest[uid]
                    self._sending.pop(uid, None)
