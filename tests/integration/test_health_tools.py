"""What GitOps tools make of a run, on the real control plane with the real controller.

Each phase a run can be in is reached for real, the run is read back from the
API server as ``kubectl get -o json`` shows it, and judged by

- kstatus (``hack/kstatus``: ``status.Compute`` of sigs.k8s.io/cli-utils, what
  Flux's health checks, kpt and ``kubectl`` plugins use),
- the Argo CD health check ``docs/argocd-health.lua``, run in Lua 5.1 (Argo CD
  runs gopher-lua, a 5.1) with ``obj`` set as Argo CD sets it,
- ``kubectl wait --for=condition=...`` for the finished ones.

The kstatus checker is built from Go (``hack/kstatus/build.sh``, cached, part
of ``make binaries``). When it cannot be built the tests fail, saying why.
"""

from __future__ import annotations

import copy
import functools
import importlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hack.cluster import LocalCluster
from hack.controllerproc import ControllerProcess
from tests.kubehelpers import required
from tests.runs import (
    Obj,
    Runs,
    condition,
    inference_config,
    inference_run,
    last_execution,
    status,
    without_model_url,
)

REPO = Path(__file__).resolve().parents[2]
KSTATUS_BUILD = REPO / "hack" / "kstatus" / "build.sh"
ARGO_HEALTH = REPO / "docs" / "argocd-health.lua"

OK, FAIL, SLOW = "test.local/fake-ok:1", "test.local/fake-fail:1", "test.local/fake-slow:1"
MISSING_IMAGE = "test.local/no-such-image:1"
NEVER_SOON = "0 0 1 1 *"  # midnight on 1 January: no execution during a test
EVERY_MINUTE = "* * * * *"
# What `kubectl wait --for=condition=...` is asked of every phase: "finished, either
# way" is Reconciling=false; Ready is a one-shot run that succeeded, or a scheduled
# run whose CronJob stands.
CHECKED = ("Complete", "Failed", "Stalled", "Ready", "Reconciling=false")


# ----------------------------------------------------------------------------- the tools


@functools.cache
def _build_kstatus_check() -> tuple[Path | None, str]:
    """``(path, "")`` of the built checker, or ``(None, why not)``."""
    try:
        done = subprocess.run(
            ["bash", str(KSTATUS_BUILD)], capture_output=True, text=True, timeout=600
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        errors = done.stderr.strip().splitlines()
        return None, errors[-1] if errors else f"exit {done.returncode}"
    path = Path(lines[-1])
    if not os.access(path, os.X_OK):
        return None, f"{KSTATUS_BUILD} printed {path}, which is not an executable"
    return path, ""


@pytest.fixture(scope="session")
def kstatus_check() -> Path:
    path, why = _build_kstatus_check()
    return required(path, f"kstatus-check could not be built by hack/kstatus/build.sh: {why}")


def kstatus(binary: Path, obj: Obj) -> Obj:
    """``{"status": "Current|InProgress|Failed|...", "message": ...}`` for one object."""
    done = subprocess.run(
        [str(binary)], input=json.dumps(obj), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, f"kstatus-check exited {done.returncode}: {done.stderr}"
    verdict: Obj = json.loads(done.stdout)
    return verdict


def _to_lua(runtime: Any, value: Any) -> Any:
    # As Argo CD hands `obj` to Lua: objects and arrays become tables (arrays
    # 1-based), a JSON null is an absent key.
    if isinstance(value, dict):
        return runtime.table_from(
            {k: _to_lua(runtime, v) for k, v in value.items() if v is not None}
        )
    if isinstance(value, list):
        return runtime.table_from([_to_lua(runtime, v) for v in value])
    return value


def argo_health(obj: Obj) -> tuple[str, str]:
    """``(hs.status, hs.message)`` of docs/argocd-health.lua for one object."""
    lua51 = importlib.import_module("lupa.lua51")  # lupa ships no type hints
    runtime = lua51.LuaRuntime()
    runtime.globals().obj = _to_lua(runtime, obj)
    hs = runtime.execute(ARGO_HEALTH.read_text())
    assert hs is not None, "the health check returned nothing"
    return str(hs["status"]), str(hs["message"])


def spec_ahead(obj: Obj) -> Obj:
    """``obj`` with a spec newer than its status (generation one ahead): no verdict yet."""
    ahead = copy.deepcopy(obj)
    ahead["metadata"]["generation"] += 1
    return ahead


def read_back(cluster: LocalCluster, namespace: str, kind: str, name: str) -> Obj:
    """The object as the API server serves it to kubectl (and to Argo CD and Flux)."""
    shown = cluster.kubectl("get", f"{kind}.ai.krateo.io", name, "-n", namespace, "-o", "json")
    obj: Obj = json.loads(shown.stdout)
    return obj


def waits(cluster: LocalCluster, namespace: str, condition_: str, timeout: str) -> bool:
    """Whether ``kubectl wait`` meets ``condition_`` within ``timeout`` (exit 0), else exit 1."""
    done = cluster.kubectl(
        "wait",
        "-n",
        namespace,
        f"--for=condition={condition_}",
        "inferencerun/r",
        f"--timeout={timeout}",
        check=False,
    )
    met = done.returncode == 0 and "condition met" in done.stdout
    assert met or done.returncode == 1, (done.returncode, done.stderr)  # 1: timed out
    return met


# ----------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class Case:
    phase: str
    image: str | None  # None: the run names a config that does not exist
    kstatus: str
    argo: str
    wait_for: tuple[str, ...] = ()  # the conditions of CHECKED that `kubectl wait` meets
    spec: dict[str, Any] = field(default_factory=dict)
    reached: Callable[[Obj], bool] | None = None  # beyond the phase
    within: float = 60.0
    argo_says: str = ""  # in Argo CD's message


CASES = [
    Case(
        "Pending",
        MISSING_IMAGE,
        "InProgress",
        "Progressing",
        # Stuck for good, not on its way: the image cannot be pulled.
        reached=lambda r: status(r).get("reason") in ("ErrImagePull", "ImagePullBackOff"),
    ),
    Case("Running", SLOW, "InProgress", "Progressing"),
    Case(
        "Succeeded", OK, "Current", "Healthy", wait_for=("Complete", "Ready", "Reconciling=false")
    ),
    Case(
        "Failed",
        FAIL,
        "Failed",
        "Degraded",
        wait_for=("Failed", "Stalled", "Reconciling=false"),
        spec={"backoffLimit": 0},
    ),
    Case(
        "Error",
        None,
        "Failed",
        "Degraded",
        wait_for=("Stalled", "Reconciling=false"),
        reached=lambda r: status(r).get("reason") == "ConfigNotFound",
    ),
    Case(
        "Scheduled",
        OK,
        "Current",
        "Healthy",
        wait_for=("Ready", "Reconciling=false"),
        spec={"schedule": NEVER_SOON},
    ),
    Case(
        "Suspended",
        OK,
        "Current",
        "Suspended",
        wait_for=("Ready", "Reconciling=false"),
        spec={"schedule": NEVER_SOON, "suspend": True},
    ),
]


def _last_execution(phase: str) -> Callable[[Obj], bool]:
    return lambda r: last_execution(r).get("phase") == phase


# A scheduled run's executions come and go; the run stays Current (Healthy)
# while one runs and after one failed. Each waits for the next minute.
EXECUTIONS = [
    pytest.param(
        Case(
            "Running",
            SLOW,
            "Current",
            "Healthy",
            wait_for=("Ready", "Reconciling=false"),
            spec={"schedule": EVERY_MINUTE},
            reached=_last_execution("Running"),
            within=130,
            argo_says="An execution is running",
        ),
        id="Running-scheduled",
        marks=pytest.mark.timeout(240),
    ),
    pytest.param(
        Case(
            "Scheduled",
            FAIL,
            "Current",
            "Healthy",
            wait_for=("Ready", "Reconciling=false"),
            spec={"schedule": EVERY_MINUTE, "backoffLimit": 0},
            reached=_last_execution("Failed"),
            within=130,
            argo_says="failed: runner exited with code 4",
        ),
        id="Scheduled-after-a-failed-execution",
        marks=pytest.mark.timeout(240),
    ),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.phase) for c in CASES] + EXECUTIONS)
async def test_each_phase_is_judged_right_by_kstatus_argo_and_kubectl_wait(
    case: Case,
    runs: Runs,
    namespace: str,
    controller: ControllerProcess,
    cluster: LocalCluster,
    kstatus_check: Path,
) -> None:
    if case.image is not None:
        await runs.create(inference_config("cfg", case.image))
    await runs.create(inference_run("r", "cfg", **case.spec))
    extra = case.reached or (lambda r: True)
    await runs.wait(
        "r",
        lambda r: status(r).get("phase") == case.phase and extra(r),
        within=case.within,
        what=f"the run {case.phase}",
    )
    live = read_back(cluster, namespace, "inferencerun", "r")
    st = status(live)
    assert st["phase"] == case.phase, st
    assert st["observedGeneration"] == live["metadata"]["generation"]

    verdict = kstatus(kstatus_check, live)
    assert verdict["status"] == case.kstatus, (verdict, st)
    health, message = argo_health(live)
    assert health == case.argo, (health, message, st)
    assert case.argo_says in message, (message, st)
    if case.kstatus == "Failed":
        # Both tools show the run's own words, not a generic "not ready".
        assert st["message"]
        assert verdict["message"] == st["message"]
        assert message == st["message"]
        stalled = condition(live, "Stalled")
        assert stalled is not None
        assert (stalled["status"], stalled["reason"]) == ("True", st["reason"])

    # A status for an older spec is no verdict on this one, whatever it says;
    # this also proves observedGeneration is there to compare (kstatus skips
    # the check when it is absent).
    lagging = spec_ahead(live)
    assert kstatus(kstatus_check, lagging)["status"] == "InProgress"
    assert argo_health(lagging)[0] == "Progressing"

    if "schedule" not in case.spec:
        # A one-shot run carries Complete and Failed in every phase, Error included
        # (whatever its cause), True only for its outcome.
        for type_ in ("Complete", "Failed"):
            found = condition(live, type_)
            assert found is not None, (type_, st)
            wanted = {"Complete": "Succeeded", "Failed": "Failed"}[type_] == case.phase
            assert found["status"] == str(wanted), (found, st)
        complete, failed = condition(live, "Complete") or {}, condition(live, "Failed") or {}
        if case.phase != "Succeeded":
            assert complete["reason"] == st["reason"], (complete, st)  # why not (yet)
        if case.phase == "Failed":
            assert (failed["reason"], failed["message"]) == (st["reason"], st["message"])
    for met in case.wait_for:
        assert waits(cluster, namespace, met, "10s"), f"{met} not met: {st}"
    for other in CHECKED:
        if other not in case.wait_for:
            assert not waits(cluster, namespace, other, "1s"), f"{other} met: {st}"


async def test_a_run_before_the_controller_writes_its_status(
    runs: Runs, namespace: str, cluster: LocalCluster, kstatus_check: Path
) -> None:
    """No controller here: the run as it is between its creation and the first status write."""
    await runs.create(inference_run("r", "cfg"))
    live = read_back(cluster, namespace, "inferencerun", "r")
    assert "status" not in live
    health, _ = argo_health(live)
    assert health == "Progressing"
    # kstatus cannot tell a resource nobody has looked at from a finished one:
    # no conditions and no observedGeneration is Current (docs/gitops-health.md).
    assert kstatus(kstatus_check, live)["status"] == "Current"


LOST = (
    "runner pod inf-r-abc is being deleted on node worker-3, which does not answer: ... "
    "kubectl taint node worker-3 node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
)


def _run_with(status_: Obj, schedule: str | None = None) -> Obj:
    spec: Obj = {"configRef": {"name": "cfg"}}
    if schedule is not None:
        spec["schedule"] = schedule
    return {
        "apiVersion": "ai.krateo.io/v1",
        "kind": "InferenceRun",
        "metadata": {"name": "r", "generation": 1},
        "spec": spec,
        "status": {"observedGeneration": 1, **status_},
    }


@pytest.mark.parametrize(
    ("run", "health", "says"),
    [
        # A runner on a lost node: nothing moves until someone acts. Degraded.
        (_run_with({"phase": "Running", "reason": "NodeLost", "message": LOST}), "Degraded", LOST),
        (_run_with({"phase": "Pending", "reason": "NodeLost", "message": LOST}), "Degraded", LOST),
        (
            _run_with(
                {
                    "phase": "Running",
                    "reason": "Running",
                    "recentExecutions": [
                        {
                            "name": "r-29000001",
                            "phase": "Running",
                            "reason": "NodeLost",
                            "message": LOST,
                        },
                        {"name": "r-29000000", "phase": "Succeeded"},
                    ],
                },
                schedule=EVERY_MINUTE,
            ),
            "Degraded",
            f"Execution r-29000001: {LOST}",
        ),
        # Going by itself: the node may come back, an evicted pod is replaced.
        (
            _run_with({"phase": "Running", "reason": "NodeNotReady", "message": "node x"}),
            "Progressing",
            "The run is running",
        ),
        (
            _run_with({"phase": "Running", "reason": "EvictionByEvictionAPI", "message": "x"}),
            "Progressing",
            "The run is running",
        ),
    ],
    ids=["one-shot", "one-shot-pending", "scheduled", "node-not-ready", "evicted"],
)
def test_a_run_on_a_lost_node_is_degraded_in_argo_cd(run: Obj, health: str, says: str) -> None:
    assert argo_health(run) == (health, says)


# ----------------------------------------------------------------------------- configs


async def _config_ready(runs: Runs, name: str, value: str) -> None:
    await runs.wait_condition(
        name,
        "Ready",
        lambda c: c["status"] == value,
        plural="inferenceconfigs",
        what=f"config {name} Ready={value}",
    )


async def test_configs_are_healthy_when_ready_and_degraded_when_not(
    runs: Runs,
    namespace: str,
    controller: ControllerProcess,
    cluster: LocalCluster,
    kstatus_check: Path,
) -> None:
    await runs.create(inference_config("good", OK))
    await runs.create(without_model_url(inference_config("bad", OK)))
    await _config_ready(runs, "good", "True")
    await _config_ready(runs, "bad", "False")

    good = read_back(cluster, namespace, "inferenceconfig", "good")
    assert argo_health(good)[0] == "Healthy"
    assert kstatus(kstatus_check, good)["status"] == "Current"

    bad = read_back(cluster, namespace, "inferenceconfig", "bad")
    ready = condition(bad, "Ready")
    assert ready is not None
    assert argo_health(bad) == ("Degraded", ready["message"])
    assert "modelUrl" in ready["message"]

    lagging = spec_ahead(good)
    assert argo_health(lagging)[0] == "Progressing"
    assert kstatus(kstatus_check, lagging)["status"] == "InProgress"


async def test_kstatus_sees_an_unusable_config_as_failed(
    runs: Runs,
    namespace: str,
    controller: ControllerProcess,
    cluster: LocalCluster,
    kstatus_check: Path,
) -> None:
    await runs.create(without_model_url(inference_config("bad", OK)))
    await _config_ready(runs, "bad", "False")
    bad = read_back(cluster, namespace, "inferenceconfig", "bad")
    assert kstatus(kstatus_check, bad)["status"] == "Failed"


# ----------------------------------------------------------------------------- the page

GUIDE = REPO / "docs" / "gitops-health.md"
SECTION = "# Health in Argo CD and Flux"


def _section() -> str:
    """The page under its title (the page is the section)."""
    text = GUIDE.read_text()
    assert SECTION in text
    return text.split(SECTION, 1)[1]


def test_the_guide_shows_the_health_check_the_tests_run() -> None:
    shown = re.search(r"```lua\n(.*?)```", _section(), re.DOTALL)
    assert shown is not None, "no lua block in the section"
    assert shown.group(1) == ARGO_HEALTH.read_text()


def _jq(jq: str, program: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [jq, "-Rs", program, str(path)], capture_output=True, text=True, check=True, timeout=30
    )


async def test_the_guides_install_command_sets_both_keys(
    cluster: LocalCluster, namespace: str
) -> None:
    jq = required(shutil.which("jq"), "jq not found: apt-get install jq")
    program = re.search(r"jq -Rs '(.*?)' docs/argocd-health.lua", _section(), re.DOTALL)
    assert program is not None, "no jq command in the section"
    patch = _jq(jq, program.group(1), ARGO_HEALTH)
    cluster.kubectl("create", "configmap", "argocd-cm", "-n", namespace)
    cluster.kubectl(
        "patch",
        "configmap",
        "argocd-cm",
        "-n",
        namespace,
        "--type",
        "merge",
        "--patch-file",
        "/dev/stdin",
        input=patch.stdout,
    )
    shown = cluster.kubectl("get", "configmap", "argocd-cm", "-n", namespace, "-o", "json")
    data = json.loads(shown.stdout)["data"]
    script = ARGO_HEALTH.read_text()
    assert data == {
        "resource.customizations.health.ai.krateo.io_InferenceRun": script,
        "resource.customizations.health.ai.krateo.io_InferenceConfig": script,
    }
