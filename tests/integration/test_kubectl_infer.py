"""``kubectl infer`` as users call it: the real kubectl finds the plugin on PATH.

The controller runs under the chart's RBAC; runner pods are the stand-ins of
tests/conftest.py (``test.local/fake-*``), run by the node agent.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from hack.cluster import LocalCluster
from hack.controllerproc import ControllerProcess
from kubectl_infer.runview import RERUN_OF_ANNOTATION, Exit
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
    """``kubectl infer -n NS ARGS`` with the plugin on PATH, as a user runs it."""

    cluster: LocalCluster
    namespace: str

    async def start(self, *args: str) -> asyncio.subprocess.Process:
        return await self.kubectl("infer", "-n", self.namespace, *args)

    async def kubectl(
        self, *args: str, kubeconfig: str | None = None
    ) -> asyncio.subprocess.Process:
        """``kubectl ARGS`` with ``$KUBECONFIG`` (the cluster's admin one unless given)."""
        env = {
            **os.environ,
            "PATH": f"{PLUGIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}",
            "KUBECONFIG": str(self.cluster.kubeconfig) if kubeconfig is None else kubeconfig,
        }
        return await asyncio.create_subprocess_exec(
            str(self.cluster.bin_dir / "kubectl"),
            *args,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )

    async def __call__(self, *args: str) -> Done:
        return await finish(await self.start(*args))

    async def plain(self, *args: str, kubeconfig: str | None = None) -> Done:
        """``kubectl infer ARGS``: no ``-n`` added."""
        return await finish(await self.kubectl("infer", *args, kubeconfig=kubeconfig))

    async def complete(self, *words: str) -> list[str]:
        """What kubectl's shell completion offers for ``kubectl infer WORDS``, asserting its
        directive: 4 (no file names)."""
        done = await finish(await self.kubectl("__complete", "infer", *words))
        assert done.code == 0, done
        lines = done.out.splitlines()
        assert lines, done
        assert lines[-1] == ":4", done
        return lines[:-1]

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
    # A config that comes later: submitted on purpose, the run says what it waits for.
    missing = await kubectl_infer("submit", "no-such-config", "--no-wait-for-config", "-w")
    assert missing.code == Exit.ERROR, missing
    assert "no-such-config" in missing.out.splitlines()[-1], missing.out
    assert "warning: InferenceConfig 'no-such-config' does not exist" in missing.err

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


def one_error_line(done: Done, code: Exit, says: str) -> None:
    """The plugin exited ``code`` with one line on stderr saying ``says``: no traceback."""
    assert done.code == code, done
    lines = done.err.splitlines()
    assert len(lines) == 1, done.err
    assert lines[0].startswith("error: "), done.err
    assert says in lines[0], done.err
    assert done.out == "", done


async def test_kubeconfig_files_merge_as_kubectl_merges_them_and_flags_go_anywhere(
    kubectl_infer: KubectlInfer, crds: None, runs: Runs, tmp_path: Path
) -> None:
    await runs.create(inference_run("mine", "ok"))
    admin = yaml.safe_load(kubectl_infer.cluster.kubeconfig.read_text())
    (user,) = admin["users"]
    # b: the admin's credentials and cluster, but its current context is a dead end.
    b = {
        **admin,
        "clusters": [
            *admin["clusters"],
            {"name": "dead", "cluster": {"server": "https://127.0.0.1:9"}},
        ],
        "contexts": [
            *admin["contexts"],
            {"name": "elsewhere", "context": {"cluster": "dead", "user": user["name"]}},
        ],
        "current-context": "elsewhere",
    }
    # a: only a context (naming b's cluster and user, and the test's namespace), current.
    a = {
        "apiVersion": "v1",
        "kind": "Config",
        "contexts": [
            {
                "name": "here",
                "context": {
                    "cluster": "local",
                    "user": user["name"],
                    "namespace": kubectl_infer.namespace,
                },
            }
        ],
        "current-context": "here",
    }
    paths = {}
    for name, config in (("a", a), ("b", b)):
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(config))
    merged = f"{paths['a']}{os.pathsep}{paths['b']}"

    # kubectl's own word: the first file that sets current-context wins.
    said = await finish(await kubectl_infer.kubectl("config", "current-context", kubeconfig=merged))
    assert said.out.strip() == "here", said
    # The plugin agrees: b's cluster and user, a's context and its namespace.
    listed = await kubectl_infer.plain("list", "-o", "name", kubeconfig=merged)
    assert listed.code == Exit.SUCCEEDED, listed
    assert listed.out.splitlines() == ["inferencerun.ai.krateo.io/mine"], listed

    # --context, --kubeconfig and -n before or after the command.
    ns = kubectl_infer.namespace
    # b's own context ("admin") has no namespace: -n gives it.
    for line in (
        ["--context", "admin", "-n", ns, "list", "-o", "name"],
        ["list", "-o", "name", "--context", "admin", "--namespace", ns],
        ["--kubeconfig", str(paths["b"]), "list", "--context=admin", "-n", ns, "-o", "name"],
        ["list", "--kubeconfig", str(paths["b"]), "-n", ns, "--context", "admin", "-o", "name"],
    ):
        done = await kubectl_infer.plain(*line, kubeconfig=merged)
        assert done.code == Exit.SUCCEEDED, (line, done)
        assert done.out.splitlines() == ["inferencerun.ai.krateo.io/mine"], (line, done)
    # Without --context, b alone means its dead-end cluster: the flags above did choose.
    dead = await kubectl_infer.plain("list", "-n", ns, kubeconfig=str(paths["b"]))
    one_error_line(dead, Exit.ERROR, "cannot reach the API server")

    # Each way it can go wrong: one line, its own exit code.
    nowhere = str(tmp_path / "nowhere.yaml")
    one_error_line(
        await kubectl_infer.plain("list", "--kubeconfig", nowhere),
        Exit.NO_KUBECONFIG,
        f"--kubeconfig {nowhere} does not exist",
    )
    one_error_line(
        await kubectl_infer.plain("list", kubeconfig=f"{nowhere}{os.pathsep}{tmp_path / 'x'}"),
        Exit.NO_KUBECONFIG,
        "does not exist",
    )
    not_yaml = tmp_path / "not-yaml"
    not_yaml.write_text("clusters: [unclosed\n")
    one_error_line(
        await kubectl_infer.plain("list", kubeconfig=str(not_yaml)),
        Exit.BAD_KUBECONFIG,
        "cannot be read",
    )
    not_config = tmp_path / "not-config"
    not_config.write_text("- 1\n- 2\n")
    one_error_line(
        await kubectl_infer.plain("list", kubeconfig=str(not_config)),
        Exit.BAD_KUBECONFIG,
        "is not a kubeconfig",
    )
    one_error_line(
        await kubectl_infer.plain("list", "--context", "nosuch", kubeconfig=merged),
        Exit.NO_CONTEXT,
        "--context 'nosuch' is not in",
    )
    dangling = tmp_path / "dangling.yaml"
    dangling.write_text(yaml.safe_dump({**b, "current-context": "gone"}))
    one_error_line(
        await kubectl_infer.plain("list", kubeconfig=str(dangling)),
        Exit.NO_CONTEXT,
        "current-context 'gone' is not in",
    )


async def test_list_and_submit_print_json_yaml_or_names_and_a_missing_config_is_refused(
    kubectl_infer: KubectlInfer, crds: None, runs: Runs
) -> None:
    named = await kubectl_infer("submit", "ok", "-o", "name")
    assert named.code == Exit.SUCCEEDED, named
    (line,) = named.out.splitlines()
    assert line.startswith("inferencerun.ai.krateo.io/ok-"), named
    as_json = await kubectl_infer("submit", "ok", "--name", "j1", "-p", "a=1", "-o", "json")
    assert as_json.code == Exit.SUCCEEDED, as_json
    created = json.loads(as_json.out)
    assert (created["kind"], created["metadata"]["name"]) == ("InferenceRun", "j1")
    assert created["spec"]["parameters"] == {"a": "1"}
    as_yaml = await kubectl_infer("submit", "ok", "--name", "y1", "-o", "yaml")
    assert yaml.safe_load(as_yaml.out)["metadata"]["name"] == "y1", as_yaml
    await kubectl_infer.fails(
        "submit", "ok", "-o", "json", "-w", code=Exit.USAGE, says="leave out --watch"
    )
    await kubectl_infer.fails("list", "-o", "wide", code=Exit.USAGE, says="invalid choice")

    listed = json.loads((await kubectl_infer("list", "-o", "json")).out)
    assert listed["kind"] == "List"
    names = sorted(item["metadata"]["name"] for item in listed["items"])
    assert names == sorted(["j1", "y1", line.split("/")[1]]), listed
    assert {item["kind"] for item in listed["items"]} == {"InferenceRun"}
    as_names = await kubectl_infer("list", "-o", "name")
    assert sorted(as_names.out.splitlines()) == sorted(
        f"inferencerun.ai.krateo.io/{n}" for n in names
    )
    assert yaml.safe_load((await kubectl_infer("list", "-o", "yaml")).out)["items"]

    # A config that does not exist: nothing is submitted unless the run is to wait for it.
    await kubectl_infer.fails(
        "submit", "later", "--name", "early", code=Exit.NOT_FOUND, says="--no-wait-for-config"
    )
    assert await runs.get("early") is None
    waiting = await kubectl_infer("submit", "later", "--name", "early", "--no-wait-for-config")
    assert waiting.code == Exit.SUCCEEDED, waiting
    assert "warning: InferenceConfig 'later' does not exist" in waiting.err
    assert await runs.get("early") is not None


async def test_suspend_resume_delete_and_trigger_of_a_suspended_schedule(
    kubectl_infer: KubectlInfer, controller: ControllerProcess, runs: Runs
) -> None:
    await runs.create_and_wait(inference_run("yearly", "ok", schedule="0 0 1 1 *"), "Scheduled")
    done = await kubectl_infer("suspend", "yearly")
    assert (done.code, done.out) == (0, "inferencerun.ai.krateo.io/yearly suspended\n"), done
    run = await runs.get("yearly")
    assert run is not None
    assert run["spec"]["suspend"] is True
    again = await kubectl_infer("suspend", "yearly")
    assert (again.code, again.out) == (0, "inferencerun.ai.krateo.io/yearly already suspended\n")

    await kubectl_infer.fails("trigger", "yearly", code=Exit.USAGE, says="--force")
    forced = await kubectl_infer("trigger", "yearly", "--force", "-w")
    assert forced.code == Exit.SUCCEEDED, forced
    assert "succeeded" in forced.out.splitlines()[-1], forced

    resumed = await kubectl_infer("resume", "yearly")
    assert resumed.out == "inferencerun.ai.krateo.io/yearly resumed\n", resumed
    run = await runs.get("yearly")
    assert run is not None
    assert run["spec"]["suspend"] is False

    await kubectl_infer.fails("suspend", "nosuch", code=Exit.NOT_FOUND, says="nosuch")
    # Deleting one that exists and one that does not: the first goes, the exit says the second.
    deleted = await kubectl_infer("delete", "yearly", "nosuch")
    assert deleted.code == Exit.NOT_FOUND, deleted
    assert deleted.out == 'inferencerun.ai.krateo.io "yearly" deleted\n', deleted
    assert "no InferenceRun 'nosuch'" in deleted.err
    assert await runs.get("yearly") is None  # --wait is the default


async def test_logs_of_a_run_by_shard_and_watch_logs_of_a_finished_run(
    kubectl_infer: KubectlInfer, controller: ControllerProcess, runs: Runs
) -> None:
    await runs.create_and_wait(inference_run("done", "ok"), "Succeeded")
    # Finished before it is watched: the log is read from the pod that is still there.
    watched = await kubectl_infer("watch", "done", "--logs")
    assert watched.code == Exit.SUCCEEDED, watched
    assert any(
        line.startswith("[inf-") and '"rowsDone":3' in line for line in watched.out.splitlines()
    ), watched

    plain = await kubectl_infer("logs", "done")
    assert plain.code == Exit.SUCCEEDED, plain
    assert plain.out.splitlines() == ['{"event":"progress","rowsDone":3,"rowsTotal":3}'], plain
    followed = await kubectl_infer("logs", "done", "-f")
    assert (followed.code, followed.out) == (0, plain.out), followed

    await runs.create_and_wait(inference_run("sharded", "ok", parallelism=2), "Succeeded")
    both = await kubectl_infer("logs", "sharded", "--prefix")
    pods = {line.split("]")[0] for line in both.out.splitlines()}
    assert len(pods) == 2, both
    one = await kubectl_infer("logs", "sharded", "--shard", "1", "--prefix")
    assert one.code == Exit.SUCCEEDED, one
    (line,) = one.out.splitlines()
    assert line.split("]")[0] in pods, one
    await kubectl_infer.fails(
        "logs", "sharded", "--shard", "2", code=Exit.USAGE, says="has 2 shards (0 to 1)"
    )
    await kubectl_infer.fails("logs", "nosuch", code=Exit.NOT_FOUND, says="nosuch")


async def test_kubectl_completes_commands_flags_runs_and_configs(
    kubectl_infer: KubectlInfer, crds: None, runs: Runs
) -> None:
    await runs.create(inference_run("alpha", "ok"))
    await runs.create(inference_run("beta", "ok"))
    ns = kubectl_infer.namespace
    commands = await kubectl_infer.complete("")
    assert set(commands) >= {"submit", "watch", "logs", "delete", "suspend", "resume", "list"}
    assert await kubectl_infer.complete("-n", ns, "re") == ["rerun", "resume"]
    assert await kubectl_infer.complete("-n", ns, "watch", "") == ["alpha", "beta"]
    assert await kubectl_infer.complete("logs", "--namespace", ns, "a") == ["alpha"]
    assert await kubectl_infer.complete("--namespace", ns, "logs", "a") == ["alpha"]
    assert await kubectl_infer.complete("-n", ns, "delete", "alpha", "") == ["beta"]
    assert await kubectl_infer.complete("-n", ns, "submit", "") == ["fail", "ok", "slow"]
    assert await kubectl_infer.complete("list", "-o", "") == ["json", "yaml", "name"]
    assert "--shard" in await kubectl_infer.complete("logs", "--s")
    assert ns in await kubectl_infer.complete("-n", "")
    contexts = await kubectl_infer.complete("--context", "")
    assert contexts == ["admin"], contexts
