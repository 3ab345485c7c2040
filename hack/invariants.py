"""The fault tier's invariants, read from the API server's audit log.

The audit log is the one witness that survives every fault the tier causes:
a killed controller forgets what it did, a restarted API server forgets its
watch cache, but ``--audit-log-mode=blocking`` puts every request on disk
before its answer. Each test takes a :class:`AuditLog` mark when it starts,
reads the requests made in its namespace since then, and checks them with
the functions below. Each check returns its violations as readable lines
(the audit lines that prove them included), so a failing test says what
happened, not only that something did.

A check over an empty record proves nothing: every check goes through
:func:`invariant`, which raises :class:`EmptyAuditRecord` when it is given no
request at all, or none of the user it checks. The reader follows the API
server's log rotation (see :class:`AuditLog`), so a rotation during a test
cannot empty the record either.

The invariants (each child is created once per run, and nothing after its run's delete):

- :func:`duplicate_creates`: a child (Job, ConfigMap, CronJob) is created
  once in its lifetime: no create of a name that was created before, unless
  the test itself deleted that object out of band in between and said a
  re-create is allowed (a Job deleted under a run that has not finished);
- :func:`children_per_run`: one Job (or CronJob) per run uid, and exactly one
  for every one-shot run that ran;
- :func:`created_after_delete`: nothing created for a run after the request
  that deleted it completed (one created within :data:`RACE`, 1 s, raced the
  delete: no client can close that race, so it is reported, not counted);
- :func:`writes_after`: nothing written to a run after a moment (a settled
  run after a restart);
- :func:`controller_deleted`: a one-shot run's Job is never deleted by the
  controller while its run lives;
- :func:`late_executions`: once the controller has seen a run deleted
  (:func:`delete_seen`), its Job or CronJob is deleted by the controller
  within :data:`RACE` and no runner pod of it starts (is bound to the node)
  later than that.
"""

from __future__ import annotations

import functools
import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from controller.naming import job_name, uid_part
from hack.cluster import GARBAGE_COLLECTOR, LocalCluster

CHILDREN = ("jobs", "configmaps", "cronjobs")
CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"


def now() -> datetime:
    """The wall clock, comparable with audit timestamps (same host, UTC)."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class Request:
    """One finished request (``ResponseComplete``) of the audit log."""

    received: datetime  # requestReceivedTimestamp
    completed: datetime  # stageTimestamp of ResponseComplete
    user: str
    credential: str  # the token's id: tells two replicas of one ServiceAccount apart
    verb: str
    resource: str  # "jobs", "inferenceruns/status", ...
    namespace: str
    name: str
    code: int
    stage: str = "ResponseComplete"

    @property
    def ok(self) -> bool:
        return 200 <= self.code < 300

    @property
    def outcome_unknown(self) -> bool:
        """A 504: the API server stopped waiting for etcd, which may still have stored the write.

        Under load a create answered 504 often did create its object (the
        controller then finds it, AlreadyExists or in its cache, and never
        creates it again), so such a create is neither proof of a create nor
        of its absence.
        """
        return self.code == 504

    def __str__(self) -> str:
        who = self.user.rsplit(":", 1)[-1]
        if self.credential:
            who += f"[{self.credential[-6:]}]"
        return (
            f"{self.received:%H:%M:%S.%f} {self.verb} {self.resource} {self.name} "
            f"-> {self.code} ({who})"
        )


class AuditGap(RuntimeError):
    """Part of the audit record after the mark cannot be read: the test cannot be judged."""


class EmptyAuditRecord(AssertionError):
    """An invariant was checked over no audit event at all: it would hold vacuously."""


@dataclass(frozen=True)
class Mark:
    """Where a reader starts: the log file (by inode) and the offset in it."""

    inode: int | None  # None: there was no log yet, everything written later counts
    offset: int = 0


def mark(path: Path) -> Mark:
    """The end of the audit log at ``path`` now."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return Mark(None)
    return Mark(st.st_ino, st.st_size)


def log_files(path: Path) -> list[Path]:
    """The audit log's files, oldest first: the rotated ones, then ``path`` itself.

    kube-apiserver rotates its audit log (lumberjack) by renaming the file to
    ``<name>-<UTC timestamp><ext>`` beside it and starting a new one; the
    timestamp sorts by name.
    """
    rotated = sorted(path.parent.glob(f"{path.stem}-*{path.suffix}"))
    return [*rotated, path] if path.exists() else rotated


def read_since(path: Path, since: Mark) -> Iterator[bytes]:
    """The lines written to the audit log at ``path`` after ``since``, across rotations.

    The file marked is found again by its inode (a rotation renames it, so the
    inode stays): the rest of it is read from the offset, then every newer file
    whole. Raises :class:`AuditGap` when the marked file is gone (a rotated file
    removed) or shorter than the mark (truncated): the record is not whole.
    """
    files = [(f, f.stat()) for f in log_files(path)]
    if since.inode is None:
        start, offset = 0, 0
    else:
        found = [i for i, (_, st) in enumerate(files) if st.st_ino == since.inode]
        if not found:
            names = ", ".join(f.name for f, _ in files) or "none"
            raise AuditGap(
                f"the audit log file marked at the start of the test (inode {since.inode}) "
                f"is gone from {path.parent} (files: {names}): rotated and removed?"
            )
        start, offset = found[0], since.offset
        if files[start][1].st_size < offset:
            raise AuditGap(
                f"{files[start][0]} is shorter ({files[start][1].st_size} bytes) than the mark "
                f"({offset}): truncated since the test started"
            )
    for i, (file, _) in enumerate(files[start:]):
        with file.open("rb") as f:
            if i == 0 and offset:
                f.seek(offset)
            yield from f


class AuditLog:
    """The audit log of one test: requests in one namespace after a mark.

    The mark is the log file's inode and size when the test started, so the
    reader follows a rotation (see :func:`read_since`) instead of reading a new,
    shorter file from an offset past its end and seeing nothing.
    """

    def __init__(self, cluster: LocalCluster | Path, namespace: str) -> None:
        self.path: Path = cluster if isinstance(cluster, Path) else cluster.audit_log
        self.namespace = namespace
        self.mark = mark(self.path)

    def requests(self, stages: Sequence[str] = ("ResponseComplete",)) -> list[Request]:
        """Requests in the namespace since the mark, by arrival; finished ones unless ``stages``.

        ``ResponseStarted`` is the moment a watch was established (its
        ``ResponseComplete`` comes when it ends).
        """
        found: list[Request] = []
        needle = self.namespace.encode()
        for line in read_since(self.path, self.mark):
            if needle not in line:
                continue  # cheap filter before parsing
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line a killed kube-apiserver left half-written
            request = _parse(event, stages)
            if request is not None and request.namespace == self.namespace:
                found.append(request)
        found.sort(key=lambda r: r.received)
        return found


def _parse(event: dict[str, Any], stages: Sequence[str]) -> Request | None:
    if event.get("stage") not in stages:
        return None
    ref = event.get("objectRef") or {}
    resource = ref.get("resource") or ""
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    user = event.get("user") or {}
    credential = ((user.get("extra") or {}).get(CREDENTIAL_ID) or [""])[0]
    return Request(
        received=_time(event["requestReceivedTimestamp"]),
        completed=_time(event["stageTimestamp"]),
        user=user.get("username", ""),
        credential=credential,
        verb=event.get("verb", ""),
        resource=resource,
        namespace=ref.get("namespace") or "",
        name=ref.get("name") or "",
        code=int((event.get("responseStatus") or {}).get("code") or 0),
        stage=event["stage"],
    )


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# ------------------------------------------------------------------ the runs


@dataclass
class Run:
    """A run the test made, and what became of it."""

    name: str
    uid: str
    scheduled: bool = False
    expect: str | None = None  # the phase it must end in; None once deleted
    deleted: bool = False

    @property
    def child(self) -> str:
        """The name of its ConfigMap and Job/CronJob (upstream's algorithm)."""
        return job_name(self.name, self.uid, self.scheduled)

    @property
    def workload(self) -> str:
        return "cronjobs" if self.scheduled else "jobs"


@dataclass
class Ledger:
    """Every run of one test, by name."""

    by_name: dict[str, Run] = field(default_factory=dict)

    def add(self, created: dict[str, Any], expect: str | None) -> Run:
        meta = created["metadata"]
        run = Run(
            name=meta["name"],
            uid=meta["uid"],
            scheduled=bool((created.get("spec") or {}).get("schedule")),
            expect=expect,
        )
        self.by_name[run.name] = run
        return run

    def __iter__(self) -> Any:
        return iter(self.by_name.values())

    def owner_of(self, child: str) -> Run | None:
        """The run a child name belongs to (its last 8 characters are the run's uid part)."""
        for run in self.by_name.values():
            if child == run.child or child.endswith("-" + uid_part(run.uid)):
                return run
        return None


# ---------------------------------------------------------------- the checks

P = ParamSpec("P")
R = TypeVar("R")

# Every check, by name (filled by :func:`invariant`): a test holds each to the empty rule.
CHECKS: dict[str, Callable[..., Any]] = {}


def invariant(
    check: Callable[Concatenate[Sequence[Request], str, P], R],
) -> Callable[Concatenate[Sequence[Request], str, P], R]:
    """Make ``check(requests, user, ...)`` refuse to judge an empty record.

    The one place every check goes through: with no request at all, or none
    by ``user`` (the client whose behaviour is checked), it raises
    :class:`EmptyAuditRecord` instead of finding no violation in nothing (an
    audit policy, log path or reader that lost the record would otherwise
    pass every fault test).
    """

    @functools.wraps(check)
    def checked(requests: Sequence[Request], user: str, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if not requests:
            raise EmptyAuditRecord(f"{check.__name__}: no audit events seen")
        if not any(r.user == user for r in requests):
            users = sorted({r.user for r in requests})
            raise EmptyAuditRecord(
                f"{check.__name__}: no audit events seen of {user} "
                f"({len(requests)} of others: {', '.join(users[:5])})"
            )
        return check(requests, user, *args, **kwargs)

    CHECKS[check.__name__] = checked
    return checked


def _creates(requests: Iterable[Request], user: str, resources: Sequence[str]) -> list[Request]:
    return [
        r for r in requests if r.user == user and r.verb == "create" and r.resource in resources
    ]


def history(requests: Iterable[Request], name: str, limit: int = 12) -> list[str]:
    """The audit lines about one object name (the first ``limit``), for a violation's evidence."""
    lines = [f"    {r}" for r in requests if r.name == name]
    if len(lines) > limit:
        lines = [*lines[:limit], f"    ... {len(lines) - limit} more"]
    return lines


def _summary(what: str, found: list[Request], samples: int = 3) -> list[str]:
    """One line for a group of offending requests, then a few of them."""
    codes = Counter(r.code for r in found)
    spread = f"{found[0].received:%H:%M:%S.%f} .. {found[-1].received:%H:%M:%S.%f}"
    lines = [f"{what}: {len(found)} ({dict(codes)}) from {spread}"]
    lines += [f"    {r}" for r in found[:samples]]
    if len(found) > samples:
        lines.append(f"    ... {len(found) - samples} more")
    return lines


@invariant
def duplicate_creates(
    requests: Sequence[Request],
    user: str,
    *,
    resources: Sequence[str] = CHILDREN,
    recreatable: Iterable[str] = (),
) -> list[str]:
    """Creates of an object whose name had been created before.

    Any create after the first successful one counts: a 2xx is a second
    object; a 409 shows the controller acting on a view that did not have
    its own child. For names in ``recreatable`` one successful create is
    allowed after each out-of-band delete (by a user other than ``user``).
    """
    allowed = set(recreatable)
    found: dict[tuple[str, str], list[Request]] = defaultdict(list)
    seen: dict[tuple[str, str], bool] = {}  # (resource, name) -> exists since its create
    for r in requests:
        key = (r.resource, r.name)
        if r.resource not in resources:
            continue
        if r.verb == "delete" and r.user != user and r.ok and r.name in allowed:
            seen[key] = False
            continue
        if r.user != user or r.verb != "create":
            continue
        if seen.get(key):
            found[key].append(r)
        elif r.ok:
            seen[key] = True
    violations: list[str] = []
    for (resource, name), again in found.items():
        violations += _summary(f"{resource} {name} created again after its first create", again)
    return [*violations, *_evidence(requests, {name for _, name in found})]


@invariant
def children_per_run(requests: Sequence[Request], user: str, runs: Ledger) -> list[str]:
    """One workload name per run uid; exactly one create for each one-shot run that ran."""
    violations: list[str] = []
    shown: set[str] = set()
    names: dict[str, set[str]] = defaultdict(set)
    count: dict[str, int] = defaultdict(int)
    unknown: dict[str, int] = defaultdict(int)  # creates answered 504, by run
    for r in _creates(requests, user, ("jobs", "cronjobs")):
        if r.outcome_unknown and (owner := runs.owner_of(r.name)) and r.name == owner.child:
            unknown[owner.name] += 1
        if not r.ok:
            continue
        owner = runs.owner_of(r.name)
        if owner is None:
            violations.append(f"a {r.resource} object for no run of this test: {r}")
            shown.add(r.name)
            continue
        names[owner.name].add(r.name)
        if r.name == owner.child:
            count[owner.name] += 1
    for run in runs:
        if len(names[run.name]) > 1:
            violations.append(f"run {run.name} ({run.uid}) got {sorted(names[run.name])}")
            shown |= names[run.name]
        # No 2xx create but one answered 504: that one may be the create (never a second).
        created = count[run.name] or min(unknown[run.name], 1)
        if run.expect is not None and not run.scheduled and created != 1:
            violations.append(
                f"one-shot run {run.name}: its Job {run.child} created {count[run.name]} times"
            )
            shown.add(run.child)
    return [*violations, *_evidence(requests, shown)]


def delete_times(requests: Sequence[Request], user: str, runs: Ledger) -> dict[str, datetime]:
    """When each deleted run's delete request completed (the test's own delete, by ``user``)."""
    found: dict[str, datetime] = {}
    for r in requests:
        if (
            r.user == user
            and r.verb == "delete"
            and r.resource == "inferenceruns"
            and r.ok
            and r.name in runs.by_name
        ):
            found.setdefault(r.name, r.completed)
    return found


# A reconcile that confirmed a run just before the user deleted it may create
# right after the delete: no Kubernetes request makes check-and-create atomic
# (a finalizer would not either: the create would still land after the delete
# request). A pass takes milliseconds, so a create this soon after the delete
# is such a race and is reported as one; anything later was decided on a stale
# view (the incident's creates came 10-30 s after the delete).
RACE = 1.0


@invariant
def created_after_delete(
    requests: Sequence[Request],
    user: str,
    runs: Ledger,
    deleted_at: dict[str, datetime],
    *,
    race: float = RACE,
) -> tuple[list[str], list[str]]:
    """Children created (2xx) for a run after its delete completed: (violations, races).

    A create received within ``race`` seconds of the delete is a race, not a
    violation (see :data:`RACE`); creates that failed made nothing and are
    shown with the others, not counted.
    """
    found: dict[str, list[Request]] = defaultdict(list)
    for r in _creates(requests, user, CHILDREN):
        owner = runs.owner_of(r.name)
        if owner is not None and owner.name in deleted_at and r.received > deleted_at[owner.name]:
            found[owner.name].append(r)
    violations: list[str] = []
    races: list[str] = []
    for name, late in found.items():
        at = deleted_at[name]
        stale = [r for r in late if (r.received - at).total_seconds() > race]
        if not any(r.ok for r in stale):
            races += [
                f"raced the delete of run {name} at {at:%H:%M:%S.%f} "
                f"(+{(r.received - at).total_seconds():.3f} s): {r}"
                for r in late
                if r.ok
            ]
            continue
        first = (stale[0].received - at).total_seconds()
        last = (stale[-1].received - at).total_seconds()
        kinds = dict(Counter(r.resource for r in stale if r.ok))
        violations += _summary(
            f"run {name} deleted at {at:%H:%M:%S.%f}: children created more than {race:.0f} s "
            f"afterwards {kinds}, +{first:.1f} s .. +{last:.1f} s; creates",
            stale,
        )
        violations.append(f"  audit history of run {name}:")
        violations += history(requests, name)
    return violations, races


@invariant
def writes_after(
    requests: Sequence[Request], user: str, name: str, since: datetime, what: str
) -> list[str]:
    """Writes (update, patch) to run ``name`` or its status received after ``since``."""
    found = [
        r
        for r in requests
        if r.user == user
        and r.name == name
        and r.resource in ("inferenceruns", "inferenceruns/status")
        and r.verb in ("update", "patch")
        and r.received > since
    ]
    return _summary(what, found) if found else []


@invariant
def controller_deleted(requests: Sequence[Request], user: str, runs: Ledger) -> list[str]:
    """Deletes of a live one-shot run's Job by the controller (never replaced, never deleted).

    A deleted run's Job is deleted by the controller at once: that is checked
    by :func:`late_executions`, not here.
    """
    violations = []
    for r in requests:
        if r.user == user and r.verb == "delete" and r.resource == "jobs":
            owner = runs.owner_of(r.name)
            if (
                owner is not None
                and not owner.scheduled
                and not owner.deleted
                and r.name == owner.child
            ):
                violations.append(f"the controller deleted a one-shot run's Job: {r}")
    return violations


@invariant
def children_once(
    requests: Sequence[Request], user: str, runs: Ledger, *, recreatable: Sequence[Run] = ()
) -> list[str]:
    """The checks every fault test makes of the children, in one place.

    Each child created once (:func:`duplicate_creates`), one workload per run
    (:func:`children_per_run`), no one-shot run's Job deleted by the
    controller (:func:`controller_deleted`). A ``recreatable`` run's Job was
    deleted out of band: one create is allowed after each such delete, so it
    is left out of the once-per-run count.
    """
    once = Ledger(dict(runs.by_name))
    for run in recreatable:
        once.by_name[run.name] = Run(run.name, run.uid, run.scheduled, expect=None)
    return [
        *duplicate_creates(requests, user, recreatable=[run.child for run in recreatable]),
        *children_per_run(requests, user, once),
        *controller_deleted(requests, user, runs),
    ]


# Who binds pods to the node in the local cluster (hack.nodeagent, as the
# cluster's admin): a pod bound is a runner execution starting.
BINDER = "admin"
# An informer is back after a restart with its first list within this long, else its first watch.
RELIST_WITHIN = 60.0


def _runs_view_back(
    requests: Sequence[Request], user: str, credential: str | None, since: datetime
) -> datetime | None:
    """When ``credential``'s (any of ``user``'s) runs informer had a fresh view after ``since``."""
    mine = [
        r
        for r in requests
        if r.user == user
        and r.resource == "inferenceruns"
        and r.ok
        and r.received >= since
        and (credential is None or r.credential == credential)
    ]
    lists = [
        r.completed
        for r in mine
        if r.verb == "list"
        and r.stage == "ResponseComplete"
        and (r.received - since).total_seconds() <= RELIST_WITHIN
    ]
    if lists:
        return min(lists)
    watches = [r.completed for r in mine if r.verb == "watch" and r.stage == "ResponseStarted"]
    return min(watches, default=None)


@invariant
def delete_seen(
    requests: Sequence[Request],
    user: str,
    deleted_at: dict[str, datetime],
    *,
    starts: Sequence[datetime] = (),
) -> dict[str, datetime]:
    """When the controller could first see each run's delete (``deleted_at``: when it completed).

    Needs ``ResponseStarted`` requests too. ``starts`` are the times the test
    started kube-apiserver again: a controller cannot see anything between
    such a start and (a) the first Lease write of a replica after it (the
    leader, leading again or anew; no Lease write at all: one replica, no
    election) and (b) that replica's runs informer having a fresh view again
    (its first list within :data:`RELIST_WITHIN`, else its first watch).
    A delete is seen at the latest of the three moments; with no start before
    it, when it completed.
    """
    seen: dict[str, datetime] = {}
    for name, deleted in deleted_at.items():
        start = max((t for t in starts if t <= deleted), default=None)
        if start is None:
            seen[name] = deleted
            continue
        leases = [
            r
            for r in requests
            if r.user == user
            and r.resource == "leases"
            and r.verb in ("update", "create")
            and r.ok
            and r.stage == "ResponseComplete"
            and r.received >= start
        ]
        leader = min(leases, key=lambda r: r.received, default=None)
        credential = leader.credential if leader is not None else None
        moments = [deleted]
        if leader is not None:
            moments.append(leader.completed)
        back = _runs_view_back(requests, user, credential, start)
        if back is not None:
            moments.append(back)
        seen[name] = max(moments)
    return seen


@invariant
def late_executions(
    requests: Sequence[Request],
    user: str,
    runs: Ledger,
    seen: dict[str, datetime],
    *,
    bound: float = RACE,
    binder: str = BINDER,
    gc: str = GARBAGE_COLLECTOR,
) -> list[str]:
    """A deleted run's workload not deleted by the controller, or a runner started, late.

    For every run in ``seen`` (when the controller could first see it
    deleted, :func:`delete_seen`) whose Job or CronJob the controller had
    created: the controller deletes it (answered 2xx, or 404 when something
    else was faster) within ``bound`` seconds of that moment, unless the
    garbage collector (``gc``: its deletes of Jobs and CronJobs are audited)
    deleted it first, and no pod of it
    (``<workload>-...``: the Job's pods, a CronJob's executions' pods) is bound
    to the node (by ``binder``) later than that: no runner execution starts
    more than ``bound`` after the delete was seen. A record with no deleted
    run that had a workload checks nothing and is a violation itself.
    """
    violations: list[str] = []
    checked = 0
    for run in runs:
        at = seen.get(run.name)
        if at is None:
            continue
        limit = at.timestamp() + bound
        workloads = sorted(
            {
                r.name
                for r in _creates(requests, user, ("jobs", "cronjobs"))
                if r.ok and runs.owner_of(r.name) is run and r.received.timestamp() <= limit
            }
        )
        for workload in workloads:
            checked += 1
            deletes = [
                r
                for r in requests
                if r.user in (user, gc)
                and r.verb == "delete"
                and r.resource in ("jobs", "cronjobs")
                and r.name == workload
                and (r.ok or r.code == 404)
            ]
            first = min(deletes, key=lambda r: r.received, default=None)
            if first is None:
                violations.append(
                    f"run {run.name} deleted (seen {at:%H:%M:%S.%f}): its {workload} was never "
                    "deleted by the controller (nor by the garbage collector)"
                )
            elif first.received.timestamp() > limit:
                late = (first.received - at).total_seconds()
                violations.append(
                    f"run {run.name} deleted (seen {at:%H:%M:%S.%f}): its {workload} deleted "
                    f"+{late:.1f} s later: {first}"
                )
            started = [
                r
                for r in requests
                if r.user == binder
                and r.verb == "create"
                and r.resource == "pods/binding"
                and r.ok
                and r.name.startswith(workload + "-")
                and r.received.timestamp() > limit
            ]
            if started:
                violations += _summary(
                    f"run {run.name} deleted (seen {at:%H:%M:%S.%f}): runner pods of {workload} "
                    f"started more than {bound:.0f} s afterwards",
                    started,
                )
            if first is None or first.received.timestamp() > limit or started:
                violations += history(requests, workload)
    if not checked:
        violations.append(
            f"late executions: none of the {len(seen)} deleted run(s) had a workload the "
            "controller created: nothing was checked"
        )
    return violations


def _evidence(requests: Sequence[Request], names: set[str]) -> list[str]:
    lines: list[str] = []
    for name in sorted(names):
        lines.append(f"  audit history of {name}:")
        lines += history(requests, name)
    return lines


INFORMED = ("inferenceruns", "inferenceconfigs", "jobs", "cronjobs", "configmaps", "pods")


def informers_back(
    requests: Iterable[Request], user: str, since: datetime, relist_within: float = 60.0
) -> dict[str, Request | None]:
    """resource -> when each informer of ``user`` was back after ``since``.

    Back means its first successful list (``ResponseComplete``) within
    ``relist_within`` seconds; an informer that did not relist is back with
    its first re-opened watch (``ResponseStarted``). A watch resumed from a
    resourceVersion the restarted server no longer has starts with 200 and
    then ends in a 410, so the list that follows, not that watch, is when
    the cache is whole again. Needs ``ResponseStarted`` requests (see
    :meth:`AuditLog.requests`).
    """
    lists: dict[str, Request] = {}
    watches: dict[str, Request] = {}
    for r in requests:
        if r.user != user or r.received <= since or r.resource not in INFORMED or not r.ok:
            continue
        if r.verb == "list" and r.stage == "ResponseComplete":
            if (r.received - since).total_seconds() <= relist_within:
                lists.setdefault(r.resource, r)
        elif r.verb == "watch" and r.stage == "ResponseStarted":
            watches.setdefault(r.resource, r)
    return {k: lists.get(k) or watches.get(k) for k in INFORMED}


def describe_informers_back(back: dict[str, Request | None], since: datetime) -> str:
    parts = []
    for resource, r in back.items():
        if r is None:
            parts.append(f"{resource}: not back")
        else:
            parts.append(f"{resource} {(r.received - since).total_seconds():+.1f}s ({r.verb})")
    return ", ".join(parts)


def refused_creates(requests: Iterable[Request], user: str, limit: int = 10) -> list[str]:
    """The user's creates of children that the API server refused, for context."""
    refused = [
        r for r in requests if r.user == user and r.verb == "create" and r.resource in CHILDREN
    ]
    refused = [r for r in refused if not r.ok]
    lines = [f"refused creates of children: {len(refused)}"]
    lines += [f"  {r}" for r in refused[:limit]]
    return lines


def count_by_verb(requests: Iterable[Request], user: str) -> dict[str, int]:
    """``verb resource`` -> count for one user: the shape of what happened, for reports."""
    counts: dict[str, int] = defaultdict(int)
    for r in requests:
        if r.user == user:
            counts[f"{r.verb} {r.resource}"] += 1
    return dict(sorted(counts.items()))


def report(title: str, violations: list[str], context: Iterable[str] = ()) -> str:
    """One assertion message: the violations, then what the test did and when."""
    lines = [f"{title}: {sum(1 for v in violations if not v.startswith(' '))} violation(s)"]
    lines += violations
    context = list(context)
    if context:
        lines.append("what the test did:")
        lines += [f"  {c}" for c in context]
    return "\n".join(lines)
