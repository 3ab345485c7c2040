"""The namespace of active runs deleted: no create retried into it, nothing asked of it once gone.

A namespace being deleted refuses every create (403, cause
``NamespaceTerminating``), and the namespace controller deletes its objects
kind by kind, in no fixed order: a run can outlive its Job, ConfigMap or
CronJob by seconds. The controller, seeing a child gone under a live run,
creates it again; before this was fixed, each refusal became a Warning Event
(itself refused) and a retry 5, 10, 20 s later, for as long as the namespace
took (about 15 refused Job creates in the field).

The test makes the runs the last to go, for a while: a ValidatingAdmissionPolicy
refuses the namespace controller the deletion of InferenceRuns (and of the
controller's Role and RoleBinding there, so that what the controller is told is
the namespace's refusal, not a missing permission) in that namespace, and is
removed after :data:`HOLD` seconds; then the namespace goes.

The controller runs in the test's namespace and watches it and the doomed
one (the chart's RBAC for both). In the doomed namespace: one-shot runs,
Running, and scheduled runs, Scheduled, on configs of the test's namespace.

Read from the audit log of the doomed namespace: the controller's refused
creates there are at most one per run (of its ConfigMap, Job or CronJob) and
one Event a minute; once the namespace is gone, the controller makes no
request there but its informers' lists and watches, and those few (their
backoff, no hot loop).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from hack.cluster import LocalCluster
from hack.controllerproc import apply_controller_rbac
from hack.invariants import (
    AuditLog,
    Ledger,
    Request,
    count_by_verb,
    report,
)
from tests.faults.conftest import OK, SLOW, World, log_excerpt, start_in_thread
from tests.kubehelpers import delete_admission_policy, eventually
from tests.runs import Runs, inference_run

ONE_SHOT = 3
SCHEDULED = 2
HOLD = 20.0  # the runs outlive their workloads this long
AFTER = 15.0  # watched after the namespace is gone
NAMESPACE_CONTROLLER = "system:serviceaccount:kube-system:namespace-controller"
# An informer backs off 0.8 s doubling to 30 s: a handful of lists and watches
# per informer (6 of them) in AFTER seconds.
INFORMER_REQUESTS_AFTER = 6 * 6


@pytest.mark.timeout(420)
async def test_namespace_of_active_runs_deleted(world: World) -> None:
    cluster, timeline = world.cluster, world.timeline
    home = world.namespace
    doomed = f"{home[:50]}-doomed-{uuid.uuid4().hex[:4]}"
    core = client.CoreV1Api(world.api)
    admission = client.AdmissionregistrationV1Api(world.api)
    await core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=doomed, labels={"ksc-test": "true"}))
    )
    audit = AuditLog(cluster, doomed)
    hold = f"ksc-test-hold-{doomed}"
    proc = world.controller(env={"WATCH_NAMESPACE": f"{home},{doomed}"})
    # The chart's RBAC for both namespaces (world.controller applied it for its own).
    apply_controller_rbac(cluster, home, [home, doomed])
    runs = Runs(world.api, doomed)
    ledger = Ledger()
    gone_at: datetime | None = None
    try:
        await world.configs(ok=OK, slow=SLOW)
        await start_in_thread(proc)
        for i in range(ONE_SHOT):
            body = _elsewhere(inference_run(f"once-{i}", "slow", backoffLimit=0), home)
            ledger.add(await runs.create(body), "Running")
        for i in range(SCHEDULED):
            body = _elsewhere(inference_run(f"cron-{i}", "ok", schedule="* * * * *"), home)
            ledger.add(await runs.create(body), "Scheduled")
        for run in ledger:
            await runs.wait_phase(run.name, run.expect or "", within=90)
        timeline.note(f"{len(ledger.by_name)} runs in {doomed} Running/Scheduled")

        await admission.create_validating_admission_policy(_hold_policy(hold))
        await admission.create_validating_admission_policy_binding(_hold_binding(hold, doomed))
        await _policy_in_force(cluster, doomed, next(iter(ledger)).name)
        timeline.note("the namespace controller may not delete the runs (nor the Role)")

        await core.delete_namespace(doomed)
        timeline.note(f"namespace {doomed} deleted")
        await asyncio.sleep(HOLD)
        for delete in (
            admission.delete_validating_admission_policy_binding,
            admission.delete_validating_admission_policy,
        ):
            await delete(hold)
        timeline.note("hold lifted: the runs may go")

        async def gone() -> bool:
            try:
                await core.read_namespace(doomed)
            except ApiException as exc:
                if exc.status == 404:
                    return True
                raise
            return False

        await eventually(gone, within=240, interval=0.2, what=f"namespace {doomed} gone")
        gone_at = timeline.note(f"namespace {doomed} gone")
        await asyncio.sleep(AFTER)
        timeline.note("watched the aftermath")
    finally:
        code = proc.stop()
        await _cleanup(admission, core, hold, doomed)

    requests = audit.requests()
    user = world.user
    mine = [r for r in requests if r.user == user]
    violations: list[str] = []
    if not mine:
        violations.append(f"the audit log holds no request of the controller in {doomed}")
    assert gone_at is not None
    violations += _refused_creates(mine, ledger, gone_at)
    violations += _after_gone(mine, gone_at)
    if code != 0:
        violations.append(f"the controller exited {code} on SIGTERM")
    context = [
        *timeline.lines,
        f"controller requests in {doomed}: {count_by_verb(requests, user)}",
        *(f"  {r}" for r in mine if r.verb == "create" and not r.ok),
        *log_excerpt(proc, "namespace is being deleted", "write refused", "event write", limit=30),
    ]
    print("\n".join(context))  # shown with -s, and with a failure
    assert not violations, report("namespace of active runs deleted", violations, context)


def _elsewhere(run: dict[str, Any], config_namespace: str) -> dict[str, Any]:
    """``run`` using a config of ``config_namespace`` (which outlives the run's namespace)."""
    run["spec"]["configRef"]["namespace"] = config_namespace
    return run


def _refused_creates(mine: list[Request], ledger: Ledger, gone_at: datetime) -> list[str]:
    """At most one refused create of a child per run, and one of an Event a minute."""
    refused = [r for r in mine if r.verb == "create" and not r.ok]
    lines: list[str] = []
    for run in ledger:
        children = [r for r in refused if r.resource != "events" and ledger.owner_of(r.name) is run]
        if len(children) > 1:
            lines.append(f"run {run.name}: {len(children)} creates of its children refused")
            lines += [f"    {r}" for r in children[:10]]
    events = [r for r in refused if r.resource == "events"]
    if events:
        minutes = (gone_at - events[0].received).total_seconds() / 60
        allowed = 1 + int(minutes)
        if len(events) > allowed:
            lines.append(f"{len(events)} Event creates refused (at most {allowed}, one a minute)")
            lines += [f"    {r}" for r in events[:10]]
    strays = [r for r in refused if r.resource != "events" and ledger.owner_of(r.name) is None]
    lines += [f"a refused create of no run's child: {r}" for r in strays]
    return lines


def _after_gone(mine: list[Request], gone_at: datetime) -> list[str]:
    """Nothing asked of the namespace once gone but the informers' lists and watches, and few."""
    after = [r for r in mine if r.received > gone_at]
    other = [r for r in after if r.verb not in ("list", "watch")]
    lines = [f"requests in the namespace after it was gone: {r}" for r in other]
    informers = [r for r in after if r.verb in ("list", "watch")]
    if len(informers) > INFORMER_REQUESTS_AFTER:
        lines.append(
            f"{len(informers)} lists and watches of the gone namespace in {AFTER:.0f} s "
            f"(at most {INFORMER_REQUESTS_AFTER}): {count_by_verb(informers, informers[0].user)}"
        )
    return lines


def _hold_policy(name: str) -> dict[str, Any]:
    """Refuse the namespace controller the deletion of runs, Roles and RoleBindings."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["ai.krateo.io"],
                        "apiVersions": ["*"],
                        "resources": ["inferenceruns"],
                        "operations": ["DELETE"],
                    },
                    {
                        "apiGroups": ["rbac.authorization.k8s.io"],
                        "apiVersions": ["*"],
                        "resources": ["roles", "rolebindings"],
                        "operations": ["DELETE"],
                    },
                ]
            },
            "matchConditions": [
                {
                    "name": "namespace-controller",
                    "expression": f"request.userInfo.username == '{NAMESPACE_CONTROLLER}'",
                }
            ],
            "validations": [
                {"expression": "false", "message": "held by the test: the runs go last"}
            ],
        },
    }


def _hold_binding(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }


async def _policy_in_force(cluster: LocalCluster, namespace: str, run: str) -> None:
    """Wait until the API server refuses the namespace controller a (dry-run) run delete."""
    deadline = time.monotonic() + 30
    while True:
        answer = await asyncio.to_thread(
            cluster.kubectl,
            "delete",
            "inferencerun",
            run,
            "-n",
            namespace,
            f"--as={NAMESPACE_CONTROLLER}",
            "--dry-run=server",
            check=False,
        )
        if answer.returncode != 0 and "held by the test" in answer.stderr:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the hold policy is not in force: {answer.stderr}")
        await asyncio.sleep(0.3)


async def _cleanup(
    admission: client.AdmissionregistrationV1Api, core: client.CoreV1Api, hold: str, doomed: str
) -> None:
    """The hold (cluster-scoped) and the doomed namespace gone, whatever happened."""
    await delete_admission_policy(admission, hold)
    try:
        await core.delete_namespace(doomed)
    except ApiException as exc:
        if exc.status not in (404, 409):
            raise
