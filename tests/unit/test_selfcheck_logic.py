"""The self-check's verdicts (controller/selfcheck.py) and its command line, without a cluster.

What the API server answers is given as the dicts and errors the client
returns; the checks against a real API server are in
tests/integration/test_selfcheck.py.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from controller import __main__ as controller_main
from controller.selfcheck import (
    Result,
    api_failure,
    api_ok,
    election_off,
    exit_code,
    group_missing,
    lease_failure,
    lease_result,
    list_failure,
    listed_ok,
    resource_missing,
    username,
)
from kubeclient.errors import ApiError, NotFound, TransportError
from kubeclient.objects import parse_time
from kubeclient.resources import CONFIGS, RUNS

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
HOST = "https://10.96.0.1:443"
SA = "system:serviceaccount:kserve-controller-system:kserve-inference-controller"


def lease(
    holder: str | None = "controller-7d9f_abc",
    renewed: datetime | None = NOW - timedelta(seconds=3),
    duration: int | None = 15,
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if holder is not None:
        spec["holderIdentity"] = holder
    if renewed is not None:
        spec["renewTime"] = renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if duration is not None:
        spec["leaseDurationSeconds"] = duration
    return {"metadata": {"name": "ksc", "namespace": "ns"}, "spec": spec}


def verdict(obj: dict[str, Any] | None, now: datetime = NOW) -> Result:
    return lease_result(obj, namespace="ns", name="ksc", now=now, default_duration=15.0)


# ----------------------------------------------------------------------------- Lease


def test_a_lease_renewed_within_its_duration_is_ok() -> None:
    result = verdict(lease())
    assert result.status == "ok"
    assert result.line == (
        "ok: Lease ns/ksc is held by controller-7d9f_abc, renewed 3.0s ago (within its 15s)"
    )


def test_a_lease_renewed_exactly_one_duration_ago_is_still_ok() -> None:
    assert verdict(lease(renewed=NOW - timedelta(seconds=15))).status == "ok"


def test_a_lease_not_renewed_for_longer_than_its_duration_fails() -> None:
    result = verdict(lease(renewed=NOW - timedelta(seconds=15.5)))
    assert result.failed
    assert "held by controller-7d9f_abc but was last renewed 16s ago" in result.message
    assert "longer than its 15s duration" in result.message
    assert "no standby has taken over" in result.message
    assert "controller's pods" in result.message


def test_the_lease_own_duration_wins_over_the_settings() -> None:
    assert verdict(lease(renewed=NOW - timedelta(seconds=40), duration=60)).status == "ok"
    # No leaseDurationSeconds: the configured duration.
    assert verdict(lease(renewed=NOW - timedelta(seconds=20), duration=None)).failed
    assert verdict(lease(renewed=NOW - timedelta(seconds=10), duration=None)).status == "ok"


def test_a_released_lease_has_no_holder_and_fails() -> None:
    # What a gracefully stopped leader leaves: empty holder, 1 s duration.
    result = verdict(lease(holder="", duration=1))
    assert result.failed
    assert "has no holder" in result.message
    assert "scaled to 0" in result.message
    assert verdict(lease(holder=None)).failed


def test_a_missing_lease_fails_and_says_no_replica_ever_led() -> None:
    result = verdict(None)
    assert result.failed
    assert result.message.startswith("Lease ns/ksc does not exist: no replica has ever")
    assert "LEASE_NAME" in result.message
    assert "kubectl -n ns get pods -l app.kubernetes.io/component=controller" in result.message


def test_a_lease_without_renew_time_fails_unless_it_was_acquired() -> None:
    assert "never renewed" in verdict(lease(renewed=None)).message
    acquired = lease(renewed=None)
    acquired["spec"]["acquireTime"] = "2026-05-01T11:59:58.000000Z"
    assert verdict(acquired).status == "ok"


def test_a_renew_time_far_in_the_future_blames_the_clocks() -> None:
    result = verdict(lease(renewed=NOW + timedelta(seconds=120)))
    assert result.failed
    assert "120s in the future" in result.message
    assert "clocks" in result.message
    # A little ahead is ordinary skew: fine, and shown as just renewed.
    slightly = verdict(lease(renewed=NOW + timedelta(seconds=2)))
    assert slightly.status == "ok"
    assert "renewed 0.0s ago" in slightly.message


def test_an_unreadable_renew_time_fails() -> None:
    broken = lease()
    broken["spec"]["renewTime"] = "yesterday"
    assert "unreadable renewTime 'yesterday'" in verdict(broken).message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-05-01T12:00:00Z", NOW),
        ("2026-05-01T12:00:00.123456Z", NOW + timedelta(microseconds=123456)),
        ("2026-05-01T14:00:00+02:00", NOW),
        ("2026-05-01T12:00:00", NOW),
    ],
)
def test_parse_time_reads_kubernetes_times(text: str, expected: datetime) -> None:
    parsed = parse_time(text)
    assert parsed == expected
    assert parsed is not None
    assert parsed.tzinfo is not None  # a naive time is taken as UTC


def test_reading_the_lease_forbidden_names_the_role_and_the_settings() -> None:
    forbidden = ApiError(403, "Forbidden", 'leases.coordination.k8s.io "x" is forbidden')
    result = lease_failure("ns", "x", forbidden, SA)
    assert result.failed
    assert result.message.startswith(f"{SA} may not get Lease ns/x (403 Forbidden: leases")
    assert "LEASE_NAME" in result.message
    other = lease_failure("ns", "x", ApiError(500, "InternalError", "etcd"), None)
    assert other.line == "FAIL: reading Lease ns/x failed (500 InternalError: etcd)"


def test_election_off_is_skipped_not_failed() -> None:
    result = election_off()
    assert result.status == "skip"
    assert not result.failed
    assert "leader election is off" in result.line


# ----------------------------------------------------------------------------- API


def test_api_ok_names_version_and_user() -> None:
    review = {"status": {"userInfo": {"username": SA, "groups": ["system:authenticated"]}}}
    result = api_ok(HOST, {"gitVersion": "v1.36.3"}, review)
    assert result.line == f"ok: API server {HOST} (v1.36.3) answers and authenticates {SA}"
    assert username({}) == "an unnamed user"
    older = api_ok(HOST, {"gitVersion": "v1.27.1"}, None)
    assert older.status == "ok"
    assert "identity not checked" in older.message


def test_an_unreachable_api_server_says_where_to_look() -> None:
    refused = TransportError(0, "ClientConnectorError", "Connect call failed ('10.96.0.1', 443)")
    result = api_failure(HOST, refused)
    assert result.failed
    assert result.message.startswith(f"cannot reach the API server {HOST} (ClientConnectorError")
    assert "KUBERNETES_SERVICE_HOST" in result.message
    assert "hostNetwork" in result.message


def test_refused_credentials_point_at_the_token_mount() -> None:
    result = api_failure(HOST, ApiError(401, "Unauthorized", "Unauthorized"))
    assert "refuses these credentials (401 Unauthorized: Unauthorized)" in result.message
    assert "automountServiceAccountToken" in result.message
    anonymous = api_failure(HOST, ApiError(403, "Forbidden", "system:anonymous cannot"))
    assert "system:anonymous" in anonymous.message


def test_other_api_errors_are_reported_as_they_are() -> None:
    result = api_failure(HOST, ApiError(503, "ServiceUnavailable", "line one\nline two"))
    assert result.line == (
        f"FAIL: the API server {HOST} answered with an error "
        "(503 ServiceUnavailable: line one; line two); see its logs"
    )


# ----------------------------------------------------------------------------- CRDs


def test_a_missing_api_group_means_the_crds_are_not_installed() -> None:
    result = group_missing(NotFound(404, "NotFound", "the server could not find it"))
    assert result.failed
    assert "API group ai.krateo.io/v1 is not served" in result.message
    assert "kubectl apply --server-side -f crds/" in result.message
    assert "cannot discover" in group_missing(ApiError(500, "InternalError")).message
    missing = resource_missing(RUNS)
    assert missing.message.startswith("inferenceruns.ai.krateo.io/v1 is not served")
    assert "InferenceRun CRD is missing" in missing.message


def test_listing_ok_names_where() -> None:
    assert listed_ok(CONFIGS, ()).line == (
        "ok: inferenceconfigs.ai.krateo.io/v1 is served and can be listed in all namespaces"
    )
    assert listed_ok(RUNS, ("a", "b")).message.endswith("listed in namespace(s) a, b")


def test_a_forbidden_list_names_who_where_and_which_grant() -> None:
    forbidden = ApiError(403, "Forbidden", "cannot list resource")
    cluster_wide = list_failure(RUNS, None, forbidden, SA)
    assert cluster_wide.message.startswith(
        f"{SA} may not list inferenceruns.ai.krateo.io in all namespaces (403 Forbidden"
    )
    assert "ClusterRole" in cluster_wide.message
    namespaced = list_failure(CONFIGS, "team-a", forbidden, None)
    assert namespaced.message.startswith("this identity may not list inferenceconfigs")
    assert "in namespace team-a" in namespaced.message
    assert "a Role and RoleBinding in team-a" in namespaced.message
    assert "WATCH_NAMESPACE" in namespaced.message


def test_other_list_failures() -> None:
    assert "is not served in namespace a" in list_failure(RUNS, "a", NotFound(404), None).message
    timeout = list_failure(RUNS, None, TransportError(0, "TimeoutError", ""), None)
    assert timeout.line == (
        "FAIL: listing inferenceruns.ai.krateo.io in all namespaces failed (TimeoutError)"
    )


# ----------------------------------------------------------------------------- exit code


def test_exit_code_is_one_only_when_a_check_failed() -> None:
    good = Result("ok", "fine")
    assert exit_code([good, election_off()]) == 0
    assert exit_code([]) == 0
    assert exit_code([good, Result("FAIL", "broken")]) == 1


# ----------------------------------------------------------------------------- command line


def run_check(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller", "check", *args],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_check_with_a_bad_setting_is_one_fail_line_and_exit_1(tmp_path: Path) -> None:
    done = run_check(tmp_path, POLLING_INTERVAL="five minutes", MAX_RECONCILE_RATE="0")
    assert done.returncode == 1, done.stderr
    (line,) = done.stdout.splitlines()
    assert line.startswith("FAIL: settings: invalid setting POLLING_INTERVAL='five minutes'")
    assert "; invalid setting MAX_RECONCILE_RATE='0'" in line  # every bad setting, one line


def test_check_without_a_kubeconfig_is_one_fail_line_and_exit_1(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    done = run_check(tmp_path, "--kubeconfig", str(missing))
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines() == [
        f"FAIL: kubeconfig {missing}: file does not exist; "
        "point KUBECONFIG or --kubeconfig at an existing kubeconfig"
    ]


def test_check_help_describes_the_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert controller_main.main(["check", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m controller check")
    assert "helm test" in out


def test_without_the_subcommand_the_controller_command_line_is_unchanged(tmp_path: Path) -> None:
    # "check" is a subcommand only in first position; elsewhere it is a stray argument.
    done = subprocess.run(
        [sys.executable, "-m", "controller", "--log-level", "INFO", "check"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    assert "unrecognized arguments: check" in done.stderr


def test_check_in_a_pod_without_a_token_is_one_fail_line_and_exit_1(tmp_path: Path) -> None:
    done = run_check(
        tmp_path,
        KUBERNETES_SERVICE_HOST="10.96.0.1",
        KUBERNETES_SERVICE_PORT="443",
        POD_NAMESPACE="kserve-controller-system",
    )
    assert done.returncode == 1, done.stderr
    (line,) = done.stdout.splitlines()
    assert line.startswith("FAIL: in-cluster configuration (KUBERNETES_SERVICE_HOST is set): ")
    assert "service account token mount" in line
