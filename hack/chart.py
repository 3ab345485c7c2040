"""The Helm chart rendered by the real ``helm`` binary, for tests, benchmarks and the demo.

- :func:`generate_crds` copies the repository's ``crds/`` into the chart
  (``files/crds/``, not kept in git): ``make chart`` runs it, and so does
  :func:`helm` before its first command, so no chart a test renders, installs
  or packages can hold other CRDs than ``crds/``.
- :func:`helm_binary` builds (once, cached outside the repository) or finds the
  pinned ``helm`` (``hack/helm/build.sh``).
- :func:`render` runs ``helm template`` with the given values and returns the
  parsed objects; :func:`render_text` returns the manifest text for
  ``kubectl apply``.
- :func:`controller_rbac_objects` returns exactly the chart's ServiceAccounts,
  (Cluster)Roles and (Cluster)RoleBindings for the controller and the runner,
  so integration tests run the controller under the chart's RBAC: apply them
  with :func:`apply`, then :func:`service_account_kubeconfig` writes a
  kubeconfig holding a TokenRequest token of the chart's controller
  ServiceAccount.

Release names: cluster-scoped objects are named ``<fullname>-<release
namespace>``, so tests in different namespaces can all use
:data:`RELEASE` without clashing.

Running the controller under the chart's RBAC::

    objects = controller_rbac_objects(namespace, [namespace])  # [] = all namespaces
    apply(cluster, objects)
    kubeconfig = service_account_kubeconfig(cluster, namespace, path=tmp_path / "kc")
    # start the controller with KUBECONFIG=kubeconfig, WATCH_NAMESPACE=namespace,
    # POD_NAMESPACE=namespace (the Lease lives there), LEASE_NAME=FULLNAME, ...
    delete_cluster_scoped(cluster, objects)  # ClusterRole(Binding), if any
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from hack.cluster import ApiError
from hack.commands import run_tool

if TYPE_CHECKING:
    from hack.cluster import LocalCluster

Obj = dict[str, Any]

REPO = Path(__file__).resolve().parents[1]
CHART_DIR = REPO / "deploy" / "kserve-inference-controller"
CRDS_DIR = REPO / "crds"
# Generated from CRDS_DIR (generate_crds, `make chart`); ignored by git.
CHART_CRDS_DIR = CHART_DIR / "files" / "crds"
HELM_BUILD_SCRIPT = REPO / "hack" / "helm" / "build.sh"
HELM_DOCS_BUILD_SCRIPT = REPO / "hack" / "helm-docs" / "build.sh"

RELEASE = "kserve-inference-controller"
# With RELEASE as the release name, the chart's object prefix is the release name.
FULLNAME = RELEASE
CONTROLLER_SERVICE_ACCOUNT = FULLNAME
RUNNER_SERVICE_ACCOUNT = f"{FULLNAME}-runner"

RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
# The admission policy that narrows the controller's RBAC to its own objects.
ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
CLUSTER_SCOPED_KINDS = ("ClusterRole", "ClusterRoleBinding", *ADMISSION_KINDS)
# What the local control plane (Kubernetes 1.36) serves that `helm template`
# cannot know offline (helm install asks the cluster): the chart's
# .Capabilities checks then render as they do when installed on it.
CLUSTER_API_VERSIONS = ("admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",)
# A cluster with the Prometheus Operator's CRDs (the chart renders its
# ServiceMonitor and PrometheusRule only where the API serves them).
WITH_PROMETHEUS_OPERATOR = (
    *CLUSTER_API_VERSIONS,
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
)


class HelmError(RuntimeError):
    """helm exited non-zero; the message holds its command line and output."""


def generate_crds(source: Path = CRDS_DIR, target: Path = CHART_CRDS_DIR) -> list[Path]:
    """Make ``target`` hold exactly the CRDs of ``source`` (``*.yaml``), byte for byte.

    Helm reads only files inside the chart, so the chart carries a copy of
    ``crds/``; this makes it, rather than a hand-kept copy that can drift.
    A file whose bytes are already right is left alone, and a new one is
    written under a temporary name and renamed into place, so that processes
    generating at once (test workers) never show helm a half-written CRD.
    CRDs of ``target`` that ``source`` no longer has are removed. Returns the
    files written.
    """
    crds = sorted(source.glob("*.yaml"))
    if not crds:
        raise FileNotFoundError(f"no CRDs (*.yaml) in {source}")
    target.mkdir(parents=True, exist_ok=True)
    wanted = {crd.name for crd in crds}
    for stale in target.glob("*.yaml"):
        if stale.name not in wanted:
            stale.unlink(missing_ok=True)
    written = []
    for crd in crds:
        data, copy_path = crd.read_bytes(), target / crd.name
        if copy_path.exists() and copy_path.read_bytes() == data:
            continue
        temporary = target / f".{crd.name}.{os.getpid()}.tmp"
        temporary.write_bytes(data)
        os.replace(temporary, copy_path)
        written.append(copy_path)
    return written


@functools.cache
def _chart_generated() -> None:
    generate_crds()


@functools.cache
def helm_binary() -> Path:
    """The pinned helm, built on first use (minutes) and cached (``HELM_BINARY`` overrides)."""
    done = subprocess.run(
        ["bash", str(HELM_BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=True
    )
    path = Path(done.stdout.strip().splitlines()[-1])
    if not os.access(path, os.X_OK):
        raise HelmError(f"{HELM_BUILD_SCRIPT} printed {path}, which is not an executable")
    return path


def helm_docs(*args: str) -> subprocess.CompletedProcess[str]:
    """The pinned helm-docs (built on first use, about a minute, and cached; ``HELM_DOCS``
    overrides) on the chart: the README from README.md.gotmpl and values.yaml."""
    done = subprocess.run(
        ["bash", str(HELM_DOCS_BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=True
    )
    binary = done.stdout.strip().splitlines()[-1]
    return subprocess.run(
        [binary, "--chart-search-root", str(CHART_DIR), "--log-level", "warning", *args],
        capture_output=True,
        text=True,
        check=True,
    )


def helm(
    *args: str,
    check: bool = True,
    kubeconfig: Path | None = None,
    timeout: float = 300.0,
) -> subprocess.CompletedProcess[str]:
    """Run helm with a private cache/config/data home, so nothing leaks into ~/.config.

    The chart's generated files are made first (once per process).
    """
    _chart_generated()
    home = Path(tempfile.gettempdir()) / "ksc-helm-home"
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return run_tool(
        [str(helm_binary()), *args],
        shown=f"helm {' '.join(args)}",
        check=check,
        env=env,
        timeout=timeout,
        error=HelmError,
    )


def _values_file(values: Mapping[str, Any], directory: Path) -> Path:
    path = directory / "values.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    return path


def render_text(
    values: Mapping[str, Any] | None = None,
    *,
    namespace: str = "kserve-controller-system",
    release: str = RELEASE,
    extra_args: Sequence[str] = (),
    api_versions: Sequence[str] = CLUSTER_API_VERSIONS,
) -> str:
    """``helm template`` output (multi-document YAML) for these values."""
    with tempfile.TemporaryDirectory(prefix="ksc-chart-") as tmp:
        args = ["template", release, str(CHART_DIR), "--namespace", namespace]
        for version in api_versions:
            args += ["--api-versions", version]
        if values:
            args += ["--values", str(_values_file(values, Path(tmp)))]
        return helm(*args, *extra_args).stdout


def parse(manifest: str) -> list[Obj]:
    """The objects of a multi-document manifest (empty documents dropped)."""
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def render(
    values: Mapping[str, Any] | None = None,
    *,
    namespace: str = "kserve-controller-system",
    release: str = RELEASE,
    api_versions: Sequence[str] = CLUSTER_API_VERSIONS,
) -> list[Obj]:
    """The chart's objects for these values, parsed."""
    return parse(
        render_text(
            values,
            namespace=namespace,
            release=release,
            api_versions=api_versions,
        )
    )


def find(
    objects: Iterable[Obj], kind: str, name: str | None = None, namespace: str | None = None
) -> list[Obj]:
    """The objects of ``kind`` (and ``name``/``namespace`` when given)."""
    return [
        obj
        for obj in objects
        if obj["kind"] == kind
        and (name is None or obj["metadata"]["name"] == name)
        and (namespace is None or obj["metadata"].get("namespace") == namespace)
    ]


def one(
    objects: Iterable[Obj], kind: str, name: str | None = None, namespace: str | None = None
) -> Obj:
    """The single object of ``kind`` (and name/namespace); fails if there are 0 or 2+."""
    found = find(objects, kind, name, namespace)
    if len(found) != 1:
        where = f"{kind} {name or '*'} in {namespace or '*'}"
        raise AssertionError(f"expected exactly one {where}, found {len(found)}")
    return found[0]


def controller_rbac_objects(
    namespace: str,
    watch_namespaces: Sequence[str] = (),
    *,
    release: str = RELEASE,
    values: Mapping[str, Any] | None = None,
    omit: Iterable[tuple[str, str]] = (),
) -> list[Obj]:
    """The chart's RBAC for a release in ``namespace`` watching ``watch_namespaces``.

    Returns the controller's ServiceAccount, its (Cluster)Role(s) and
    (Cluster)RoleBinding(s), the leader-election Role and RoleBinding, the
    runner ServiceAccount, Role and RoleBinding in every runner namespace, and
    the ValidatingAdmissionPolicy (and binding) that narrows the controller's
    writes to its own objects, exactly as ``helm template`` renders them
    (empty ``watch_namespaces``: all namespaces, i.e. a ClusterRole).

    ``omit`` removes (resource, verb) pairs such as ``("pods/log", "get")``
    from the controller's rules, for tests that show what a missing permission
    looks like.
    """
    merged: dict[str, Any] = {**(values or {}), "watchNamespaces": list(watch_namespaces)}
    rendered = render(merged, namespace=namespace, release=release)
    objects = [
        obj
        for obj in rendered
        if obj["kind"] in (*RBAC_KINDS, *ADMISSION_KINDS)
        # The roles for people (aggregated into edit/view) are not the controller's.
        and (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/component") != "user-roles"
    ]
    removals = list(omit)
    if removals:
        objects = [_without(obj, removals) if _is_controller_role(obj) else obj for obj in objects]
    return objects


def _is_controller_role(obj: Obj) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return (
        obj["kind"] in ("Role", "ClusterRole")
        and labels.get("app.kubernetes.io/component") == "controller"
    )


def _without(role: Obj, removals: Sequence[tuple[str, str]]) -> Obj:
    """``role`` with each (resource, verb) pair taken out of its rules."""
    role = copy.deepcopy(role)
    rules: list[Obj] = []
    for rule in role.get("rules") or []:
        # A rule granting several resources is split so that only the named
        # resource loses the verb.
        for resource in rule.get("resources", []):
            verbs = [v for v in rule["verbs"] if (resource, v) not in removals]
            if verbs:
                rules.append({**rule, "resources": [resource], "verbs": verbs})
    role["rules"] = rules
    return role


def controller_rules(objects: Iterable[Obj]) -> dict[tuple[str, str, str], set[str]]:
    """(namespace or "", apiGroup, resource) -> verbs granted by the controller's roles."""
    grants: dict[tuple[str, str, str], set[str]] = {}
    for obj in objects:
        if not _is_controller_role(obj):
            continue
        scope = obj["metadata"].get("namespace", "") if obj["kind"] == "Role" else ""
        for rule in obj.get("rules") or []:
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    grants.setdefault((scope, group, resource), set()).update(rule["verbs"])
    return grants


def to_yaml(objects: Iterable[Obj]) -> str:
    return yaml.safe_dump_all(list(objects), sort_keys=False)


def apply(cluster: LocalCluster, objects: Iterable[Obj]) -> None:
    """Create or update ``objects`` for real: server-side apply as the admin, in order.

    What ``kubectl apply --server-side --force-conflicts`` sends, one request
    per object, without a kubectl process each time.
    """
    for obj in objects:
        meta = obj["metadata"]
        path = cluster.resource_path(
            obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace")
        )
        cluster.request(
            "PATCH",
            f"{path}?fieldManager=ksc-tests&force=true",
            obj,
            content_type="application/apply-patch+yaml",
        )


def delete_cluster_scoped(cluster: LocalCluster, objects: Iterable[Obj]) -> None:
    """Delete the cluster-scoped objects among ``objects`` (namespaces take the rest).

    CRDs are left alone: other tests share them. One already gone is fine.
    """
    for obj in objects:
        if obj["kind"] in CLUSTER_SCOPED_KINDS:
            path = cluster.resource_path(
                obj["apiVersion"], obj["kind"], obj["metadata"]["name"], None
            )
            try:
                cluster.request("DELETE", path)
            except ApiError as exc:
                if exc.code != 404:
                    raise


def service_account_user(namespace: str, name: str) -> str:
    """The username the API server (authorizer, audit log) gives ServiceAccount namespace/name."""
    return f"system:serviceaccount:{namespace}:{name}"


def service_account_kubeconfig(
    cluster: LocalCluster,
    namespace: str,
    name: str = CONTROLLER_SERVICE_ACCOUNT,
    *,
    path: Path,
    expiration: timedelta = timedelta(hours=2),
) -> Path:
    """Write a kubeconfig at ``path`` acting as ServiceAccount ``namespace/name``.

    The token comes from the TokenRequest API (``kubectl create token``), as a
    pod's projected token would.
    """
    token = service_account_token(cluster, namespace, name, expiration=expiration)
    user = service_account_user(namespace, name)
    return cluster.write_token_kubeconfig(path, user, token, context="sa", namespace=namespace)


def service_account_token(
    cluster: LocalCluster,
    namespace: str,
    name: str,
    *,
    expiration: timedelta = timedelta(hours=2),
) -> str:
    """A TokenRequest token of ServiceAccount ``namespace/name`` (``kubectl create token``)."""
    answer = cluster.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": int(expiration.total_seconds())},
        },
    )
    token: str = answer["status"]["token"]
    return token


def service_account_mount(
    cluster: LocalCluster,
    namespace: str,
    name: str = CONTROLLER_SERVICE_ACCOUNT,
    *,
    directory: Path,
    expiration: timedelta = timedelta(hours=2),
) -> Path:
    """Write what the kubelet mounts for ServiceAccount ``namespace/name`` into ``directory``.

    ``token`` and ``ca.crt``, as in ``/var/run/secrets/kubernetes.io/serviceaccount``:
    a process given them there (and ``KUBERNETES_SERVICE_HOST``/``_PORT``)
    connects as a pod of that ServiceAccount does.
    """
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(
        service_account_token(cluster, namespace, name, expiration=expiration)
    )
    (directory / "ca.crt").write_bytes(cluster.ca_path.read_bytes())
    return directory


def package(destination: Path) -> Path:
    """``helm package`` of the chart, its CRDs generated first, into ``destination``."""
    generate_crds()
    destination.mkdir(parents=True, exist_ok=True)
    done = helm("package", str(CHART_DIR), "--destination", str(destination))
    # "Successfully packaged chart and saved it to: <path>"
    return Path(done.stdout.strip().rsplit(": ", 1)[-1])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m hack.chart", description="Make the Helm chart's generated files."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("crds", help=f"copy {CRDS_DIR.name}/ into the chart's files/crds/")
    packaging = commands.add_parser("package", help="the CRDs, then helm package")
    packaging.add_argument("--destination", type=Path, default=REPO / "dist")
    args = parser.parse_args(argv)
    if args.command == "crds":
        for path in generate_crds():
            print(f"wrote {path.relative_to(REPO)}")
    else:
        print(package(args.destination))


if __name__ == "__main__":
    main()
