"""``python -m controller check``: is this installation able to work? One line per check.

Run with the controller's own identity and settings (the chart's ``helm test``
hook does exactly that: the controller's image, ServiceAccount and settings
ConfigMap), it checks, in order:

1. **API server**: reachable, and these credentials are accepted (a
   ``SelfSubjectReview`` says who the API server thinks we are).
2. **CRDs and RBAC**: ``ai.krateo.io/v1`` serves ``inferenceconfigs`` and
   ``inferenceruns``, and both can be listed (``limit=1``) in every watched
   namespace, or cluster-wide when watching all namespaces, which is what the
   controller's informers do first.
3. **Leader**: with leader election on, the Lease exists, has a holder, and
   was renewed within its ``leaseDurationSeconds``; a deployment whose leader
   crashed, or with no replica running, fails here. With election off this is
   skipped, not failed. Sharded (``SHARD_COUNT`` > 1), it is the Lease of shard
   ``SHARD_INDEX``, ``<LEASE_NAME>-shard-<index>-of-<count>``; the chart runs
   one check per shard.

Each check prints ``ok: ...``, ``FAIL: ...`` (what is wrong and what to do)
or ``skip: ...``; the exit code is 0 when nothing failed, else 1. When the
API server cannot be reached, the later checks are skipped rather than failed
with the same cause.

The verdicts are pure functions of what was read (:func:`lease_result`,
:func:`api_failure`, :func:`list_failure`, ...), tested without a cluster;
:func:`run_checks` does the I/O with the controller's :class:`KubeClient`.
Lease freshness compares ``renewTime`` with this machine's clock, so a clock
that is off by more than a lease duration shows as a stale (or future) Lease;
the failure says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from controller.api import GROUP, VERSION
from kubeclient.errors import ApiError, NotFound, TransportError
from kubeclient.objects import parse_time
from kubeclient.resources import CONFIGS, LEASES, RUNS, Resource

if TYPE_CHECKING:
    from controller.settings import Settings
    from kubeclient.client import KubeClient

Status = Literal["ok", "FAIL", "skip"]

CHECKED_RESOURCES = (CONFIGS, RUNS)
SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
INSTALL_CRDS = (
    "install them: helm upgrade with crds.install=true (the release owning them), or "
    "kubectl apply --server-side -f crds/"
)
# Requests of the check give up sooner than the controller's (30 s): a helm
# test should fail in seconds, with the reason.
REQUEST_TIMEOUT = 10.0


@dataclass(frozen=True)
class Result:
    """One check's verdict: ``status`` and a sentence saying what was found (and what to do)."""

    status: Status
    message: str

    @property
    def line(self) -> str:
        return f"{self.status}: {self.message}"

    @property
    def failed(self) -> bool:
        return self.status == "FAIL"


def ok(message: str) -> Result:
    return Result("ok", message)


def fail(message: str) -> Result:
    return Result("FAIL", message)


def skip(message: str) -> Result:
    return Result("skip", message)


def exit_code(results: Iterable[Result]) -> int:
    """0 when no check failed, else 1."""
    return 1 if any(result.failed for result in results) else 0


def one_line(text: str) -> str:
    """``text`` with its line breaks folded, so each check stays one line."""
    return "; ".join(part.strip() for part in text.splitlines() if part.strip())


def _reason(exc: ApiError) -> str:
    """``403 Forbidden: <the API's message>``, or the transport error."""
    code = " ".join(str(part) for part in (exc.status or "", exc.reason) if part)
    return one_line(": ".join(part for part in (code, exc.message) if part)) or str(exc)


def _where(namespace: str | None) -> str:
    return f"namespace {namespace}" if namespace else "all namespaces"


# ------------------------------------------------------------------ pure verdicts: API


def api_ok(host: str, version: Mapping[str, Any], review: Mapping[str, Any] | None) -> Result:
    """The API check passed; ``review`` is the SelfSubjectReview (None: not served)."""
    git_version = str(version.get("gitVersion") or "unknown version")
    if review is None:
        return ok(
            f"API server {host} ({git_version}) answers; identity not checked "
            "(SelfSubjectReview is served from Kubernetes 1.28)"
        )
    return ok(f"API server {host} ({git_version}) answers and authenticates {username(review)}")


def username(review: Mapping[str, Any]) -> str:
    """The user a SelfSubjectReview reports (``system:serviceaccount:<ns>:<name>`` in a pod)."""
    user = ((review.get("status") or {}).get("userInfo") or {}).get("username")
    return str(user) if user else "an unnamed user"


def api_failure(host: str, exc: ApiError) -> Result:
    """Why the API server cannot be used, and what to look at."""
    if isinstance(exc, TransportError) or exc.status == 0:
        return fail(
            f"cannot reach the API server {host} ({_reason(exc)}); check that this pod "
            "(with hostNetwork, its node) can reach it: KUBERNETES_SERVICE_HOST/PORT "
            "in a pod, the kubeconfig's server otherwise, and no NetworkPolicy or "
            "firewall in between"
        )
    if exc.status == 401:
        return fail(
            f"the API server {host} refuses these credentials ({_reason(exc)}); in a pod "
            "check the ServiceAccount token mount (automountServiceAccountToken), "
            "otherwise the kubeconfig's user"
        )
    if exc.status == 403:
        return fail(
            f"the API server {host} answers but forbids a SelfSubjectReview ({_reason(exc)}): "
            "the request was probably made without credentials (system:anonymous); in a pod "
            "check the ServiceAccount token mount, otherwise the kubeconfig's user"
        )
    return fail(f"the API server {host} answered with an error ({_reason(exc)}); see its logs")


# ---------------------------------------------------------- pure verdicts: CRDs and RBAC


def group_missing(exc: ApiError) -> Result:
    """Discovery of ``ai.krateo.io/v1`` failed."""
    if exc.is_not_found:
        return fail(
            f"API group {GROUP}/{VERSION} is not served: the InferenceConfig and "
            f"InferenceRun CRDs are not installed (or serve no {VERSION}); {INSTALL_CRDS}"
        )
    return fail(f"cannot discover API group {GROUP}/{VERSION} ({_reason(exc)})")


def resource_missing(resource: Resource) -> Result:
    return fail(
        f"{resource}/{resource.version} is not served although its API group is: "
        f"the {resource.kind} CRD is missing; {INSTALL_CRDS}"
    )


def listed_ok(resource: Resource, namespaces: Sequence[str]) -> Result:
    where = f"namespace(s) {', '.join(namespaces)}" if namespaces else "all namespaces"
    return ok(f"{resource}/{resource.version} is served and can be listed in {where}")


def list_failure(
    resource: Resource, namespace: str | None, exc: ApiError, who: str | None
) -> Result:
    """Listing ``resource`` in ``namespace`` (None: all namespaces) failed."""
    identity = who or "this identity"
    where = _where(namespace)
    if exc.is_forbidden:
        grant = (
            "the chart's ClusterRole and ClusterRoleBinding (watchNamespaces empty)"
            if namespace is None
            else f"a Role and RoleBinding in {namespace} (the chart makes them for each "
            "of watchNamespaces)"
        )
        return fail(
            f"{identity} may not list {resource} in {where} ({_reason(exc)}): the controller "
            f"needs list and watch there; grant them with {grant}, or make WATCH_NAMESPACE "
            "name only namespaces it may watch"
        )
    if exc.is_not_found:
        return fail(f"{resource}/{resource.version} is not served in {where}; {INSTALL_CRDS}")
    return fail(f"listing {resource} in {where} failed ({_reason(exc)})")


# ------------------------------------------------------------------ pure verdicts: Lease


def lease_result(
    lease: Mapping[str, Any] | None,
    *,
    namespace: str,
    name: str,
    now: datetime,
    default_duration: float,
) -> Result:
    """Whether a leader holds the Lease (None: it does not exist), as of ``now``.

    The Lease is fresh when it has a holder and its ``renewTime`` is no further
    than ``leaseDurationSeconds`` (else ``default_duration``) from ``now``, in
    either direction.
    """
    lease_id = f"Lease {namespace}/{name}"
    pods = (
        "check that the controller's pods are running and read their logs "
        f"(kubectl -n {namespace} get pods -l app.kubernetes.io/component=controller)"
    )
    if lease is None:
        return fail(
            f"{lease_id} does not exist: no replica has ever become leader; {pods}, and "
            "that LEASE_NAME and the Lease namespace are the ones the controller uses"
        )
    spec = lease.get("spec") or {}
    holder = str(spec.get("holderIdentity") or "")
    duration = float(spec.get("leaseDurationSeconds") or default_duration)
    if not holder:
        return fail(
            f"{lease_id} has no holder: the last leader released it and no replica took "
            f"over (a Deployment scaled to 0, or replicas that cannot start); {pods}"
        )
    renew_text = spec.get("renewTime") or spec.get("acquireTime")
    if not renew_text:
        return fail(f"{lease_id} is held by {holder} but was never renewed (no renewTime); {pods}")
    try:
        renewed = parse_time(str(renew_text))
    except ValueError:
        renewed = None
    if renewed is None:
        return fail(f"{lease_id} has an unreadable renewTime {renew_text!r}; {pods}")
    age = (now - renewed).total_seconds()
    if age > duration:
        return fail(
            f"{lease_id} is held by {holder} but was last renewed {age:.0f}s ago, longer "
            f"than its {duration:g}s duration: the leader has stopped renewing (crashed, "
            "or cut off from the API server) and no standby has taken over; "
            f"{pods} (or, if they are fine, whether this node's clock is behind)"
        )
    if age < -duration:
        return fail(
            f"{lease_id} is held by {holder} with a renewTime {-age:.0f}s in the future: "
            "the clocks of the leader's node and of this one disagree; fix their time "
            "synchronisation (leader election itself does not depend on it)"
        )
    return ok(
        f"{lease_id} is held by {holder}, renewed {max(age, 0.0):.1f}s ago "
        f"(within its {duration:g}s)"
    )


def lease_failure(namespace: str, name: str, exc: ApiError, who: str | None) -> Result:
    """Reading the Lease failed (other than NotFound)."""
    if exc.is_forbidden:
        return fail(
            f"{who or 'this identity'} may not get Lease {namespace}/{name} ({_reason(exc)}): "
            "the leader-election Role grants get on the chart's Lease name only; check "
            "LEASE_NAME and the Lease namespace (POD_NAMESPACE or LEASE_NAMESPACE) "
            "against leaderElection.leaseName and the release namespace"
        )
    return fail(f"reading Lease {namespace}/{name} failed ({_reason(exc)})")


def election_off() -> Result:
    return skip("leader election is off (LEADER_ELECT=false): there is no Lease to check")


# -------------------------------------------------------------------------------- I/O


async def check_api(client: KubeClient) -> tuple[Result, str | None]:
    """The API check, and the authenticated user's name when known."""
    try:
        version = await client.request("get", "GET", "/version")
    except ApiError as exc:
        return api_failure(client.host, exc), None
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    try:
        review = await client.request("create", "POST", SELF_SUBJECT_REVIEWS, body=body)
    except NotFound:
        return api_ok(client.host, version, None), None
    except ApiError as exc:
        return api_failure(client.host, exc), None
    return api_ok(client.host, version, review), username(review)


async def check_crds(
    client: KubeClient, namespaces: Sequence[str], who: str | None
) -> list[Result]:
    """One line per resource when it lists everywhere, else one per failing namespace."""
    try:
        discovery = await client.request("get", "GET", f"/apis/{GROUP}/{VERSION}")
    except ApiError as exc:
        return [group_missing(exc)]
    served = {str(entry.get("name")) for entry in discovery.get("resources") or []}
    results: list[Result] = []
    scopes: Sequence[str | None] = list(namespaces) or [None]
    for resource in CHECKED_RESOURCES:
        if resource.plural not in served:
            results.append(resource_missing(resource))
            continue
        failures: list[Result] = []
        for namespace in scopes:
            try:
                await client.list(resource, namespace, limit=1)
            except ApiError as exc:
                failures.append(list_failure(resource, namespace, exc, who))
        results.extend(failures or [listed_ok(resource, namespaces)])
    return results


async def check_lease(
    client: KubeClient, settings: Settings, now: Callable[[], datetime], who: str | None
) -> Result:
    if not settings.leader_election:
        return election_off()
    # Settings refuse leader election without a Lease namespace.
    namespace = settings.lease_namespace or ""
    # This shard's Lease when sharded (SHARD_COUNT/SHARD_INDEX), else LEASE_NAME.
    name = settings.effective_lease_name
    try:
        lease: Mapping[str, Any] | None = await client.get(LEASES, namespace, name)
    except NotFound:
        lease = None
    except ApiError as exc:
        return lease_failure(namespace, name, exc, who)
    return lease_result(
        lease,
        namespace=namespace,
        name=name,
        now=now(),
        default_duration=settings.lease_duration,
    )


def unreachable_skips(settings: Settings) -> list[Result]:
    """What is not checked once the API server cannot be used."""
    skipped = [skip("CRDs and RBAC not checked: the API server cannot be used")]
    if settings.leader_election:
        skipped.append(skip("the leader's Lease not checked: the API server cannot be used"))
    else:
        skipped.append(election_off())
    return skipped


async def run_checks(
    client: KubeClient,
    settings: Settings,
    *,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> list[Result]:
    """Every check, in order, against the cluster ``client`` talks to."""
    api, who = await check_api(client)
    if api.failed:
        return [api, *unreachable_skips(settings)]
    crds = await check_crds(client, settings.watch_namespaces, who)
    lease = await check_lease(client, settings, now, who)
    return [api, *crds, lease]
