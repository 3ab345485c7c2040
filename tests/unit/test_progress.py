"""Live progress of a run: the furthest each shard got, never going back."""

from __future__ import annotations

from typing import Any

from controller.reconcile import Reconciler


class Logs:
    """The pods/log answers a runner's pods would give (the only call _progress makes)."""

    def __init__(self) -> None:
        self.tails: dict[str, str] = {}

    async def read_pod_log(self, namespace: str, name: str, **_: Any) -> str:
        return self.tails[name]


def line(done: int, total: int) -> str:
    return f'{{"event":"progress","rowsDone":{done},"rowsTotal":{total}}}\n'


def pod(name: str, index: str, running: bool = True) -> dict[str, Any]:
    state = {"running": {}} if running else {"terminated": {"exitCode": 1}}
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": {"batch.kubernetes.io/job-completion-index": index},
        },
        "status": {"containerStatuses": [{"name": "inference", "state": state}]},
    }


def reconciler(logs: Logs) -> Reconciler:
    return Reconciler(client=logs, caches=None, events=None, progress_interval=0.0)


async def test_shards_add_up_and_a_retried_shard_keeps_its_furthest_attempt() -> None:
    logs = Logs()
    r = reconciler(logs)
    logs.tails = {"a": line(40, 100), "b": line(70, 100)}
    progress = await r._progress("ns/run", [pod("a", "0"), pod("b", "1")])
    assert progress is not None
    assert (progress.rows_done, progress.rows_total) == (110, 200)
    # Shard 1's pod failed; its next attempt starts over.
    logs.tails["b2"] = line(5, 100)
    logs.tails["a"] = line(60, 100)
    progress = await r._progress("ns/run", [pod("a", "0"), pod("b", "1", False), pod("b2", "1")])
    assert progress is not None
    assert (progress.rows_done, progress.rows_total) == (130, 200)


async def test_between_attempts_the_progress_stands() -> None:
    logs = Logs()
    r = reconciler(logs)
    logs.tails = {"a": line(30, 100)}
    await r._progress("ns/run", [pod("a", "0")])
    progress = await r._progress("ns/run", [pod("a", "0", running=False)])
    assert progress is not None
    assert progress.rows_done == 30
    r.forget("ns/run")
    assert await r._progress("ns/run", []) is None
