"""``python -m controller check`` (the chart's ``helm test``) against the real API server.

The check runs as a subprocess with the controller's own settings and a
TokenRequest token of the chart's controller ServiceAccount, under exactly the
chart's RBAC (hack/controllerproc.py), next to a real controller:

- with a running leader every check passes (exit 0); with election off the
  Lease is skipped, not failed;
- no Lease yet, a Lease released by a stopped controller and a Lease left
  behind by a SIGKILLed one each fail with their own line (exit 1);
- a watched namespace the RBAC does not cover fails as forbidden;
- an API server that cannot be reached fails first and skips the rest.

Missing CRDs are not exercised here: the CRDs are shared by the whole run, and
deleting them would delete every test's runs. Their message is unit-tested
(tests/unit/test_selfcheck_logic.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from hack.cluster import LocalCluster, free_port
from hack.controllerproc import REPO, ControllerProcess, controller_for, controller_user, running
from tests import chart

pytestmark = pytest.mark.timeout(180)

# Short timings, so that a killed leader's Lease goes stale in seconds.
ELECTION = {
    "LEADER_ELECT": "true",
    "LEASE_NAME": chart.FULLNAME,
    "LEASE_DURATION": "6s",
    "RENEW_DEADLINE": "4s",
    "RETRY_PERIOD": "1s",
}


def run_check(kubeconfig: Path, settings: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m controller check`` with these settings, as the kubeconfig's user."""
    env = {
        **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")},
        # KSC_TEST_RUN marks it as the suite's, like every process the suite starts.
        **{k: v for k, v in os.environ.items() if k.startswith("KSC_")},
        "KUBECONFIG": str(kubeconfig),
        **settings,
    }
    return subprocess.run(
        [sys.executable, "-m", "controller", "check"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=90,
    )


def check_lines(proc: ControllerProcess) -> tuple[int, list[str]]:
    done = run_check(proc.kubeconfig, proc.env)
    assert done.stderr == "", done.stderr
    return done.returncode, done.stdout.splitlines()


def lease_holder(cluster: LocalCluster, namespace: str) -> str:
    done = cluster.kubectl(
        "get",
        "lease",
        chart.FULLNAME,
        "-n",
        namespace,
        "-o",
        "jsonpath={.spec.holderIdentity}",
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else ""


def wait_for_holder(cluster: LocalCluster, namespace: str, within: float = 30.0) -> str:
    deadline = time.monotonic() + within
    while not (holder := lease_holder(cluster, namespace)):
        assert time.monotonic() < deadline, f"no leader within {within}s"
        time.sleep(0.25)
    return holder


def assert_api_and_crds_pass(lines: list[str], namespace: str) -> None:
    user = controller_user(namespace)
    assert lines[0].startswith("ok: API server https://"), lines
    assert lines[0].endswith(f"answers and authenticates {user}"), lines
    assert lines[1:3] == [
        f"ok: {plural}.ai.krateo.io/v1 is served and can be listed in namespace(s) {namespace}"
        for plural in ("inferenceconfigs", "inferenceruns")
    ], lines


def test_passes_with_a_leader_and_fails_before_one_and_after_it_released_the_lease(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    proc = controller_for(cluster, namespace, tmp_path, env=ELECTION)
    lease = f"Lease {namespace}/{chart.FULLNAME}"

    # Installed, but no replica ever ran: no Lease at all.
    code, lines = check_lines(proc)
    assert code == 1, lines
    assert_api_and_crds_pass(lines, namespace)
    assert len(lines) == 4, lines
    assert lines[3].startswith(f"FAIL: {lease} does not exist: no replica has ever"), lines

    with running(proc):
        holder = wait_for_holder(cluster, namespace)
        code, lines = check_lines(proc)
        assert code == 0, lines
        assert_api_and_crds_pass(lines, namespace)
        assert lines[3].startswith(f"ok: {lease} is held by {holder}, renewed "), lines
        assert lines[3].endswith("(within its 6s)"), lines

    # A graceful stop releases the Lease: nobody leads now.
    code, lines = check_lines(proc)
    assert code == 1, lines
    assert lines[3].startswith(f"FAIL: {lease} has no holder: the last leader released it"), lines


def test_fails_when_the_leader_was_killed_and_its_lease_went_stale(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    proc = controller_for(cluster, namespace, tmp_path, env=ELECTION)
    proc.start()
    try:
        holder = wait_for_holder(cluster, namespace)
        code, lines = check_lines(proc)
        assert code == 0, lines
    finally:
        proc.kill()  # SIGKILL: no release, the Lease keeps its holder
    time.sleep(7)  # past LEASE_DURATION since the last renewal
    assert lease_holder(cluster, namespace) == holder
    code, lines = check_lines(proc)
    assert code == 1, lines
    assert_api_and_crds_pass(lines, namespace)
    assert lines[3].startswith(
        f"FAIL: Lease {namespace}/{chart.FULLNAME} is held by {holder} but was last renewed "
    ), lines
    assert "longer than its 6s duration" in lines[3], lines
    assert "no standby has taken over" in lines[3], lines


def test_with_leader_election_off_the_lease_is_skipped(
    controller: ControllerProcess, namespace: str
) -> None:
    code, lines = check_lines(controller)
    assert code == 0, lines
    assert_api_and_crds_pass(lines, namespace)
    assert lines[3:] == [
        "skip: leader election is off (LEADER_ELECT=false): there is no Lease to check"
    ]


def test_a_watched_namespace_outside_the_rbac_fails_as_forbidden(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    # The chart's RBAC covers `namespace` only; "default" is not granted.
    proc = controller_for(cluster, namespace, tmp_path)
    settings = {**proc.env, "WATCH_NAMESPACE": f"{namespace},default"}
    done = run_check(proc.kubeconfig, settings)
    lines = done.stdout.splitlines()
    assert done.returncode == 1, lines
    user = controller_user(namespace)
    assert lines[0].startswith("ok: API server"), lines
    assert [line.split(" (")[0] for line in lines[1:3]] == [
        f"FAIL: {user} may not list {plural}.ai.krateo.io in namespace default"
        for plural in ("inferenceconfigs", "inferenceruns")
    ], lines
    assert "403 Forbidden" in lines[1], lines
    assert "a Role and RoleBinding in default" in lines[1], lines


def test_an_unreachable_api_server_fails_first_and_skips_the_rest(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    proc = controller_for(cluster, namespace, tmp_path, env=ELECTION)
    config = yaml.safe_load(proc.kubeconfig.read_text())
    nowhere = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    config["clusters"][0]["cluster"]["server"] = nowhere
    unreachable = tmp_path / "unreachable.kubeconfig"
    unreachable.write_text(yaml.safe_dump(config))
    done = run_check(unreachable, proc.env)
    lines = done.stdout.splitlines()
    assert done.returncode == 1, lines
    assert lines[0].startswith(f"FAIL: cannot reach the API server {nowhere} ("), lines
    assert lines[1:] == [
        "skip: CRDs and RBAC not checked: the API server cannot be used",
        "skip: the leader's Lease not checked: the API server cannot be used",
    ]
