"""Settings from environment and flags (controller/settings.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.settings import Settings, SettingsError, load_settings, parse_duration

NO_FILE = Path("/nonexistent/namespace")


def load(argv: list[str] | None = None, **env: str) -> Settings:
    return load_settings(argv or [], env, namespace_file=NO_FILE)


def test_defaults() -> None:
    s = load()
    assert s.polling_interval == 300
    assert s.max_reconcile_rate == 1
    assert s.workers == 1
    assert s.watch_namespaces == ()
    assert s.runner_service_account is None
    assert (s.log_level, s.log_format) == ("INFO", "json")
    assert (s.bind_address, s.metrics_port, s.health_port) == ("0.0.0.0", 8080, 8081)
    assert s.leader_election is False
    assert (s.lease_duration, s.renew_deadline, s.retry_period) == (15, 10, 2)
    assert (s.kube_api_qps, s.kube_api_burst) == (200, 400)
    assert (s.events_qps, s.events_burst) == (10, 50)
    assert (s.effective_queue_qps, s.effective_queue_burst) == (10, 100)
    assert s.kubeconfig is None
    assert s.in_cluster is False


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("300", 300),
        ("30s", 30),
        ("1m", 60),
        ("1h30m", 5400),
        ("1.5h", 5400),
        (" 45 ", 45),
        ("2m30s", 150),
        ("1", 1),
    ],
)
def test_polling_interval_accepts_seconds_and_go_durations(text: str, seconds: float) -> None:
    assert load(POLLING_INTERVAL=text).polling_interval == seconds


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("0", "positive"),
        ("0s", "positive"),
        ("-5", "positive"),
        ("-1m", "positive"),
        ("abc", "not a duration"),
        ("", "not a duration"),
        ("5 minutes", "not a duration"),
        ("300ms", "shorter than 1s"),
    ],
)
def test_polling_interval_never_becomes_a_silent_default(text: str, why: str) -> None:
    with pytest.raises(SettingsError, match=rf"POLLING_INTERVAL='{text}'.*{why}"):
        load(POLLING_INTERVAL=text)


def test_parse_duration_rejects_non_strings_it_cannot_read() -> None:
    assert parse_duration(12) == 12.0
    with pytest.raises(ValueError, match="duration"):
        parse_duration(True)
    with pytest.raises(ValueError, match="duration"):
        parse_duration(["1s"])


def test_flags_override_environment_and_accept_upstream_spellings() -> None:
    s = load(
        ["--pollinginterval", "1m", "--maxreconcilerate", "4", "--watchnamespace", "b"],
        POLLING_INTERVAL="10",
        MAX_RECONCILE_RATE="2",
        WATCH_NAMESPACE="a",
    )
    assert (s.polling_interval, s.max_reconcile_rate, s.watch_namespaces) == (60, 4, ("b",))
    s = load(["--polling-interval", "2m", "--max-reconcile-rate", "3"])
    assert (s.polling_interval, s.max_reconcile_rate) == (120, 3)


def test_environment_names_are_case_insensitive() -> None:
    assert load(polling_interval="7").polling_interval == 7


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_max_reconcile_rate_must_be_a_positive_integer(value: str) -> None:
    with pytest.raises(SettingsError, match=rf"MAX_RECONCILE_RATE='{value}'"):
        load(MAX_RECONCILE_RATE=value)


def test_max_reconcile_rate_scales_the_queue_token_bucket_unless_set() -> None:
    s = load(MAX_RECONCILE_RATE="4")
    assert (s.workers, s.effective_queue_qps, s.effective_queue_burst) == (4, 40, 400)
    s = load(MAX_RECONCILE_RATE="4", QUEUE_QPS="3", QUEUE_BURST="7")
    assert (s.effective_queue_qps, s.effective_queue_burst) == (3, 7)


@pytest.mark.parametrize(
    ("value", "namespaces"),
    [
        ("", ()),
        ("team-a", ("team-a",)),
        ("team-a,team-b", ("team-a", "team-b")),
        (" team-a , team-b ,, team-a ", ("team-a", "team-b")),
    ],
)
def test_watch_namespace_all_one_or_several(value: str, namespaces: tuple[str, ...]) -> None:
    assert load(WATCH_NAMESPACE=value).watch_namespaces == namespaces


@pytest.mark.parametrize("value", ["Team-A", "a_b", "-a", "a" * 64, "a,b c"])
def test_watch_namespace_rejects_invalid_names(value: str) -> None:
    with pytest.raises(SettingsError, match=r"WATCH_NAMESPACE=.*not a valid namespace name"):
        load(WATCH_NAMESPACE=value)


def test_runner_service_account_also_read_from_upstream_sa_runner() -> None:
    assert load(SA_RUNNER="runners").runner_service_account == "runners"
    assert load(RUNNER_SERVICE_ACCOUNT="mine").runner_service_account == "mine"
    assert load(["--sa-runner", "flag"]).runner_service_account == "flag"
    assert load(RUNNER_SERVICE_ACCOUNT="").runner_service_account is None


def test_log_level_and_format() -> None:
    s = load(LOG_LEVEL="debug", LOG_FORMAT="Console")
    assert (s.log_level, s.log_format) == ("DEBUG", "console")
    with pytest.raises(SettingsError, match="LOG_LEVEL='loud'"):
        load(LOG_LEVEL="loud")
    with pytest.raises(SettingsError, match="LOG_FORMAT='xml'"):
        load(LOG_FORMAT="xml")


def test_ports_and_bind_address() -> None:
    s = load(["--metrics-port", "9090"], HEALTH_PORT="9091", BIND_ADDRESS="127.0.0.1")
    assert (s.metrics_port, s.health_port, s.bind_address) == (9090, 9091, "127.0.0.1")
    with pytest.raises(SettingsError, match="METRICS_PORT='http'"):
        load(METRICS_PORT="http")
    with pytest.raises(SettingsError, match="HEALTH_PORT='70000'"):
        load(HEALTH_PORT="70000")


def test_leader_election_defaults_on_in_cluster_and_off_locally(tmp_path: Path) -> None:
    namespace_file = tmp_path / "namespace"
    namespace_file.write_text("controller-system\n")
    s = load_settings([], {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, namespace_file=namespace_file)
    assert (s.in_cluster, s.leader_election, s.lease_namespace) == (
        True,
        True,
        "controller-system",
    )
    s = load_settings(
        [],
        {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBECONFIG": "/tmp/k"},
        namespace_file=namespace_file,
    )
    assert (s.in_cluster, s.leader_election) == (False, False)
    assert load().leader_election is False


def test_leader_elect_explicit_values() -> None:
    assert load(["--leader-elect"], LEASE_NAMESPACE="x").leader_election is True
    assert load(["--no-leader-elect"], LEADER_ELECT="true").leader_election is False
    assert load(LEADER_ELECT="false", KUBERNETES_SERVICE_HOST="h").leader_election is False
    assert load(LEADER_ELECT="", LEASE_NAMESPACE="x").leader_elect is None
    with pytest.raises(SettingsError, match="LEADER_ELECT='maybe'"):
        load(LEADER_ELECT="maybe")


def test_lease_namespace_falls_back_to_pod_namespace_then_the_only_watched_one() -> None:
    assert load(LEADER_ELECT="1", POD_NAMESPACE="p").lease_namespace == "p"
    assert load(LEADER_ELECT="1", WATCH_NAMESPACE="w").lease_namespace == "w"
    assert load(LEADER_ELECT="1", LEASE_NAMESPACE="l", POD_NAMESPACE="p").lease_namespace == "l"
    with pytest.raises(SettingsError, match="LEASE_NAMESPACE"):
        load(LEADER_ELECT="1", WATCH_NAMESPACE="a,b")


def test_leader_election_timings_are_checked_like_client_go() -> None:
    s = load(LEASE_DURATION="30s", RENEW_DEADLINE="20s", RETRY_PERIOD="5s")
    assert (s.lease_duration, s.renew_deadline, s.retry_period) == (30, 20, 5)
    with pytest.raises(SettingsError, match="LEASE_DURATION must be greater than RENEW_DEADLINE"):
        load(LEASE_DURATION="10s")
    with pytest.raises(SettingsError, match=r"RENEW_DEADLINE must be greater than 1\.2"):
        load(RETRY_PERIOD="9s")
    with pytest.raises(SettingsError, match="LEASE_NAME"):
        load(LEASE_NAME="Not_A_Name")


def test_pod_name_from_downward_api_or_hostname() -> None:
    assert load(HOSTNAME="ctl-7d9f").pod_name == "ctl-7d9f"
    assert load(HOSTNAME="ctl-7d9f", POD_NAME="pod-1").pod_name == "pod-1"


def test_client_qps_and_kubeconfig() -> None:
    s = load(["--kubeconfig", "/tmp/kc"], KUBE_API_QPS="50", KUBE_API_BURST="80")
    assert (s.kube_api_qps, s.kube_api_burst, s.kubeconfig) == (50, 80, "/tmp/kc")
    assert load(KUBECONFIG="/tmp/env").kubeconfig == "/tmp/env"
    with pytest.raises(SettingsError, match="KUBE_API_QPS='0'"):
        load(KUBE_API_QPS="0")
    s = load(EVENTS_QPS="2.5", EVENTS_BURST="5")
    assert (s.events_qps, s.events_burst) == (2.5, 5)
    with pytest.raises(SettingsError, match="EVENTS_BURST='0'"):
        load(EVENTS_BURST="0")


def test_every_bad_setting_is_named_in_one_message() -> None:
    with pytest.raises(SettingsError) as info:
        load(POLLING_INTERVAL="soon", MAX_RECONCILE_RATE="0", METRICS_PORT="-1")
    lines = str(info.value).splitlines()
    assert len(lines) == 3
    assert [line.split("=")[0] for line in lines] == [
        "invalid setting POLLING_INTERVAL",
        "invalid setting MAX_RECONCILE_RATE",
        "invalid setting METRICS_PORT",
    ]


def test_unknown_flags_and_missing_values_are_errors_not_exits() -> None:
    with pytest.raises(SettingsError, match="unrecognized arguments: --bogus"):
        load(["--bogus"])
    with pytest.raises(SettingsError, match="--polling-interval"):
        load(["--polling-interval"])


def test_help_lists_every_setting_with_its_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        load(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for text in ("--polling-interval", "[POLLING_INTERVAL]", "[RUNNER_SERVICE_ACCOUNT, SA_RUNNER]"):
        assert text in out


def test_unrelated_environment_variables_are_ignored() -> None:
    assert load(PATH="/usr/bin", HOME="/root").polling_interval == 300


def test_settings_are_immutable() -> None:
    s = load()
    with pytest.raises(Exception, match="frozen"):
        s.polling_interval = 1


@pytest.mark.parametrize(("value", "seconds"), [("0", 0.0), ("0s", 0.0), ("30m", 1800.0)])
def test_probe_interval_zero_turns_probes_off(value: str, seconds: float) -> None:
    assert load_settings([], {"PROBE_INTERVAL": value}).probe_interval == seconds


def test_probe_interval_must_be_a_duration() -> None:
    with pytest.raises(SettingsError, match="PROBE_INTERVAL"):
        load_settings([], {"PROBE_INTERVAL": "-1"})


def test_shards_default_to_one_and_the_lease_keeps_its_name() -> None:
    s = load(LEASE_NAME="ksc")
    assert (s.shard_count, s.shard_index) == (1, 0)
    assert s.effective_lease_name == "ksc"


def test_each_shard_has_a_lease_of_its_own() -> None:
    s = load(["--shard-index", "1"], LEASE_NAME="ksc", SHARD_COUNT="2")
    assert (s.shard_count, s.shard_index) == (2, 1)
    assert s.effective_lease_name == "ksc-shard-1-of-2"
    assert s.lease_name == "ksc"


@pytest.mark.parametrize(
    ("count", "index", "why"),
    [
        ("2", "2", r"SHARD_INDEX=2 is out of range for SHARD_COUNT=2: shards are numbered 0\.\.1"),
        ("1", "1", r"SHARD_INDEX=1 is out of range for SHARD_COUNT=1"),
        ("2", "-1", r"SHARD_INDEX='-1'"),
        ("0", "0", r"SHARD_COUNT='0'"),
        ("two", "0", r"SHARD_COUNT='two'"),
        ("1001", "0", r"SHARD_COUNT='1001'"),
    ],
)
def test_a_shard_index_outside_the_count_is_an_error(count: str, index: str, why: str) -> None:
    with pytest.raises(SettingsError, match=why):
        load(SHARD_COUNT=count, SHARD_INDEX=index)


def test_a_sharded_lease_name_must_stay_a_valid_length() -> None:
    with pytest.raises(SettingsError, match="longer than 253"):
        load(LEASE_NAME="a" * 250, SHARD_COUNT="2")
    assert load(LEASE_NAME="a" * 250).effective_lease_name == "a" * 250


@pytest.mark.parametrize(
    ("env", "seconds"),
    [({}, 600.0), ({"POD_START_TIMEOUT": "0"}, 0.0), ({"POD_START_TIMEOUT": "90s"}, 90.0)],
)
def test_pod_start_timeout_defaults_to_ten_minutes_and_zero_waits_for_ever(
    env: dict[str, str], seconds: float
) -> None:
    assert load_settings([], env).pod_start_timeout == seconds


def test_pod_start_timeout_must_be_a_duration() -> None:
    with pytest.raises(SettingsError, match="POD_START_TIMEOUT"):
        load_settings([], {"POD_START_TIMEOUT": "soon"})
