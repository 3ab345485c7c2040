"""The Helm chart, rendered offline by the pinned helm binary (no cluster).

What is checked here: lint, the CRDs generated from crds/, the controller's
and the runner's RBAC (exact rules, no Secrets for the controller, get-only for
runners), Pod Security "restricted" fields, the settings ConfigMap against
controller/settings.py, and the metric names used by alerts and the dashboard
against controller/metrics.py. Applying the chart to a real API server is in
tests/integration/test_chart_on_apiserver.py.
"""

from __future__ import annotations

import json
import re
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.metrics import Metrics
from controller.settings import Settings, SettingsError, load_settings
from hack.chart import CHART_CRDS_DIR, generate_crds, package, parse
from tests.chart import (
    CHART_DIR,
    CONTROLLER_SERVICE_ACCOUNT,
    FULLNAME,
    RELEASE,
    REPO,
    RUNNER_SERVICE_ACCOUNT,
    WITH_PROMETHEUS_OPERATOR,
    HelmError,
    Obj,
    controller_rbac_objects,
    controller_rules,
    dashboard_queries,
    exported_metric_names,
    find,
    helm,
    helm_docs,
    one,
    promql_metric_names,
    render,
    render_text,
    rule_expressions,
)

# The first test of a run may build helm from source (minutes on a cold machine:
# hack/helm/build.sh); later ones reuse the cached binary.
pytestmark = [pytest.mark.unit, pytest.mark.timeout(900)]

NS = "kserve-controller-system"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

# The controller's permissions, exactly (issue 8): anything more is a finding.
EXPECTED_CONTROLLER_RULES: dict[tuple[str, str], set[str]] = {
    ("ai.krateo.io", "inferenceruns"): {"get", "list", "watch", "delete"},
    ("ai.krateo.io", "inferenceruns/status"): {"get", "update", "patch"},
    ("ai.krateo.io", "inferenceconfigs"): {"get", "list", "watch"},
    ("ai.krateo.io", "inferenceconfigs/status"): {"get", "update", "patch"},
    ("batch", "jobs"): {"get", "list", "watch", "create", "update", "patch", "delete"},
    ("batch", "cronjobs"): {"get", "list", "watch", "create", "update", "patch", "delete"},
    ("", "configmaps"): {"get", "list", "watch", "create", "update", "patch", "delete"},
    ("", "pods"): {"get", "list", "watch"},
    ("", "pods/log"): {"get"},
    ("", "events"): {"create", "patch", "list"},
    ("events.k8s.io", "events"): {"create", "patch"},
    # spec.kserve.inferenceServiceRef (inferenceServices.enabled, the default).
    ("serving.kserve.io", "inferenceservices"): {"get", "list", "watch"},
}
LEASE_RULES = {
    ("coordination.k8s.io", "leases"): {"create", "get", "update"},
    # The Lease's owner (its ownerReference needs the uid).
    ("", "serviceaccounts"): {"get"},
}


@pytest.fixture(scope="module")
def default_objects() -> list[Obj]:
    return render(namespace=NS)


@pytest.fixture(scope="module")
def monitored_objects() -> list[Obj]:
    return render(
        {
            "serviceMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
            "grafanaDashboard": {"enabled": True},
        },
        namespace=NS,
        api_versions=WITH_PROMETHEUS_OPERATOR,
    )


def container(objects: list[Obj]) -> Obj:
    deployment = one(objects, "Deployment")
    (main,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(main)


def settings_data(objects: list[Obj]) -> dict[str, str]:
    return dict(one(objects, "ConfigMap", f"{CONTROLLER_SERVICE_ACCOUNT}-settings")["data"])


# ----------------------------------------------------------------------------- chart basics


def test_helm_lint_is_clean() -> None:
    done = helm("lint", "--strict", str(CHART_DIR))
    assert "0 chart(s) failed" in done.stdout
    assert not re.search(r"\[(WARNING|ERROR)\]", done.stdout + done.stderr), done.stdout


def repository_crds() -> dict[str, bytes]:
    crds = {p.name: p.read_bytes() for p in sorted((REPO / "crds").glob("*.yaml"))}
    assert crds, "no CRDs in crds/"
    return crds


def test_the_charts_crds_are_generated_from_the_repository_crds(tmp_path: Path) -> None:
    """files/crds/ is made from crds/ (`make chart`; helm() makes it before its first command)."""
    source = repository_crds()
    # A copy gone stale, and a CRD that crds/ no longer has.
    target = tmp_path / "crds"
    target.mkdir()
    (target / sorted(source)[0]).write_bytes(b"stale")
    (target / "gone.ai.krateo.io.yaml").write_bytes(b"old")
    written = generate_crds(target=target)
    assert {p.name for p in written} == set(source)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == source
    assert generate_crds(target=target) == [], "a copy already right is left alone"
    # The chart every test renders holds exactly them.
    helm("version")
    assert {p.name: p.read_bytes() for p in sorted(CHART_CRDS_DIR.glob("*.yaml"))} == source


def test_a_chart_without_its_crds_says_how_to_make_them(tmp_path: Path) -> None:
    chart = tmp_path / "chart"
    shutil.copytree(CHART_DIR, chart)
    shutil.rmtree(chart / "files" / "crds")
    with pytest.raises(HelmError, match="make chart"):
        helm("template", RELEASE, str(chart), "--namespace", NS)
    without = parse(
        helm(
            "template", RELEASE, str(chart), "--namespace", NS, "--set", "crds.install=false"
        ).stdout
    )
    assert find(without, "Deployment")
    assert not find(without, "CustomResourceDefinition")


def test_the_packaged_chart_holds_the_crds(tmp_path: Path) -> None:
    archive = package(tmp_path)
    with tarfile.open(archive) as packaged:
        crds = {
            Path(member.name).name: packaged.extractfile(member).read()  # type: ignore[union-attr]
            for member in packaged.getmembers()
            if "/files/crds/" in member.name
        }
    assert crds == repository_crds()


def test_the_crds_are_release_templates_kept_on_uninstall() -> None:
    crds = find(render(), "CustomResourceDefinition")
    source = {p.name: yaml.safe_load(p.read_text()) for p in (REPO / "crds").glob("*.yaml")}
    assert {c["metadata"]["name"] for c in crds} == {
        "inferenceconfigs.ai.krateo.io",
        "inferenceruns.ai.krateo.io",
    }
    for crd in crds:
        original = source[f"{crd['metadata']['name']}.yaml"]
        assert crd["spec"] == original["spec"]  # the schema exactly as in crds/
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert crd["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
        assert crd["metadata"]["labels"]["app.kubernetes.io/component"] == "crd"
    unkept = find(render({"crds": {"keep": False}}), "CustomResourceDefinition")
    assert all(
        "helm.sh/resource-policy" not in c["metadata"].get("annotations", {}) for c in unkept
    )
    assert not find(render({"crds": {"install": False}}), "CustomResourceDefinition")


def test_object_names_stay_valid_for_long_release_names() -> None:
    release = "a-very-long-release-name-that-goes-on-and-on-x"  # 46 characters
    objects = render({"watchNamespaces": ["team-a"]}, release=release)
    for obj in objects:
        name = obj["metadata"]["name"]
        assert len(name) <= 253, f"{obj['kind']} {name!r}"
        assert DNS_SUBDOMAIN.match(name), f"{obj['kind']} {name!r}"
    # A Service name is a DNS label; the Deployment's leaves room for pod suffixes.
    for kind in ("Service", "Deployment", "ServiceAccount"):
        for obj in find(objects, kind):
            assert len(obj["metadata"]["name"]) <= 63
            assert DNS_LABEL.match(obj["metadata"]["name"])


def test_the_values_schema_rejects_unknown_keys_and_bad_namespaces() -> None:
    with pytest.raises(HelmError, match="additional properties 'replicas' not allowed"):
        render({"replicas": 3})
    with pytest.raises(HelmError, match="watchNamespaces"):
        render({"watchNamespaces": ["Not_A_Namespace"]})
    with pytest.raises(HelmError, match="pollingInterval"):
        render({"settings": {"pollingInterval": "five minutes"}})


def test_several_replicas_without_leader_election_are_refused() -> None:
    with pytest.raises(HelmError, match=r"needs leaderElection\.enabled=true"):
        render({"leaderElection": {"enabled": False}})
    single = render({"replicaCount": 1, "leaderElection": {"enabled": False}})
    assert settings_data(single)["LEADER_ELECT"] == "false"
    assert not [r for r in find(single, "Role") if r["metadata"]["name"].endswith("-election")]


# ----------------------------------------------------------------------------- Deployment


def test_deployment_runs_two_replicas_with_probes_and_resources(default_objects: list[Obj]) -> None:
    deployment = one(default_objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    main = container(default_objects)
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    data = settings_data(default_objects)
    assert ports == {"http-metrics": int(data["METRICS_PORT"]), "health": int(data["HEALTH_PORT"])}
    assert main["resources"]["requests"]["cpu"]
    assert main["resources"]["limits"]["memory"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == CONTROLLER_SERVICE_ACCOUNT
    assert main["image"] == "ghcr.io/krateoplatformops/kserve-inference-controller:0.1.0"


def test_deployment_meets_pod_security_restricted(default_objects: list[Obj]) -> None:
    pod = one(default_objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in pod["containers"] + pod.get("initContainers", []):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert not sc["capabilities"].get("add")
        assert sc["readOnlyRootFilesystem"] is True
        assert isinstance(sc["runAsUser"], int)
        assert sc["runAsUser"] > 0
    for host_namespace in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(host_namespace)
    for volume in pod["volumes"]:
        assert "hostPath" not in volume


def test_a_settings_change_rolls_the_pods() -> None:
    def checksum(objects: list[Obj]) -> str:
        annotations = one(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
        return str(annotations["checksum/settings"])

    assert checksum(render()) != checksum(render({"settings": {"logLevel": "DEBUG"}}))


SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes"


def test_the_controller_pod_names_its_emptydirs_safe_to_evict(default_objects: list[Obj]) -> None:
    """The cluster autoscaler keeps a node for a pod with local storage unless told."""
    for objects in (default_objects, render({"sharding": {"shards": 2}})):
        for deployment in find(objects, "Deployment"):
            template = deployment["spec"]["template"]
            empty_dirs = [v["name"] for v in template["spec"]["volumes"] if "emptyDir" in v]
            assert empty_dirs == ["tmp"]
            assert template["metadata"]["annotations"][SAFE_TO_EVICT] == ",".join(empty_dirs)
    # podAnnotations may say otherwise (keep the node), once, without a duplicate key.
    mine = render({"podAnnotations": {SAFE_TO_EVICT: "", "team": "a"}})
    annotations = one(mine, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations[SAFE_TO_EVICT] == ""
    assert annotations["team"] == "a"


def test_image_digest_wins_over_tag() -> None:
    digest = "sha256:" + "a" * 64
    objects = render({"image": {"repository": "r.example/ksc", "tag": "9", "digest": digest}})
    assert container(objects)["image"] == f"r.example/ksc@{digest}"


def test_pdb_and_metrics_service_select_the_controller_pods(default_objects: list[Obj]) -> None:
    pod_labels = one(default_objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    pdb = one(default_objects, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service = one(default_objects, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["name"] == "http-metrics"
    assert port["targetPort"] == "http-metrics"
    assert port["port"] == int(settings_data(default_objects)["METRICS_PORT"])


def test_service_monitor_scrapes_the_metrics_service(monitored_objects: list[Obj]) -> None:
    monitor = one(monitored_objects, "ServiceMonitor")
    service = one(monitored_objects, "Service")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["http-metrics"]
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NS]


def test_service_monitor_takes_relabelings_honor_labels_and_a_namespace() -> None:
    relabel = [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}]
    drop = [{"sourceLabels": ["__name__"], "regex": "python_gc_.*", "action": "drop"}]
    objects = render(
        {
            "serviceMonitor": {
                "enabled": True,
                "namespace": "monitoring",
                "honorLabels": True,
                "relabelings": relabel,
                "metricRelabelings": drop,
            }
        },
        namespace=NS,
        api_versions=WITH_PROMETHEUS_OPERATOR,
    )
    monitor = one(objects, "ServiceMonitor")
    assert monitor["metadata"]["namespace"] == "monitoring"
    # It still scrapes the release's metrics Service.
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NS]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    assert endpoint["relabelings"] == relabel
    assert endpoint["metricRelabelings"] == drop


def test_service_monitor_defaults_add_no_relabeling(monitored_objects: list[Obj]) -> None:
    monitor = one(monitored_objects, "ServiceMonitor")
    assert monitor["metadata"]["namespace"] == NS
    (endpoint,) = monitor["spec"]["endpoints"]
    assert not {"honorLabels", "relabelings", "metricRelabelings"} & endpoint.keys()
    with pytest.raises(HelmError, match="namespace"):
        render({"serviceMonitor": {"namespace": "Not_A_Namespace"}}, namespace=NS)


def test_runbook_urls_follow_the_value() -> None:
    objects = render(
        {
            "prometheusRule": {
                "enabled": True,
                "runbookUrl": "https://wiki.example/ml/kserve-runbooks",
            }
        },
        namespace=NS,
        api_versions=WITH_PROMETHEUS_OPERATOR,
    )
    (rule_object,) = find(objects, "PrometheusRule")
    alerts = [r for g in rule_object["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    for alert in alerts:
        expected = f"https://wiki.example/ml/kserve-runbooks#{alert['alert'].lower()}"
        assert alert["annotations"]["runbook_url"] == expected
    with pytest.raises(HelmError, match="runbookUrl"):
        render({"prometheusRule": {"runbookUrl": "operator-guide.md"}}, namespace=NS)


def test_monitoring_objects_are_off_by_default(default_objects: list[Obj]) -> None:
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert not find(default_objects, kind)
    assert not find(default_objects, "ConfigMap", f"{CONTROLLER_SERVICE_ACCOUNT}-dashboard")


# ----------------------------------------------------------------------------- settings


def test_settings_configmap_holds_only_real_settings(default_objects: list[Obj]) -> None:
    # Settings ignores unknown variables, so a misspelt key would be lost silently.
    known = {name.upper() for name in Settings.model_fields} | {"SA_RUNNER"}
    data = settings_data(default_objects)
    assert set(data) <= known, sorted(set(data) - known)


@pytest.mark.parametrize("watch", [[], ["team-a"], ["team-a", "team-b"]])
def test_settings_configmap_loads_as_the_controller_would(watch: list[str]) -> None:
    objects = render({"watchNamespaces": watch}, namespace=NS)
    # What the pod's environment holds: envFrom the ConfigMap, then the downward API.
    env = {
        **settings_data(objects),
        "POD_NAME": "kserve-inference-controller-5d9c-abcde",
        "POD_NAMESPACE": NS,
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
    }
    settings = load_settings([], env, namespace_file=Path("/nonexistent"))
    assert settings.watch_namespaces == tuple(watch)
    assert settings.polling_interval == 300.0
    assert settings.max_reconcile_rate == 4
    assert settings.leader_election is True
    assert settings.lease_namespace == NS
    assert settings.lease_name == CONTROLLER_SERVICE_ACCOUNT
    assert settings.runner_service_account == RUNNER_SERVICE_ACCOUNT
    assert (settings.metrics_port, settings.health_port) == (8080, 8081)
    assert settings.log_format == "json"


def test_extra_env_cannot_override_what_the_chart_derives_from_values() -> None:
    # WATCH_NAMESPACE in extraEnv would watch namespaces the RBAC does not cover.
    with pytest.raises(HelmError, match=r"extraEnv\.WATCH_NAMESPACE is set by the chart"):
        render({"extraEnv": {"WATCH_NAMESPACE": "team-a"}})


def test_extra_env_reaches_the_settings_configmap() -> None:
    objects = render({"extraEnv": {"QUEUE_QPS": 40}, "settings": {"pollingInterval": "1h30m"}})
    data = settings_data(objects)
    assert data["QUEUE_QPS"] == "40"
    settings = load_settings([], {**data, "POD_NAMESPACE": NS}, namespace_file=Path("/x"))
    assert settings.queue_qps == 40.0
    assert settings.polling_interval == 5400.0


# ----------------------------------------------------------------------------- RBAC


def grants_without_scope(
    grants: dict[tuple[str, str, str], set[str]],
) -> dict[tuple[str, str], set[str]]:
    merged: dict[tuple[str, str], set[str]] = {}
    for (_, group, resource), verbs in grants.items():
        merged.setdefault((group, resource), set()).update(verbs)
    return merged


def test_all_namespaces_mode_uses_one_cluster_role_with_exactly_the_needed_rules() -> None:
    objects = controller_rbac_objects(NS)
    cluster_role = one(objects, "ClusterRole")
    binding = one(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": CONTROLLER_SERVICE_ACCOUNT, "namespace": NS}
    ]
    grants = controller_rules(objects)
    cluster_wide = {(g, r): v for (scope, g, r), v in grants.items() if scope == ""}
    assert cluster_wide == EXPECTED_CONTROLLER_RULES
    namespaced = {(g, r): v for (scope, g, r), v in grants.items() if scope == NS}
    assert namespaced == LEASE_RULES


def test_inference_services_value_turns_the_grant_and_the_reads_off() -> None:
    objects = controller_rbac_objects(NS, values={"inferenceServices": {"enabled": False}})
    grants = controller_rules(objects)
    assert ("", "serving.kserve.io", "inferenceservices") not in grants
    assert ("", "ai.krateo.io", "inferenceruns") in grants  # the rest is still there
    off = render({"inferenceServices": {"enabled": False}}, namespace=NS)
    settings = one(off, "ConfigMap", f"{FULLNAME}-settings")
    assert settings["data"]["INFERENCESERVICES"] == "false"
    default = one(render(namespace=NS), "ConfigMap", f"{FULLNAME}-settings")
    assert default["data"]["INFERENCESERVICES"] == "true"


def test_watch_namespaces_mode_has_no_cluster_wide_access() -> None:
    objects = controller_rbac_objects(NS, ["team-a", "team-b"])
    assert not find(objects, "ClusterRole")
    assert not find(objects, "ClusterRoleBinding")
    grants = controller_rules(objects)
    for namespace in ("team-a", "team-b"):
        rules = {(g, r): v for (scope, g, r), v in grants.items() if scope == namespace}
        assert rules == EXPECTED_CONTROLLER_RULES, namespace
        binding = one(objects, "RoleBinding", CONTROLLER_SERVICE_ACCOUNT, namespace)
        assert binding["subjects"][0] == {
            "kind": "ServiceAccount",
            "name": CONTROLLER_SERVICE_ACCOUNT,
            "namespace": NS,
        }
    # The release namespace holds only the Lease permissions: it is not watched.
    assert {(g, r): v for (s, g, r), v in grants.items() if s == NS} == LEASE_RULES


@pytest.mark.parametrize("watch", [[], ["team-a"]])
def test_the_controller_reads_no_secrets_and_uses_no_wildcards(watch: list[str]) -> None:
    objects = controller_rbac_objects(NS, watch)
    for obj in objects:
        if obj["kind"] not in ("Role", "ClusterRole"):
            continue
        component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
        for rule in obj["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], obj
            if component == "controller":
                assert "secrets" not in rule["resources"], obj


def test_the_lease_can_only_be_read_and_renewed_by_name(default_objects: list[Obj]) -> None:
    role = one(default_objects, "Role", f"{CONTROLLER_SERVICE_ACCOUNT}-leader-election", NS)
    by_rule = {
        (r["resources"][0], tuple(r["verbs"])): r.get("resourceNames") for r in role["rules"]
    }
    assert by_rule == {
        ("leases", ("create",)): None,
        ("leases", ("get", "update")): [CONTROLLER_SERVICE_ACCOUNT],
        ("serviceaccounts", ("get",)): [CONTROLLER_SERVICE_ACCOUNT],
    }


def runner_rules(objects: list[Obj], namespace: str) -> list[Obj]:
    return list(one(objects, "Role", RUNNER_SERVICE_ACCOUNT, namespace)["rules"])


def test_runners_get_secrets_only_by_name_in_each_watched_namespace() -> None:
    objects = controller_rbac_objects(NS, ["team-a", "team-b"])
    for namespace in ("team-a", "team-b"):
        one(objects, "ServiceAccount", RUNNER_SERVICE_ACCOUNT, namespace)
        assert runner_rules(objects, namespace) == [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
        ]
        binding = one(objects, "RoleBinding", RUNNER_SERVICE_ACCOUNT, namespace)
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": RUNNER_SERVICE_ACCOUNT, "namespace": namespace}
        ]
    # Not watched, so no runner there.
    assert not find(objects, "ServiceAccount", RUNNER_SERVICE_ACCOUNT, NS)


def test_runner_secret_access_can_be_narrowed_and_extended() -> None:
    extra = [{"namespace": "krateo-system", "secretNames": ["finops-database-handler-endpoint"]}]
    values = {
        "runner": {
            "namespaces": ["batch-jobs"],
            "secretNames": ["finops-endpoint"],
            "extraSecretAccess": extra,
        }
    }
    objects = controller_rbac_objects(NS, values=values)
    for namespace in (NS, "batch-jobs"):
        assert runner_rules(objects, namespace) == [
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "resourceNames": ["finops-endpoint"],
                "verbs": ["get"],
            }
        ]
    name = f"{RUNNER_SERVICE_ACCOUNT}-{NS}"
    role = one(objects, "Role", name, "krateo-system")
    assert role["rules"][0]["resourceNames"] == ["finops-database-handler-endpoint"]
    assert role["rules"][0]["verbs"] == ["get"]
    binding = one(objects, "RoleBinding", name, "krateo-system")
    assert {(s["name"], s["namespace"]) for s in binding["subjects"]} == {
        (RUNNER_SERVICE_ACCOUNT, NS),
        (RUNNER_SERVICE_ACCOUNT, "batch-jobs"),
    }
    with pytest.raises(HelmError, match="names namespace krateo-system twice"):
        render({"runner": {"extraSecretAccess": extra * 2}})


def test_omit_removes_exactly_one_permission() -> None:
    full = controller_rules(controller_rbac_objects(NS))
    reduced = controller_rules(
        controller_rbac_objects(NS, omit=[("pods/log", "get"), ("jobs", "create")])
    )
    assert ("", "", "pods/log") not in reduced
    assert reduced[("", "batch", "jobs")] == full[("", "batch", "jobs")] - {"create"}
    assert reduced[("", "batch", "cronjobs")] == full[("", "batch", "cronjobs")]
    assert {k: v for k, v in reduced.items() if k[2] not in ("pods/log", "jobs")} == {
        k: v for k, v in full.items() if k[2] not in ("pods/log", "jobs")
    }


# ----------------------------------------------------------------------------- metrics


def test_promql_metric_names_finds_selectors_only() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, name) (rate(workqueue_queue_duration_seconds_bucket"
        '{job=~"$job",name!="x"}[$__rate_interval]))) > on (name) group_left '
        "(sum(leader_election_master_status offset 5m) or vector(0)) and 1e3 < bool up"
    )
    assert promql_metric_names(expr) == {
        "workqueue_queue_duration_seconds_bucket",
        "leader_election_master_status",
        "up",
    }
    assert promql_metric_names('label_values(kserve_inference_runs{namespace="a"}, phase)') == {
        "kserve_inference_runs"
    }


def assert_balanced(expr: str) -> None:
    """A cheap syntax check: brackets pair up (a typo here makes Prometheus reject the rule)."""
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for char in re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr):
        if char in "([{":
            stack.append(char)
        elif char in pairs:
            assert stack, f"unbalanced {char!r} in {expr!r}"
            assert stack.pop() == pairs[char], f"mismatched {char!r} in {expr!r}"
    assert not stack, f"unclosed {stack} in {expr!r}"


def test_bracket_check_catches_typos() -> None:
    assert_balanced('sum(rate(x{a="(("}[5m]))')
    for bad in ("sum(rate(x[5m])", "max(x{a=1)}", "x]"):
        with pytest.raises(AssertionError):
            assert_balanced(bad)


def controller_metric_names() -> set[str]:
    return exported_metric_names(Metrics().registry)


def test_alerts_use_only_metrics_the_controller_exports(monitored_objects: list[Obj]) -> None:
    exprs = rule_expressions(monitored_objects)
    # Failed runs, reconcile errors, no leader, queue backlog (issue 8), at least.
    assert {
        "InferenceRunsFailing",
        "InferenceControllerReconcileErrors",
        "InferenceControllerNoLeader",
        "InferenceControllerQueueBacklog",
    } <= set(exprs)
    exported = controller_metric_names()
    for alert, expr in exprs.items():
        assert_balanced(expr)
        used = promql_metric_names(expr)
        assert used, f"{alert}: no metric found in {expr!r}"
        assert used <= exported, f"{alert} uses {sorted(used - exported)}, not exported"


def test_dashboard_uses_only_metrics_the_controller_exports(monitored_objects: list[Obj]) -> None:
    configmap = one(monitored_objects, "ConfigMap", f"{CONTROLLER_SERVICE_ACCOUNT}-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = configmap["data"].values()
    dashboard: dict[str, Any] = json.loads(text)
    queries = dashboard_queries(dashboard)
    assert len(queries) >= 15
    exported = controller_metric_names()
    used: set[str] = set()
    for query in queries:
        assert_balanced(query)
        names = promql_metric_names(query)
        assert names, f"no metric found in {query!r}"
        assert names <= exported, f"{query!r} uses {sorted(names - exported)}, not exported"
        used |= names
    # Every metric family the controller registers has a panel.
    families = {family.name for family in Metrics().registry.collect()}
    shown = {f for f in families if any(name.startswith(f) for name in used)}
    assert shown == families, sorted(families - shown)


def test_alert_selectors_match_the_scraped_job(monitored_objects: list[Obj]) -> None:
    service = one(monitored_objects, "Service")["metadata"]["name"]
    for alert, expr in rule_expressions(monitored_objects).items():
        for matcher in re.findall(r"\{([^{}]*)\}", expr):
            assert f'job="{service}"' in matcher, alert
            assert f'namespace="{NS}"' in matcher, alert


def test_values_yaml_documents_every_top_level_key_in_the_schema() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    assert set(values) <= set(schema["properties"])
    assert schema["additionalProperties"] is False


def test_metrics_reference_lists_every_metric_and_alert(monitored_objects: list[Obj]) -> None:
    page = (REPO / "docs" / "metrics.md").read_text()
    for family in Metrics().registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"`{name}`" in page, f"docs/metrics.md does not describe {name}"
    for alert in rule_expressions(monitored_objects):
        assert f"`{alert}`" in page, f"docs/metrics.md does not describe alert {alert}"


def github_anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", markdown, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_every_alert_has_a_runbook_url_to_a_section_that_exists(
    monitored_objects: list[Obj],
) -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    prefix = f"{chart['home']}/blob/main/docs/"
    (rule_object,) = find(monitored_objects, "PrometheusRule")
    alerts = [r for g in rule_object["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 7
    for alert in alerts:
        url = alert["annotations"].get("runbook_url", "")
        assert url.startswith(prefix), f"{alert['alert']}: runbook_url {url!r}"
        page, _, anchor = url.removeprefix(prefix).partition("#")
        assert anchor, f"{alert['alert']}: {url} names no section"
        markdown = (REPO / "docs" / page).read_text()
        assert anchor in github_anchors(markdown), (
            f"{alert['alert']}: no section #{anchor} in {page}"
        )
        # The section is this alert's own runbook.
        assert anchor == alert["alert"].lower()


def test_runbook_links_of_earlier_releases_still_land(monitored_objects: list[Obj]) -> None:
    """Rules rendered before the guide's split point at operator-guide.md#<alert>.

    `helm upgrade --reuse-values` keeps that old default of runbookUrl: the
    index keeps an anchor per alert, linking to its runbook.
    """
    (rule_object,) = find(monitored_objects, "PrometheusRule")
    alerts = [r["alert"] for g in rule_object["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    index = (REPO / "docs" / "operator-guide.md").read_text()
    for alert in alerts:
        anchor = alert.lower()
        assert f'<a id="{anchor}"></a>[{alert}](runbooks.md#{anchor})' in index, alert


# ----------------------------------------------------------------------------- sharding

SHARD_LABEL = "ai.krateo.io/controller-shard"


@pytest.fixture(scope="module")
def sharded_objects() -> list[Obj]:
    return render(
        {
            "sharding": {"shards": 3},
            "serviceMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
        },
        namespace=NS,
        api_versions=WITH_PROMETHEUS_OPERATOR,
    )


def shard_env(obj: Obj) -> dict[str, str]:
    spec = obj["spec"]["template"]["spec"] if obj["kind"] == "Deployment" else obj["spec"]
    (main,) = spec["containers"]
    return {e["name"]: e["value"] for e in main.get("env", []) if "value" in e}


def pod_environment(objects: list[Obj], obj: Obj) -> dict[str, str]:
    """What a pod of ``obj`` has in its environment: envFrom the ConfigMap, then its env."""
    return {
        **settings_data(objects),
        **shard_env(obj),
        "POD_NAME": "p",
        "POD_NAMESPACE": NS,
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
    }


def test_one_shard_renders_exactly_as_without_sharding() -> None:
    assert render_text({"sharding": {"shards": 1}}) == render_text()
    objects = render({"serviceMonitor": {"enabled": True}}, api_versions=WITH_PROMETHEUS_OPERATOR)
    text = json.dumps(objects)
    assert SHARD_LABEL not in text
    assert "SHARD_" not in text
    assert [d["metadata"]["name"] for d in find(objects, "Deployment")] == [FULLNAME]


def test_each_shard_is_a_deployment_of_its_own(sharded_objects: list[Obj]) -> None:
    deployments = find(sharded_objects, "Deployment")
    assert [d["metadata"]["name"] for d in deployments] == [
        f"{FULLNAME}-shard-{i}" for i in range(3)
    ]
    selectors = []
    for index, deployment in enumerate(deployments):
        assert deployment["spec"]["replicas"] == 2  # replicaCount, per shard
        assert shard_env(deployment) == {"SHARD_COUNT": "3", "SHARD_INDEX": str(index)}
        selector = deployment["spec"]["selector"]["matchLabels"]
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= pod_labels.items()
        assert selector[SHARD_LABEL] == str(index)
        # The leader and its standby spread over nodes: anti-affinity within the shard.
        term = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ][0]["podAffinityTerm"]
        assert term["labelSelector"]["matchLabels"] == selector
        selectors.append(selector)
    # No Deployment's selector matches another's pods.
    for index, deployment in enumerate(deployments):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert [i for i, s in enumerate(selectors) if s.items() <= labels.items()] == [index]


def test_each_shard_loads_its_own_settings_and_lease(sharded_objects: list[Obj]) -> None:
    leases = []
    for index, deployment in enumerate(find(sharded_objects, "Deployment")):
        env = pod_environment(sharded_objects, deployment)
        settings = load_settings([], env, namespace_file=Path("/nonexistent"))
        assert (settings.shard_index, settings.shard_count) == (index, 3)
        assert settings.leader_election is True
        assert settings.effective_lease_name == f"{FULLNAME}-shard-{index}-of-3"
        leases.append(settings.effective_lease_name)
    # The leader-election Role grants exactly those Leases.
    role = one(sharded_objects, "Role", f"{CONTROLLER_SERVICE_ACCOUNT}-leader-election", NS)
    by_rule = {
        (r["resources"][0], tuple(r["verbs"])): r.get("resourceNames") for r in role["rules"]
    }
    assert by_rule[("leases", ("get", "update"))] == leases
    assert by_rule[("leases", ("create",))] is None


def test_the_selfcheck_runs_once_per_shard_on_its_lease(sharded_objects: list[Obj]) -> None:
    pods = [
        p for p in find(sharded_objects, "Pod") if "helm.sh/hook" in p["metadata"]["annotations"]
    ]
    assert [p["metadata"]["name"] for p in pods] == [
        f"{FULLNAME}-shard-{i}-selfcheck" for i in range(3)
    ]
    for index, pod in enumerate(pods):
        assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "selfcheck"
        env = pod_environment(sharded_objects, pod)
        settings = load_settings([], env, namespace_file=Path("/nonexistent"))
        assert settings.effective_lease_name == f"{FULLNAME}-shard-{index}-of-3"


def test_sharded_pdbs_service_and_monitor_select_the_right_pods(
    sharded_objects: list[Obj],
) -> None:
    deployments = find(sharded_objects, "Deployment")
    pdbs = find(sharded_objects, "PodDisruptionBudget")
    assert [p["metadata"]["name"] for p in pdbs] == [d["metadata"]["name"] for d in deployments]
    for pdb, deployment in zip(pdbs, deployments, strict=True):
        assert (
            pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
        )
        assert pdb["spec"]["maxUnavailable"] == 1
    # One metrics Service over every shard's pods; series say which shard.
    service = one(sharded_objects, "Service")
    for deployment in deployments:
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
    monitor = one(sharded_objects, "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["podTargetLabels"] == [SHARD_LABEL]


def test_sharded_leader_alerts_watch_every_shards_lease(sharded_objects: list[Obj]) -> None:
    (rule_object,) = find(sharded_objects, "PrometheusRule")
    rules = [r for g in rule_object["spec"]["groups"] for r in g["rules"]]
    exported = controller_metric_names()
    for alert in ("InferenceControllerNoLeader", "InferenceControllerSplitBrain"):
        found = [r for r in rules if r.get("alert") == alert]
        assert [r["labels"]["shard"] for r in found] == ["0", "1", "2"]
        for index, rule in enumerate(found):
            assert f'name="{FULLNAME}-shard-{index}-of-3"' in rule["expr"]
            assert_balanced(rule["expr"])
            assert promql_metric_names(rule["expr"]) <= exported


def test_sharded_names_stay_valid_for_long_release_names() -> None:
    release = "a-very-long-release-name-that-goes-on-and-on-x"
    objects = render({"sharding": {"shards": 12}, "watchNamespaces": ["team-a"]}, release=release)
    for obj in objects:
        name = obj["metadata"]["name"]
        assert DNS_SUBDOMAIN.match(name), f"{obj['kind']} {name!r}"
    for deployment in find(objects, "Deployment"):
        assert DNS_LABEL.match(deployment["metadata"]["name"])
        assert len(deployment["metadata"]["name"]) <= 63


@pytest.mark.parametrize("shards", [0, -1, 1.5, "2"])
def test_the_values_schema_wants_a_positive_integer_shard_count(shards: object) -> None:
    with pytest.raises(HelmError, match="shards"):
        render({"sharding": {"shards": shards}})


def test_extra_env_cannot_set_the_shard() -> None:
    for name in ("SHARD_COUNT", "SHARD_INDEX"):
        with pytest.raises(HelmError, match=rf"extraEnv\.{name} is set by the chart"):
            render({"extraEnv": {name: "1"}})


# ------------------------------------------------------------ values judged at install


@pytest.mark.parametrize(
    ("lease", "renew", "retry"),
    [
        ("15s", "10s", "2s"),  # client-go's defaults
        ("10s", "10s", "2s"),  # lease == renew deadline
        ("1m30s", "1m", "500ms"),
        (20, "25s", "2s"),  # seconds as integers, lease shorter
        ("15s", "2400ms", "2s"),  # renew deadline within 1.2 x retry period
        ("15s", "2500ms", "2s"),
        ("1h", "0.5h", "29m"),
    ],
)
def test_lease_timings_are_refused_at_install_exactly_when_the_controller_would_refuse_them(
    lease: str | int, renew: str, retry: str
) -> None:
    values = {
        "leaderElection": {"leaseDuration": lease, "renewDeadline": renew, "retryPeriod": retry}
    }
    refusal = ""
    try:
        objects = render(values, namespace=NS)
    except HelmError as exc:
        refusal = str(exc)
    chart_accepts = not refusal
    if refusal:
        assert "the controller refuses to start otherwise" in refusal
    env = (
        {**settings_data(objects), "POD_NAMESPACE": NS}
        if chart_accepts
        else {
            "LEADER_ELECT": "true",
            "POD_NAMESPACE": NS,
            "LEASE_DURATION": str(lease),
            "RENEW_DEADLINE": renew,
            "RETRY_PERIOD": retry,
        }
    )
    try:
        load_settings([], env, namespace_file=Path("/nonexistent"))
    except SettingsError:
        controller_accepts = False
    else:
        controller_accepts = True
    assert chart_accepts == controller_accepts


@pytest.mark.parametrize(
    "budget",
    [
        {"replicaCount": 1, "podDisruptionBudget": {"minAvailable": 1}},
        {"replicaCount": 2, "podDisruptionBudget": {"minAvailable": 2}},
        {"podDisruptionBudget": {"minAvailable": "100%"}},
        {"podDisruptionBudget": {"maxUnavailable": 0}},
        {"podDisruptionBudget": {"maxUnavailable": "0%"}},
    ],
)
def test_a_disruption_budget_that_would_block_every_drain_is_refused(budget: Obj) -> None:
    with pytest.raises(HelmError, match="every node drain would block"):
        render(budget)


def test_disruption_budgets_that_allow_an_eviction_render() -> None:
    for budget in (
        {"replicaCount": 1},  # maxUnavailable 1 by default
        {"replicaCount": 3, "podDisruptionBudget": {"minAvailable": 2}},
        {"replicaCount": 1, "podDisruptionBudget": {"enabled": False, "maxUnavailable": 0}},
    ):
        render(budget)


def test_resources_must_be_kubernetes_quantities() -> None:
    good = {"requests": {"cpu": "100m", "memory": "1.5Gi"}, "limits": {"nvidia.com/gpu": 1}}
    (deployment,) = find(render({"resources": good}), "Deployment")
    resources = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
    # Merged with the chart's default memory limit.
    assert resources == {
        "requests": good["requests"],
        "limits": {"memory": "512Mi", "nvidia.com/gpu": 1},
    }
    for bad in ({"cpu": "lots"}, {"memory": -1}, {"cpus": 1}, {"memory": "1 Gi"}):
        # helm names the wrong path for a bad key, but always the schema and the culprit.
        (culprit,) = (k if k == "cpus" else v for k, v in bad.items())
        with pytest.raises(HelmError, match="don't meet the specifications") as refused:
            render({"resources": {"requests": bad}})
        assert str(culprit) in str(refused.value)


def test_prometheus_operator_objects_render_only_where_the_api_serves_them() -> None:
    values = {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}
    without = render(values)
    assert not find(without, "ServiceMonitor")
    assert not find(without, "PrometheusRule")
    notes = helm(
        "install",
        "x",
        str(CHART_DIR),
        "--dry-run=client",
        "--set",
        "serviceMonitor.enabled=true",
    ).stdout
    assert "WARNING: serviceMonitor.enabled is true but this cluster does not serve" in notes
    assert "prometheusRule.enabled is true" not in notes
    with_operator = render(values, api_versions=WITH_PROMETHEUS_OPERATOR)
    assert len(find(with_operator, "ServiceMonitor")) == 1
    assert len(find(with_operator, "PrometheusRule")) == 1


def test_user_roles_aggregate_into_the_default_roles() -> None:
    roles = {
        r["metadata"]["name"]: r
        for r in find(render(namespace=NS), "ClusterRole")
        if r["metadata"]["labels"].get("app.kubernetes.io/component") == "user-roles"
    }
    editor, viewer = roles[f"{FULLNAME}-{NS}-editor"], roles[f"{FULLNAME}-{NS}-viewer"]
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k in editor["metadata"]["labels"] if k.startswith(aggregate)} == {
        f"{aggregate}admin",
        f"{aggregate}edit",
    }
    assert {k for k in viewer["metadata"]["labels"] if k.startswith(aggregate)} == {
        f"{aggregate}view"
    }
    # Nobody but the controller writes status; nobody gets a wildcard.
    for role in (editor, viewer):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"]
            if any(r.endswith("/status") for r in rule["resources"]):
                assert set(rule["verbs"]) <= {"get", "list", "watch"}
    assert not [
        r
        for r in find(render({"userRoles": {"aggregate": False}}), "ClusterRole")
        if r["metadata"]["labels"].get("app.kubernetes.io/component") == "user-roles"
    ]


def test_the_network_policy_admits_only_metrics_and_health() -> None:
    assert not find(render(), "NetworkPolicy")
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}]
    objects = render({"networkPolicy": {"enabled": True, "metricsFrom": peers}})
    (policy,) = find(objects, "NetworkPolicy")
    (deployment,) = find(objects, "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["podSelector"]["matchLabels"] == selector
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": 8080}], "from": peers},
        {"ports": [{"protocol": "TCP", "port": 8081}]},
    ]
    (open_policy,) = find(render({"networkPolicy": {"enabled": True}}), "NetworkPolicy")
    assert "from" not in open_policy["spec"]["ingress"][0]


def test_kube_version_is_what_the_chart_needs() -> None:
    # CRD validation rules with the quantity library, reason and fieldPath: 1.29.
    with pytest.raises(HelmError, match="kubeVersion"):
        render_text(extra_args=["--kube-version", "1.28.9"])
    render_text(extra_args=["--kube-version", "1.29.0"])


# ----------------------------------------------------------------------------- values table


def test_the_readme_values_table_is_what_helm_docs_makes_of_values_yaml() -> None:
    made = helm_docs("--dry-run").stdout
    readme = (CHART_DIR / "README.md").read_text()
    assert made == readme, "the chart README is stale: run `make chart-docs`"
    # Every value has a row, and every row a description (a `# --` comment).
    rows = [line for line in readme.splitlines() if re.match(r"^\| [a-zA-Z]", line)]
    keys = {row.split("|")[1].strip() for row in rows}
    assert {"serviceMonitor.relabelings", "prometheusRule.runbookUrl", "replicaCount"} <= keys
    undescribed = [row.split("|")[1].strip() for row in rows if not row.split("|")[4].strip()]
    assert not undescribed, f"values without a `# --` comment: {undescribed}"
    assert len(rows) > 50


# ----------------------------------------------------------------------------- NOTES

# A path of the repository, written as one (not inside a link).
REPOSITORY_PATH = re.compile(r"(?<![\w/.-])(?:docs|examples|crds|deploy|hack|controller|runner)/")


def notes(*sets: str) -> str:
    """What `helm install` prints after NOTES: with these --set values."""
    args = [f"--set={value}" for value in sets]
    out = helm("install", RELEASE, str(CHART_DIR), "-n", NS, "--dry-run=client", *args).stdout
    return out.partition("NOTES:")[2]


@pytest.mark.parametrize(
    "sets",
    [
        (),
        ("crds.install=false",),
        ("watchNamespaces={a,b}", "sharding.shards=2"),
        ("serviceMonitor.enabled=true", "prometheusRule.enabled=true"),
    ],
)
def test_notes_link_to_the_docs_and_never_name_a_repository_path(sets: tuple[str, ...]) -> None:
    text = notes(*sets)
    assert "kubectl get infrun" in text, text
    assert not REPOSITORY_PATH.findall(text), text
    home = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["home"]
    links = re.findall(r"https?://[^\s)]+", text)
    assert links, text
    assert all(link.startswith(home) for link in links), links
    # Each link reaches a file of this repository, and a section that exists.
    for link in links:
        path, _, anchor = re.sub(r"^/(blob|tree)/main/", "", link.removeprefix(home)).partition("#")
        assert (REPO / path).exists(), link
        if anchor:
            assert anchor in github_anchors((REPO / path).read_text()), link


def shell_commands(markdown: str) -> list[str]:
    """Each command of the markdown's ```sh blocks (continuation lines joined) and inline code."""
    commands = []
    for block in re.findall(r"```(?:sh|bash|console)\n(.*?)```", markdown, re.DOTALL):
        commands += block.replace("\\\n", " ").splitlines()
    commands += re.findall(r"`([^`\n]+)`", markdown)
    return commands


def test_every_helm_template_recipe_leaves_the_test_hook_out() -> None:
    """Applied, the `helm test` pod would run once and stay: recipes pass --skip-tests."""
    recipes = []
    for page in (REPO / "README.md", REPO / "docs" / "install.md", CHART_DIR / "README.md"):
        for command in shell_commands(page.read_text()):
            if "helm template" in command and re.search(r"\|\s*kubectl (apply|delete)", command):
                recipes.append(command)
                assert "--skip-tests" in command, f"{page.name}: {command}"
    assert len(recipes) >= 3, recipes
