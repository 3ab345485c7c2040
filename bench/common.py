"""Helpers shared by benchmarks: /proc readings, audit-log counts, quantiles, the objects.

Nothing here talks to the API server: benchmarks do that through the
controller's own client (``kubeclient.client.KubeClient``). The objects
they create (:func:`config_body`, :func:`run_body`) are written once, here.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kubeclient.resources import API_VERSION, CONFIG_KIND, RUN_KIND

MIB = 2**20
T = TypeVar("T")


def proc_cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process so far (``/proc/<pid>/stat``)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    # Counted from the state field (field 3): utime is field 14, stime 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_bytes(pid: int) -> int:
    """``VmRSS`` of a process, in bytes (``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def readings(read: Callable[[], T], count: int, every: float) -> list[T]:
    """``count`` results of ``read()``, ``every`` seconds apart (memory moves: take several)."""
    values = []
    for index in range(count):
        if index:
            time.sleep(every)
        values.append(read())
    return values


def median_rss(pid: int, samples: int = 5, every: float = 0.4) -> int:
    return int(statistics.median(readings(lambda: proc_rss_bytes(pid), samples, every)))


def mib(value: float) -> str:
    return f"{value / MIB:.1f}"


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def machine() -> str:
    mem = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem = int(line.split()[1]) * 1024
    return (
        f"{os.cpu_count()} cores, {mem / 2**30:.1f} GiB, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}"
    )


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def request_key(event: dict[str, Any]) -> str:
    """``verb resource[/subresource]`` of an audit event."""
    ref = event.get("objectRef") or {}
    what = ref.get("resource", event.get("requestURI", "?"))
    if ref.get("subresource"):
        what += "/" + ref["subresource"]
    return f"{event['verb']} {what}"


@dataclass
class AuditLog:
    """Reads the API server's JSON audit log incrementally, counting requests per user.

    A request counts once: at ``ResponseComplete``, except a watch, which
    counts when it starts (``ResponseStarted``) so an open watch is seen.
    """

    path: Path
    _offset: int = 0
    _partial: bytes = b""
    counts: dict[str, Counter[str]] = field(default_factory=dict)

    def update(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            stage, verb = event.get("stage"), event.get("verb")
            if verb == "watch":
                if stage != "ResponseStarted":
                    continue
            elif stage != "ResponseComplete":
                continue
            user = event.get("user", {}).get("username", "")
            self.counts.setdefault(user, Counter())[request_key(event)] += 1

    def snapshot(self, users: Iterable[str]) -> Counter[str]:
        """Requests of ``users`` so far (call :meth:`update` first)."""
        total: Counter[str] = Counter()
        for user in users:
            total.update(self.counts.get(user, Counter()))
        return total


def since(now: Counter[str], before: Counter[str]) -> Counter[str]:
    """Counts added between two snapshots."""
    diff: Counter[str] = Counter()
    for key, value in now.items():
        if value - before.get(key, 0):
            diff[key] = value - before.get(key, 0)
    return diff


# ------------------------------------------------------------------------------ objects


def config_body(namespace: str, name: str, image: str) -> dict[str, Any]:
    """An InferenceConfig whose runs never reach a real model or storage."""
    storage = {"krateo": {"api": {"endpointRef": {"name": "s"}, "path": "/x", "verb": "POST"}}}
    return {
        "apiVersion": API_VERSION,
        "kind": CONFIG_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "image": image,
            "kserve": {"modelUrl": "m:1/v2/models/m/infer"},
            "storage": {"input": storage, "output": storage},
        },
    }


def run_body(namespace: str, name: str, config: str, **spec: Any) -> dict[str, Any]:
    """An InferenceRun of ``config``; ``spec`` adds fields (``suspend=True``, ``schedule``)."""
    return {
        "apiVersion": API_VERSION,
        "kind": RUN_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"configRef": {"name": config}, "parameters": {"t": "x"}, **spec},
    }
