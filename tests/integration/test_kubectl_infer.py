"""``kubectl infer`` as users call it: the real kubectl finds the plugin on PATH.

The controller runs under the chart's RBAC; runner pods are the stand-ins of
tests/conftest.py (``test.local/fake-*``), run by the node agent.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from controller.runview import RERUN_OF_ANNOTATION, Exit
from hack.cluster import LocalCluster
from tests.controllerproc import ControllerProcess
from tests.runs import Runs, inference_config, inference_run, last_execution, status

OK, FAIL, SLOW = "test.local/fake-ok:1", "test.local/fake-fail:1", "test.local/fake-slow:1"
# The console script sits beside the interpreter running the tests.
PLUGIN_DIR = Path(sys.executable).parent


@dataclass
class Done:
    code: int
    out: str
    err: str


async def finish(proc: asyncio.subprocess.Process, within: float = 120) -> Done:
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=within)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return Done(proc.returncode, out.decode(), err.decode())


@dataclass
class KubectlInfer:
    """``kubectl -n NS infer ARGS`` with the plugin on PATH, as a user runs it."""

    cluster: LocalCluster
    namespace: str

    async def start(self, *args: str) -> asyncio.subprocess.Process:
        env = {
            **os.environ,
            "PATH": f"{PLUGIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}",
            "KUBECONFIG": str(self.cluster.kubeconfig),
        }
        return await asyncio.create_subprocess_exec(
            str(self.cluster.bin_dir / "kubectl"),
            "infer",
            "-n",
            self.namespace,
            *args,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )

    async def __call__(self, *args: str) -> Done:
        return await finish(await self.start(*args))

    async def fails(self, *args: str, code: Exit, says: str) -> None:
        """``kubectl infer ARGS`` exits ``code`` and says ``says`` on stderr."""
        done = await self(*args)
        assert done.code == code, done
        assert says in done.err, done.err


@pytest.fixture
def kubectl_infer(cluster: LocalCluster, namespace: str) -> KubectlInfer:
    return KubectlInfer(cluster, namespace)


@pytest.fixture
async def runs(runs: Runs) -> Runs:
    """conftest's ``runs``, with a config for each stand-in image."""
    for name, image in (("ok", OK), ("fail", FAIL), ("slow", SLOW)):
        await runs.create(inference_config(name, image))
    return runs


async def test_submit_watch_follows_a_run_to_success_with_its_log_and_events(
    kubectl_infer: KubectlInfer, controller: ControllerProcess, runs: Runs
) -> None:
    done = await kubectl_infer("submit", "ok", "-p", "table=iris", "--watch", "--logs")
    assert done.code == Exit.SUCCEEDED, done
    lines = done.out.splitlines()
    name = lines[0].removeprefix("inferencerun.ai.krateo.io/").removesuffix(" created")
    assert name.startswith("ok-")
    run = await runs.get(name)
    assert run is not None
    assert run["spec"]["parameters"] == {"table": "iris"}
    assert f"{name}: succeeded: 3 rows, 3 predictions in 0.1s" in lines
    # The runner's own log line, prefixed with its pod.
    assert any(line.startswith("[inf-") and '"rowsDone":3' in line for line in lines), done.out
    assert any(line.startswith("event: Normal") for line in lines), done.out


async def test_a_failed_run_exits_1_with_the_runners_message(
    kubectl_infer: KubectlInfer, controller: ControllerProcess, runs: Runs
) -> None:
    done = await kubectl_infer("submit", "fail", "--name", "f1", "--backoff-limit", "0", "-w")
    assert done.code == Exit.FAILED, done
    last = done.out.splitlines()[-1]
    assert last.startswith("f1: failed: "), done.out
    assert "model answered 503" in last, done.out


async def test_a_run_that_cannot_go_on_exits_3_and_bad_input_is_refused_clearly(
    kubectl_infer: KubectlInfer, controller: ControllerProcess, runs: Runs
) -> None:
    missing = await kubectl_infer("submit", "no-such-config", "-w")
    assert missing.code == Exit.ERROR, missing
    assert "no-such-config" in missing.out.splitlines()[-1], missing.out

    await kubectl_infer.fails(
        "submit", "ok", "-p", "novalue", code=Exit.USAGE, says="'novalue' is not KEY=VALUE"
    )

    # The API server's own words reach the user; nothing is created.
    await kubectl_infer.fails(
        "submit", "ok", "--schedule", "not cron", code=Exit.ERROR, says="schedule"
    )
    listed = await kubectl_infer("list")
    assert "ok-" not in listed.out

    await kubectl_infer.fails(
        "watch", "nobody", code=Exit.NOT_FOUND, says="no InferenceRun 'nobody'"
    )


async def test_rerun_makes_a_new_run_of_a_finished_one_and_refuses_an_unfinished_one(
    kubectl_infer: KubectlInfer, controller: ControllerProcess, runs: Runs
) -> None:
    await runs.create_and_wait(inference_run("first", "ok"), "Succeeded")
    done = await kubectl_infer("rerun", "first", "--name", "second", "-w")
    assert done.code == Exit.SUCCEEDED, done
    second = await runs.get("second")
    first = await runs.get("first")
    assert second is not None
    assert first is not None
    assert second["spec"] == first["spec"]
    assert second["metadata"]["annotations"][RERUN_OF_ANNOTATION] == "first"
    assert status(second)["phase"] == "Succeeded"

    await runs.create_and_wait(inference_run("busy", "slow"), "Running")
    await kubectl_infer.fails("rerun", "busy", code=Exit.NOT_FOUND, says="has not finished")


async def test_trigger_starts_a_scheduled_run_now_and_list_shows_last_results(
    kubectl_infer: KubectlInfer, controller: ControllerProcess, runs: Runs
) -> None:
    # A schedule that will not fire during the test: only the trigger runs it.
    await runs.create_and_wait(inference_run("yearly", "ok", schedule="0 0 1 1 *"), "Scheduled")
    done = await kubectl_infer("trigger", "yearly", "--watch", "--logs")
    assert done.code == Exit.SUCCEEDED, done
    job = done.out.splitlines()[0].removeprefix("job.batch/").split(" ")[0]
    assert job.startswith("inf-yearly-")
    assert f"Job {job}: succeeded" in done.out

    # The controller reports the manual execution like any other.
    await runs.wait(
        "yearly",
        lambda r: last_execution(r).get("name") == job,
        what="the triggered Job as the run's last execution",
    )
    missing = await kubectl_infer("trigger", "no-such-run")
    assert missing.code == Exit.NOT_FOUND

    await runs.create_and_wait(inference_run("oneshot", "ok"), "Succeeded")
    await kubectl_infer.fails(
        "trigger", "oneshot", code=Exit.NOT_FOUND, says="kubectl infer rerun oneshot"
    )

    listed = await kubectl_infer("list")
    assert listed.code == 0
    rows = {line.split()[0]: line for line in listed.out.splitlines()[1:]}
    assert f"{job} Succeeded" in rows["yearly"]
    assert "3 rows, 3 predictions" in rows["oneshot"]


async def test_watch_gives_up_after_its_timeout_and_notices_a_deleted_run(
    kubectl_infer: KubectlInfer, controller: ControllerProcess, runs: Runs
) -> None:
    await runs.create_and_wait(inference_run("long", "slow"), "Running")
    await kubectl_infer.fails(
        "watch", "long", "--wait-timeout", "2", code=Exit.TIMEOUT, says="gave up waiting after 2s"
    )

    follow = await kubectl_infer.start("watch", "long")
    assert follow.stdout is not None
    # Its first line comes once it has read the run: from then on it watches.
    first = await asyncio.wait_for(follow.stdout.readline(), timeout=60)
    assert first.startswith(b"long: phase=Running"), first
    await runs.delete("long")
    gone = await finish(follow)
    assert gone.code == Exit.DELETED, gone
    assert "was deleted" in gone.err
