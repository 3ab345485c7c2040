"""The chart's alerts and dashboard against a live ``/metrics`` page of the controller.

The page is served by the controller's own metrics server
(``controller.server.start_servers``) over the controller's registry
(``controller.metrics.Metrics``), scraped over HTTP like Prometheus does, and
parsed with prometheus_client's text-format parser: every metric the rendered
PrometheusRule and Grafana dashboard use must be declared there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client
from prometheus_client.parser import text_string_to_metric_families

from controller.metrics import Metrics
from controller.server import start_servers
from hack.cluster import LocalCluster
from hack.controllerproc import ControllerProcess, controller_for, running
from tests import chart
from tests.chart import chart_metric_names, render, scraped_metric_names
from tests.kubehelpers import eventually, required
from tests.runs import Runs, inference_config, inference_run

# The first test of a run may build helm from source (minutes on a cold machine:
# hack/helm/build.sh); later ones reuse the cached binary.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def monitored() -> list[dict[str, object]]:
    return render(
        {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}},
        api_versions=chart.WITH_PROMETHEUS_OPERATOR,
    )


@pytest.fixture(scope="module")
def monitored_honoring_labels() -> list[dict[str, object]]:
    """The chart with serviceMonitor.honorLabels: the run's ``namespace`` is stored as is."""
    return render(
        {
            "prometheusRule": {"enabled": True},
            "grafanaDashboard": {"enabled": True},
            "serviceMonitor": {"enabled": True, "honorLabels": True},
        },
        api_versions=chart.WITH_PROMETHEUS_OPERATOR,
    )


async def scrape() -> str:
    metrics = Metrics()
    servers = await start_servers(
        registry=metrics.registry,
        readiness={},
        bind_address="127.0.0.1",
        metrics_port=0,
        health_port=0,
    )
    try:
        url = f"http://127.0.0.1:{servers.metrics_port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            return await response.text()
    finally:
        await servers.stop()


async def test_alerts_and_dashboard_use_only_metrics_on_the_live_page(
    monitored: list[dict[str, object]],
) -> None:
    served = scraped_metric_names(await scrape())
    used = chart_metric_names(monitored)
    assert any(where.startswith("alert ") for where in used)
    assert any(where.startswith("dashboard ") for where in used)
    for where, names in used.items():
        assert names, f"{where}: no metric found"
        assert names <= served, f"{where} uses {sorted(names - served)}, not on /metrics"


# ----------------------------------------------------------------------------- promtool

# The release namespace chart.render() uses: the alerts select it, as they
# select the job of the chart's metrics Service.
RELEASE_NAMESPACE = "kserve-controller-system"
JOB = f"{chart.FULLNAME}-metrics"
LEASE = chart.FULLNAME  # leaderElection.leaseName defaults to the release's full name
FAIL = "test.local/fake-fail:1"


PROMTOOL_BUILD_SCRIPT = chart.REPO / "hack" / "promtool" / "build.sh"


def promtool() -> tuple[str | None, str]:
    """promtool: $PROMTOOL, else the pinned build (hack/promtool/build.sh), else PATH.

    Returns the binary (None if there is none) and why not.
    """
    named = os.environ.get("PROMTOOL")
    if named:
        if os.access(named, os.X_OK):
            return named, ""
        return None, f"PROMTOOL={named} is not executable"
    why = "no Go toolchain to build it with hack/promtool/build.sh"
    if shutil.which("go"):
        built = subprocess.run(
            ["bash", str(PROMTOOL_BUILD_SCRIPT)], capture_output=True, text=True, check=False
        )
        if built.returncode == 0:
            return built.stdout.strip().splitlines()[-1], ""
        why = f"hack/promtool/build.sh failed: {built.stderr.strip().splitlines()[-1:]}"
    return shutil.which("promtool"), why


def require_promtool() -> str:
    found, why = promtool()
    return required(
        found, f"promtool not found ({why}; or set PROMTOOL, or apt-get install prometheus)"
    )


def scraped_samples(page: str) -> dict[str, list[dict[str, str]]]:
    """sample name -> the label sets a live /metrics page serves for it."""
    samples: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(dict(sample.labels))
    return samples


def as_scraped(labels: Mapping[str, str], pod: str, *, honor_labels: bool) -> dict[str, str]:
    """The labels Prometheus stores for a sample of this pod under the chart's ServiceMonitor.

    The target's labels are added. With ``honor_labels`` false (the chart's
    default) a sample's own label that clashes with the target's loses: a run's
    ``namespace`` is kept as ``exported_namespace``. With ``honor_labels`` true
    the sample's own label wins and the target's is dropped: a run's
    ``namespace`` stays ``namespace``.
    """
    target = {
        "job": JOB,
        "namespace": RELEASE_NAMESPACE,
        "pod": pod,
        "instance": f"{pod}:8080",
        "service": JOB,
        "endpoint": "http-metrics",
        "container": "controller",
    }
    if honor_labels:
        return {**target, **labels}
    stored = {k: v for k, v in labels.items() if k not in target}
    for name in target.keys() & labels.keys():
        stored[f"exported_{name}"] = labels[name]
    return {**stored, **target}


def selector(name: str, labels: Mapping[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


class Scrape:
    """Input series for promtool whose names and labels come from one live scrape."""

    def __init__(self, page: str, *, honor_labels: bool = False) -> None:
        self.samples = scraped_samples(page)
        self.honor_labels = honor_labels
        # The label a run's namespace is stored under (see as_scraped).
        self.run_namespace_label = "namespace" if honor_labels else "exported_namespace"

    def labels(self, metric: str, /, **match: str) -> dict[str, str]:
        found = [s for s in self.samples.get(metric, []) if match.items() <= s.items()]
        assert found, f"{metric}{match} is not on the live /metrics page"
        return found[0]

    def series(self, metric: str, values: str, /, *, pod: str, **match: str) -> dict[str, str]:
        return {
            "series": selector(
                metric,
                as_scraped(self.labels(metric, **match), pod, honor_labels=self.honor_labels),
            ),
            "values": values,
        }


def firing(alert: str, eval_time: str, *expected: Mapping[str, str]) -> dict[str, object]:
    """A promql test: at ``eval_time`` exactly ``expected`` alerts ``alert`` fire."""
    return {
        "expr": f'ALERTS{{alertname="{alert}",alertstate="firing"}}',
        "eval_time": eval_time,
        "exp_samples": [
            {
                "labels": selector("ALERTS", {"alertname": alert, "alertstate": "firing", **e}),
                "value": 1,
            }
            for e in expected
        ],
    }


def quiet(eval_time: str) -> dict[str, object]:
    return {"expr": 'ALERTS{alertstate="firing"}', "eval_time": eval_time, "exp_samples": []}


def told(
    rules: list[dict[str, Any]],
    alert: str,
    eval_time: str,
    labels: Mapping[str, str],
    *,
    value: str,
    namespace_label: str,
) -> dict[str, object]:
    """A promtool alert test: ``alert`` fires at ``eval_time`` with ``labels``, and its
    annotations read the rule's text with those labels and ``value`` filled in.

    The expected text is the rendered rule's own with the label references
    replaced, so promtool checks that the templates render to it; the test then
    checks that the summary and description say whose runs (namespace, config).
    """
    (rule,) = [r for g in rules for r in g["rules"] if r.get("alert") == alert]
    expected: dict[str, str] = {}
    for key, text in rule["annotations"].items():
        for name, label in labels.items():
            text = text.replace(f"{{{{ $labels.{name} }}}}", label)
        expected[key] = text.replace("{{ $value }}", value)
    for key in ("summary", "description"):
        assert "{{" not in expected[key], f"{alert} {key}: a reference the test did not fill in"
        assert labels[namespace_label] in expected[key], f"{alert} {key} names no namespace"
        assert labels["config"] in expected[key], f"{alert} {key} names no config"
    return {
        "eval_time": eval_time,
        "alertname": alert,
        "exp_alerts": [{"exp_labels": dict(labels), "exp_annotations": expected}],
    }


def alert_tests(
    scrape: Scrape, rules: list[dict[str, Any]], run_namespace: str, *, election: bool
) -> list[dict[str, object]]:
    """promtool test groups: every alert fires when it should and not when it should not."""
    leader, standby = "controller-0", "controller-1"
    pods = [leader, standby] if election else [leader]

    def lease(values: Mapping[str, str]) -> list[dict[str, str]]:
        return [
            scrape.series("leader_election_master_status", values[pod], pod=pod, name=LEASE)
            for pod in pods
        ]

    leading = {leader: "1x60", standby: "0x60"}
    queue = scrape.labels("workqueue_depth", name="inferenceruns")["name"]
    failed = {"namespace": run_namespace, "config": "cfg", "result": "Failed"}
    finished = "kserve_inference_runs_finished_total"

    in_error = {"namespace": run_namespace, "config": "cfg", "phase": "Error"}

    def healthy(
        *,
        failures: str = "1x60",
        depth: str = "0x60",
        longest: str = "0x60",
        errors: str = "0x60",
        error_phase: str = "0x60",
        lease_values: Mapping[str, str] = leading,
    ) -> list[dict[str, str]]:
        series = [
            *lease(lease_values),
            scrape.series(finished, failures, pod=leader, **failed),
            scrape.series(finished, "0+1x60", pod=leader, **{**failed, "result": "Succeeded"}),
            scrape.series("kserve_inference_runs", error_phase, pod=leader, **in_error),
            scrape.series(
                "kserve_inference_runs", "3x60", pod=leader, **{**in_error, "phase": "Failed"}
            ),
            scrape.series("workqueue_depth", depth, pod=leader, name=queue),
            scrape.series(
                "workqueue_longest_running_processor_seconds", longest, pod=leader, name=queue
            ),
            scrape.series(
                "controller_runtime_reconcile_total", "0+20x60", pod=leader, result="success"
            ),
            scrape.series("controller_runtime_reconcile_total", errors, pod=leader, result="error"),
            scrape.series("controller_runtime_reconcile_errors_total", errors, pod=leader),
        ]
        return series

    def case(series: list[dict[str, str]], *tests: dict[str, object]) -> dict[str, object]:
        """One promtool test group: ``series`` sampled each minute, then ``tests``."""
        return {"interval": "1m", "input_series": series, "promql_expr_test": list(tests)}

    def onset(
        alert: str, before: str, at: str, labels: Mapping[str, str]
    ) -> list[dict[str, object]]:
        """``alert`` not firing yet at ``before``, firing with ``labels`` at ``at``."""
        return [firing(alert, before), firing(alert, at, labels)]

    warning, critical = {"severity": "warning"}, {"severity": "critical"}
    namespace_label = scrape.run_namespace_label
    config = {namespace_label: run_namespace, "config": "cfg", **warning}
    no_leader = "InferenceControllerNoLeader"
    groups: list[dict[str, object]] = [
        # Nothing wrong: a steady count of old failures, a leader, an empty queue.
        case(healthy(), quiet("20m"), quiet("40m"), quiet("60m")),
        # A run fails at 30 min: seen at once, forgotten 15 minutes later.
        case(
            healthy(failures="1x29 2x30"),
            *onset("InferenceRunsFailing", "29m", "31m", config),
            firing("InferenceRunsFailing", "43m", config),
            firing("InferenceRunsFailing", "47m"),
        ),
        # The first failure of a config (a counter appears at 1) or of a new leader.
        case(
            healthy(failures="_x30 1x30"),
            *onset("InferenceRunsFailing", "29m", "31m", config),
            firing("InferenceRunsFailing", "47m"),
        ),
        case(
            healthy(error_phase="0x10 2x50"), *onset("InferenceRunsInError", "20m", "28m", config)
        ),
        case(
            healthy(errors="0+10x60"),
            *onset("InferenceControllerReconcileErrors", "10m", "25m", warning),
        ),
        case(
            healthy(depth="0x10 500x50"),
            *onset("InferenceControllerQueueBacklog", "20m", "28m", {"name": queue, **warning}),
        ),
        case(
            healthy(longest="0x10 0+60x50"),
            *onset("InferenceControllerStuckWorker", "17m", "24m", {"name": queue, **warning}),
        ),
        # The leader goes away at 10 min (its gauge drops to 0, or it is not scraped).
        case(
            healthy(lease_values={leader: "1x10 0x50", standby: "0x60"}),
            *onset(no_leader, "14m", "18m", critical),
        ),
        case(
            healthy(lease_values={leader: "1x10 stale", standby: "0x60"}),
            *onset(no_leader, "14m", "18m", critical),
        ),
    ]
    # Whose runs: the two run alerts name the namespace and the config, as promtool renders them.
    groups.append(
        {
            **case(healthy(failures="_x30 1x30", error_phase="0x10 2x50")),
            "alert_rule_test": [
                told(
                    rules,
                    "InferenceRunsFailing",
                    "31m",
                    config,
                    value="1",
                    namespace_label=namespace_label,
                ),
                told(
                    rules,
                    "InferenceRunsInError",
                    "28m",
                    config,
                    value="2",
                    namespace_label=namespace_label,
                ),
            ],
        }
    )
    if election:
        # The standby claims the Lease too.
        groups.append(
            case(
                healthy(lease_values={leader: "1x60", standby: "0x10 1x50"}),
                *onset("InferenceControllerSplitBrain", "10m", "13m", critical),
            )
        )
    return groups


def run_promtool(
    binary: str, groups: list[dict[str, object]], tests: list[dict[str, object]], workdir: Path
) -> None:
    rules = workdir / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    check = subprocess.run([binary, "check", "rules", str(rules)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    spec = workdir / "tests.yaml"
    spec.write_text(
        yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m", "tests": tests})
    )
    result = subprocess.run(
        [binary, "test", "rules", spec.name], capture_output=True, text=True, cwd=workdir
    )
    assert result.returncode == 0, f"promtool test rules {spec}:\n{result.stdout}{result.stderr}"


def dashboard_variable_metrics(objects: list[dict[str, object]]) -> dict[str, set[str]]:
    """Dashboard variable name -> the metrics its query reads."""
    (configmap,) = [
        o
        for o in chart.find(objects, "ConfigMap")
        if str(o["metadata"]["name"]).endswith("-dashboard")
    ]
    (text,) = configmap["data"].values()
    found: dict[str, set[str]] = {}
    for variable in json.loads(text)["templating"]["list"]:
        if variable.get("type") != "query":
            continue
        query = variable["query"]
        query = query["query"] if isinstance(query, dict) else query
        found[variable["name"]] = chart.promql_metric_names(query)
    assert found, "the dashboard has no query variable"
    return found


def rule_groups(objects: list[dict[str, object]]) -> list[dict[str, Any]]:
    (rule,) = chart.find(objects, "PrometheusRule")
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


async def live_page(
    api_client: client.ApiClient, namespace: str, proc: ControllerProcess, *, election: bool
) -> str:
    """A failed run, then the controller's /metrics once it leads and has counted the run.

    The run's counter goes up once its status is written, so a scrape right
    after the API server shows the run Failed may come a moment before it.
    """
    runs = Runs(api_client, namespace)
    await runs.create(inference_config("cfg", FAIL))
    await runs.create_and_wait(inference_run("r", "cfg"), "Failed")
    leading = f'leader_election_master_status{{name="{LEASE}"}} 1.0'
    if not election:
        assert leading in proc.metrics()  # one replica without election leads

    async def scraped() -> str | None:
        page = proc.metrics()
        counted = proc.metric(
            "kserve_inference_runs_finished_total", page, namespace=namespace, result="Failed"
        )
        return page if leading in page and counted else None

    return await eventually(
        scraped, within=30, what="the leader gauge at 1 and the failed run counted"
    )


@pytest.mark.parametrize(
    "election",
    [pytest.param(True, id="leader-election-on"), pytest.param(False, id="leader-election-off")],
)
async def test_every_alert_fires_when_it_should_on_series_of_a_live_scrape(
    election: bool,
    monitored: list[dict[str, object]],
    monitored_honoring_labels: list[dict[str, object]],
    api_client: client.ApiClient,
    namespace: str,
    cluster: LocalCluster,
    tmp_path: Path,
) -> None:
    binary = require_promtool()
    env = {"LEADER_ELECT": "true" if election else "false", "LEASE_NAME": LEASE}
    with running(controller_for(cluster, namespace, tmp_path, env=env)) as proc:
        page = await live_page(api_client, namespace, proc, election=election)
    scrape = Scrape(page)
    # The dashboard's variables list label values of samples, not of declared
    # families: with no sample they come up empty and so does every panel.
    for variable, names in dashboard_variable_metrics(monitored).items():
        for name in names:
            assert scrape.samples.get(name), f"dashboard variable ${variable}: no {name} sample"
    finished = "kserve_inference_runs_finished_total"
    assert {"namespace": namespace, "config": "cfg", "result": "Failed"} in [
        {k: v for k, v in labels.items() if k in ("namespace", "config", "result")}
        for labels in scrape.samples.get(finished, [])
    ], "the failed run was not counted in kserve_inference_runs_finished_total"
    # The same alerts, on the series as Prometheus stores them under each
    # serviceMonitor.honorLabels, with the rules the chart renders for it.
    for honor_labels, objects in ((False, monitored), (True, monitored_honoring_labels)):
        as_stored = Scrape(page, honor_labels=honor_labels)
        workdir = tmp_path / f"honor-labels-{str(honor_labels).lower()}"
        workdir.mkdir()
        groups = rule_groups(objects)
        tests = alert_tests(as_stored, groups, namespace, election=election)
        run_promtool(binary, groups, tests, workdir)


def test_the_migration_guides_recording_rules_give_the_old_names_back(tmp_path: Path) -> None:
    binary = require_promtool()
    text = (chart.REPO / "docs" / "migration.md").read_text()
    marker = "<!-- migration: recording rules -->\n```yaml\n"
    start = text.index(marker) + len(marker)
    rules = yaml.safe_load(text[start : text.index("```", start)])
    pod = {"job": JOB, "namespace": RELEASE_NAMESPACE, "pod": "controller-0"}
    a = {**pod, "exported_namespace": "a", "config": "cfg", "phase": "Running"}
    b = {**pod, "exported_namespace": "b", "config": "other", "phase": "Running"}
    rows = {**pod, "exported_namespace": "a", "config": "cfg"}
    tests = [
        {
            "interval": "1m",
            "input_series": [
                {"series": selector("kserve_inference_runs", a), "values": "2x5"},
                {"series": selector("kserve_inference_runs", b), "values": "1x5"},
                {"series": selector("kserve_inference_rows_total", rows), "values": "0+10x5"},
            ],
            "promql_expr_test": [
                {
                    "expr": "inference_runs",
                    "eval_time": "5m",
                    "exp_samples": [
                        {
                            "labels": selector("inference_runs", {**pod, "phase": "Running"}),
                            "value": 3,
                        }
                    ],
                },
                {
                    "expr": "inference_rows_total",
                    "eval_time": "5m",
                    "exp_samples": [
                        {"labels": selector("inference_rows_total", rows), "value": 50}
                    ],
                },
            ],
        }
    ]
    run_promtool(binary, rules["groups"], tests, tmp_path)
