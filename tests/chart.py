"""The Helm chart as tests see it: :mod:`hack.chart` (rendering, the chart's
RBAC, ServiceAccount kubeconfigs) plus the metric-name checks of the chart's
alerts and dashboard.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from hack.chart import (
    CHART_DIR,
    CONTROLLER_SERVICE_ACCOUNT,
    FULLNAME,
    HELM_BUILD_SCRIPT,
    RBAC_KINDS,
    RELEASE,
    REPO,
    RUNNER_SERVICE_ACCOUNT,
    WITH_PROMETHEUS_OPERATOR,
    HelmError,
    Obj,
    apply,
    controller_rbac_objects,
    controller_rules,
    delete_cluster_scoped,
    find,
    helm,
    helm_binary,
    helm_docs,
    one,
    parse,
    render,
    render_text,
    service_account_kubeconfig,
    service_account_user,
    to_yaml,
)

__all__ = [
    "CHART_DIR",
    "CONTROLLER_SERVICE_ACCOUNT",
    "FULLNAME",
    "HELM_BUILD_SCRIPT",
    "RBAC_KINDS",
    "RELEASE",
    "REPO",
    "RUNNER_SERVICE_ACCOUNT",
    "WITH_PROMETHEUS_OPERATOR",
    "HelmError",
    "Obj",
    "apply",
    "controller_rbac_objects",
    "controller_rules",
    "delete_cluster_scoped",
    "find",
    "helm",
    "helm_binary",
    "helm_docs",
    "one",
    "parse",
    "render",
    "render_text",
    "service_account_kubeconfig",
    "service_account_user",
    "to_yaml",
]


# ----------------------------------------------------------------------------- metrics

# Words of PromQL that look like metric names but are not.
_PROMQL_WORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"bool", "offset", "atan2", "inf", "nan", "start", "end"}
)
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![A-Za-z0-9_.:$])[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<selector>.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$")

# Suffixes of the samples that prometheus_client exposes per metric type.
_SAMPLE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "unknown": ("",),
}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (a small lexer, not a full PromQL parser).

    Strings, label matchers (``{...}``), ranges (``[5m]``) and grouping label
    lists (``by (le)``) are dropped first; what is left that is neither a
    function call (followed by ``(``) nor a PromQL keyword is a metric name.
    A Grafana ``label_values(<selector>, <label>)`` query counts its selector.
    """
    match = _LABEL_VALUES.match(expr)
    if match:
        expr = match.group("selector")
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"'(?:[^'\\]|\\.)*'", "''", text)
    previous = None
    while previous != text:  # innermost first, so nested brackets go too
        previous = text
        text = re.sub(r"\{[^{}]*\}", " ", text)
        text = re.sub(r"\[[^\[\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for found in _IDENT.finditer(text):
        name = found.group(0)
        if text[found.end() :].lstrip().startswith("(") or name.lower() in _PROMQL_WORDS:
            continue
        names.add(name)
    return names


def exported_metric_names(registry: Any) -> set[str]:
    """Every sample name a prometheus_client registry can expose (``_total``, ``_bucket``, …).

    Works before any sample exists: the names come from the metric families'
    names and types, not from their current samples.
    """
    return _sample_names(registry.collect())


def scraped_metric_names(text: str) -> set[str]:
    """Every sample name a ``/metrics`` page (Prometheus text format) declares or holds."""
    families = list(text_string_to_metric_families(text))
    names = _sample_names(families)
    names.update(sample.name for family in families for sample in family.samples)
    return names


def _sample_names(families: Iterable[Any]) -> set[str]:
    names: set[str] = set()
    for family in families:
        for suffix in _SAMPLE_SUFFIXES[family.type]:
            names.add(family.name + suffix)
    return names


def chart_metric_names(objects: Iterable[Obj]) -> dict[str, set[str]]:
    """Where each metric-using expression of the rendered chart is -> the metrics it uses.

    Covers the PrometheusRule's alerts and the Grafana dashboard's queries.
    """
    objects = list(objects)
    used = {
        f"alert {alert}": promql_metric_names(expr)
        for alert, expr in rule_expressions(objects).items()
    }
    for configmap in find(objects, "ConfigMap"):
        for key, text in (configmap.get("data") or {}).items():
            if key.endswith(".json"):
                for query in dashboard_queries(json.loads(text)):
                    used[f"dashboard query {query}"] = promql_metric_names(query)
    return used


def dashboard_queries(dashboard: Mapping[str, Any]) -> list[str]:
    """Every PromQL query of a Grafana dashboard: panel targets and template variables."""
    queries: list[str] = []

    def panels(items: Iterable[Mapping[str, Any]]) -> Iterable[Mapping[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels") or [])

    for panel in panels(dashboard.get("panels") or []):
        queries += [t["expr"] for t in panel.get("targets") or [] if t.get("expr")]
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        query = variable.get("query")
        if variable.get("type") == "query":
            queries.append(query["query"] if isinstance(query, Mapping) else str(query))
    return queries


def rule_expressions(objects: Iterable[Obj]) -> dict[str, str]:
    """alert (or record) name -> expression, over every PrometheusRule in ``objects``."""
    exprs: dict[str, str] = {}
    for rule_object in find(objects, "PrometheusRule"):
        for group in rule_object["spec"]["groups"]:
            for rule in group["rules"]:
                exprs[rule.get("alert") or rule["record"]] = str(rule["expr"])
    return exprs
