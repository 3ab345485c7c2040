"""``kubectl infer``: submit, follow, re-run, trigger, list and manage InferenceRuns.

A kubectl plugin (the ``kubectl-infer`` console script; kubectl finds it on
``PATH``), in the spirit of ``argo submit --watch``::

    kubectl infer submit iris-inference-config -p input_table_name=t --watch --logs
    kubectl infer watch my-run --logs      # follow until it ends; exit code by outcome
    kubectl infer logs my-run -f --shard 1 # one shard's runner log
    kubectl infer rerun my-run --watch     # a new run with the same spec
    kubectl infer trigger iris-hourly -w   # a scheduled run, now (a Job from its CronJob)
    kubectl infer suspend iris-hourly      # and resume, delete
    kubectl infer list -A -o name          # runs with their last result

Following prints the run's phase and progress as they change, its Events,
and with ``--logs`` the runner's log lines, and exits with the outcome:
0 succeeded, 1 failed, 3 the run cannot go on (phase Error: invalid spec, a
missing or invalid config, refused by the API server), 4 ``--wait-timeout`` passed,
5 the run was deleted, 6 no such run (or the wrong kind of run); 2 is a bad
command line; 7, 8 and 9 are a missing kubeconfig, one that cannot be read and
a context that is not in it. The kubeconfig is found and merged as kubectl
does it (:mod:`kubectl_infer.kubeconfig`); ``--kubeconfig``, ``--context`` and
``-n`` go anywhere on the line. ``kubectl_complete-infer`` (:func:`complete_main`)
is the shell completion kubectl asks plugins for. Everything the plugin builds
or prints comes from :mod:`kubectl_infer.runview`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import secrets
import string
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from contract.api import CONTAINER_NAME, run_selector
from kubeclient.client import KubeClient
from kubeclient.errors import ApiError, NotFound, TransportError
from kubeclient.resources import (
    CONFIGS,
    CRONJOBS,
    EVENTS,
    JOBS,
    NAMESPACES,
    PODS,
    RUNS,
    Resource,
)
from kubectl_infer import kubeconfig, runview
from kubectl_infer.runview import Exit, UsageError

Obj = dict[str, Any]
WATCH_SECONDS = 300
# How long a finished run's log followers may take to print what is left.
LOG_DRAIN_SECONDS = 5.0
# How often ``delete`` looks whether the run is gone.
DELETE_POLL_SECONDS = 0.5


class Output:
    """Where the plugin writes: lines to stdout, problems to stderr."""

    def __init__(self, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> None:
        self.out = out
        self.err = err

    def line(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def problem(self, text: str) -> None:
        print(f"error: {text}", file=self.err, flush=True)

    def warning(self, text: str) -> None:
        print(f"warning: {text}", file=self.err, flush=True)

    def note(self, text: str) -> None:
        """Not the command's output (kubectl's "No resources found"): to stderr, as is."""
        print(text, file=self.err, flush=True)


# ---------------------------------------------------------------------- following


class Follower:
    """Follows one run (and, for a scheduled run, one of its Jobs) until it ends.

    ``quiet`` (``logs -f``): only the log lines, no phase lines or Events; ``shard``: only that
    shard's pods; ``prefix``: each log line starts with ``[pod]``.
    """

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        output: Output,
        *,
        logs: bool,
        quiet: bool = False,
        shard: int | None = None,
        prefix: bool = True,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.output = output
        self.logs = logs
        self.quiet = quiet
        self.shard = shard
        self.prefix = prefix
        self._followed_pods: set[str] = set()
        self._log_tasks: list[asyncio.Task[None]] = []
        self._seen_events: set[tuple[Any, Any]] = set()

    @classmethod
    def of(cls, kube: KubeClient, args: argparse.Namespace, output: Output) -> Follower:
        """The follower a command's ``--namespace`` and ``--logs`` ask for."""
        return cls(kube, args.namespace, output, logs=args.logs)

    def _say(self, line: str) -> None:
        if not self.quiet:
            self.output.line(line)

    async def run(self, name: str) -> Exit:
        """Follow a one-shot run to its end (a scheduled run: its next or current execution)."""
        run = await get_run(self.kube, self.namespace, name, self.output)
        if run is None:
            return Exit.NOT_FOUND
        runview.check_shard(run, self.shard)
        if runview.is_scheduled(run):
            return await self._scheduled(run)
        if self.logs and runview.run_outcome(run) is not None:
            # Finished already: its pods' logs are read out, not followed.
            self._say(f"{name}: {runview.status_line(run)}")
            if not await self.print_logs(run):
                self.output.warning(f"{name!r} has no runner pod left to read a log from")
            self._say(f"{name}: {runview.result_line(run)}")
            outcome = runview.run_outcome(run)
            assert outcome is not None
            return outcome
        return await self._with_side_streams(run, self._follow_run(run))

    async def print_logs(self, run: Obj, job_name: str | None = None) -> int:
        """Print the whole log of each of the run's started pods (only ``job_name``'s, and only
        :attr:`shard`'s); how many pods' logs were read."""
        listed = await self.kube.list(
            PODS, self.namespace, label_selector=_pod_selector(run, job_name)
        )
        printed = 0
        for pod in runview.log_pods(listed.get("items") or [], shard=self.shard):
            name = pod["metadata"]["name"]
            if not _container_started(pod):
                continue
            try:
                text = await self.kube.read_pod_log(
                    self.namespace, name, container=CONTAINER_NAME, tail_lines=None
                )
            except (ApiError, TransportError) as exc:
                self.output.problem(f"cannot read the log of pod {name}: {exc}")
                continue
            printed += 1
            for line in text.splitlines():
                self._log_line(name, line)
        return printed

    def _log_line(self, pod: str, line: str) -> None:
        self.output.line(f"[{pod}] {line}" if self.prefix else line)

    async def job(self, run: Obj, job_name: str) -> Exit:
        """Follow one Job of a scheduled run (``trigger --watch``) to its end."""
        return await self._with_side_streams(run, self._follow_job(job_name), job_name=job_name)

    async def _scheduled(self, run: Obj) -> Exit:
        meta = run["metadata"]
        self._say(f"{meta['name']}: {runview.status_line(run)}")
        jobs = await self.jobs_of(run)
        current = runview.newest_job([j for j in jobs if runview.job_outcome(j) is None])
        if current is None:
            known = {j["metadata"]["name"] for j in jobs}
            self._say(f"{meta['name']}: waiting for its next execution")
            name = await self._next_job(run, known)
        else:
            name = current["metadata"]["name"]
        return await self.job(run, name)

    async def _with_side_streams(
        self, run: Obj, main: Awaitable[Exit], *, job_name: str | None = None
    ) -> Exit:
        side = [] if self.quiet else [asyncio.create_task(self._events(run))]
        if self.logs:
            side.append(asyncio.create_task(self._pods(run, job_name)))
        try:
            outcome = await main
            if self._log_tasks:
                # The run's status can say Succeeded before its log is read out.
                await asyncio.wait(self._log_tasks, timeout=LOG_DRAIN_SECONDS)
            return outcome
        finally:
            for task in side + self._log_tasks:
                task.cancel()
            await asyncio.gather(*side, *self._log_tasks, return_exceptions=True)

    async def _follow_run(self, run: Obj) -> Exit:
        name = run["metadata"]["name"]
        last = runview.status_line(run)
        self._say(f"{name}: {last}")

        def seen(current: Obj) -> Exit | None:
            nonlocal last
            line = runview.status_line(current)
            if line != last:
                self._say(f"{name}: {line}")
                last = line
            outcome = runview.run_outcome(current)
            if outcome is not None:
                self._say(f"{name}: {runview.result_line(current)}")
            return outcome

        return await self._follow(RUNS, run, seen)

    async def _follow_job(self, job_name: str) -> Exit:
        try:
            job = await self.kube.get(JOBS, self.namespace, job_name)
        except NotFound:
            self.output.problem(f"Job {job_name!r} is gone")
            return Exit.DELETED
        self._say(f"following Job {job_name}")

        def seen(current: Obj) -> Exit | None:
            outcome = runview.job_outcome(current)
            if outcome is not None:
                word = "succeeded" if outcome is Exit.SUCCEEDED else "failed"
                self._say(f"Job {job_name}: {word}")
            return outcome

        return await self._follow(JOBS, job, seen)

    async def _follow(
        self, resource: Resource, obj: Obj, seen: Callable[[Obj], Exit | None]
    ) -> Exit:
        """Hand ``obj`` and each later version of it to ``seen`` until it returns an outcome;
        :attr:`Exit.DELETED` once the object is gone."""
        name = obj["metadata"]["name"]
        async for current in self._watch_one(resource, name, obj):
            if current is None:
                self.output.problem(f"{resource.kind} {name!r} was deleted")
                return Exit.DELETED
            outcome = seen(current)
            if outcome is not None:
                return outcome
        raise AssertionError("not reached: _watch_one ends only with the object gone")

    async def _watch_one(
        self, resource: Resource, name: str, obj: Obj
    ) -> AsyncIterator[Obj | None]:
        """``obj`` and every later version of it; ``None`` once it is deleted."""
        yield obj
        rv = obj["metadata"]["resourceVersion"]
        while True:
            try:
                async for event in self.kube.watch(
                    resource,
                    self.namespace,
                    resource_version=rv,
                    field_selector=f"metadata.name={name}",
                    timeout_seconds=WATCH_SECONDS,
                ):
                    kind, current = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        raise ApiError(int(current.get("code") or 0), "WatchError", str(current))
                    rv = (current.get("metadata") or {}).get("resourceVersion") or rv
                    if kind == "DELETED":
                        yield None
                        return
                    if kind in ("ADDED", "MODIFIED"):
                        yield current
            except (ApiError, TransportError) as exc:
                if isinstance(exc, ApiError) and not (exc.is_gone or exc.status in (0, 500)):
                    raise
                # A lost or expired watch: read the object again and go on from it.
                await asyncio.sleep(1)
                try:
                    fresh = await self.kube.get(resource, self.namespace, name)
                except NotFound:
                    yield None
                    return
                rv = fresh["metadata"]["resourceVersion"]
                yield fresh

    async def _present_and_later(
        self,
        resource: Resource,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        order: Callable[[Obj], str] | None = None,
    ) -> AsyncIterator[Obj]:
        """Every object the selector matches now (a list, in ``order``), then each one added or
        changed."""
        listed = await self.kube.list(
            resource, self.namespace, label_selector=label_selector, field_selector=field_selector
        )
        items = list(listed.get("items") or [])
        for obj in sorted(items, key=order) if order is not None else items:
            yield obj
        rv = listed["metadata"]["resourceVersion"]
        while True:
            async for event in self.kube.watch(
                resource,
                self.namespace,
                resource_version=rv,
                label_selector=label_selector,
                field_selector=field_selector,
                timeout_seconds=WATCH_SECONDS,
            ):
                obj = event.get("object") or {}
                rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                if event.get("type") in ("ADDED", "MODIFIED"):
                    yield obj

    async def _events(self, run: Obj) -> None:
        selector = f"involvedObject.uid={run['metadata']['uid']}"
        async for event in self._present_and_later(
            EVENTS, field_selector=selector, order=_event_time
        ):
            self._print_event(event)

    def _print_event(self, event: Obj) -> None:
        key = ((event.get("metadata") or {}).get("uid"), event.get("count"))
        if key in self._seen_events:
            return
        self._seen_events.add(key)
        self.output.line(runview.event_line(event))

    async def _pods(self, run: Obj, job_name: str | None) -> None:
        """Start following each of the run's pods' logs once its container has started."""
        async for pod in self._present_and_later(PODS, label_selector=_pod_selector(run, job_name)):
            self._maybe_follow_pod(pod)

    def _maybe_follow_pod(self, pod: Obj) -> None:
        name = pod["metadata"]["name"]
        if name in self._followed_pods or not _container_started(pod):
            return
        if self.shard is not None and runview.pod_shard(pod) != self.shard:
            return
        self._followed_pods.add(name)
        self._log_tasks.append(asyncio.create_task(self._log(name)))

    async def _log(self, pod: str) -> None:
        try:
            async for line in self.kube.follow_pod_log(
                self.namespace, pod, container=CONTAINER_NAME
            ):
                self._log_line(pod, line)
        except (ApiError, TransportError) as exc:
            self.output.problem(f"cannot read the log of pod {pod}: {exc}")

    async def jobs_of(self, run: Obj) -> list[Obj]:
        listed = await self.kube.list(
            JOBS, self.namespace, label_selector=run_selector(run["metadata"]["uid"])
        )
        return list(listed.get("items") or [])

    async def _next_job(self, run: Obj, known: set[str]) -> str:
        selector = run_selector(run["metadata"]["uid"])
        async for job in self._present_and_later(JOBS, label_selector=selector):
            if job["metadata"]["name"] not in known:
                return str(job["metadata"]["name"])
        raise AssertionError("not reached: the watch is renewed for ever")


def _pod_selector(run: Obj, job_name: str | None) -> str:
    """The run's runner pods (only ``job_name``'s when given)."""
    selector = run_selector(run["metadata"]["uid"])
    return selector if job_name is None else f"{selector},job-name={job_name}"


def _container_started(pod: Mapping[str, Any]) -> bool:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER_NAME:
            state = status.get("state") or {}
            return "running" in state or "terminated" in state
    return False


def _event_time(event: Obj) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )


# ----------------------------------------------------------------------- commands


async def get_run(kube: KubeClient, namespace: str, name: str, output: Output) -> Obj | None:
    """The run ``name``, or None once the problem (no such run) is said."""
    try:
        return await kube.get(RUNS, namespace, name)
    except NotFound:
        output.problem(f"no InferenceRun {name!r} in namespace {namespace!r}")
        return None


# What to use instead, by whether the run named is a scheduled one.
_OTHER_COMMAND = {
    True: "is a scheduled run: `kubectl infer trigger {run}` starts it now",
    False: "is a one-shot run: `kubectl infer rerun {run}` runs it again",
}


async def _run_to_act_on(
    kube: KubeClient, args: argparse.Namespace, output: Output, *, scheduled: bool
) -> Obj | None:
    """``args.run`` when it is a scheduled run (``scheduled``) or a one-shot one (not);
    else None, once the problem and the command to use instead are said."""
    run = await get_run(kube, args.namespace, args.run, output)
    if run is None or runview.is_scheduled(run) == scheduled:
        return run
    output.problem(f"{args.run!r} " + _OTHER_COMMAND[not scheduled].format(run=args.run))
    return None


async def _create_run(
    kube: KubeClient, args: argparse.Namespace, output: Output, body: Obj, note: str = ""
) -> Exit:
    """Create the run ``body`` and say so (or print it, ``-o``); with ``--watch``, follow it."""
    fmt = getattr(args, "output", None)
    runview.check_output(fmt, following=args.watch)
    created = await kube.create(RUNS, args.namespace, body)
    name = created["metadata"]["name"]
    if fmt:
        output.line(runview.render([created], fmt, as_list=False))
    else:
        output.line(f"{runview.RESOURCE}/{name} created{note}")
    if not args.watch:
        return Exit.SUCCEEDED
    return await Follower.of(kube, args, output).run(name)


async def _config_exists(kube: KubeClient, args: argparse.Namespace, output: Output) -> bool:
    """False once it is said that the config to run does not exist (a warning with
    ``--no-wait-for-config``, else the problem); True also when it cannot be read (no right)."""
    namespace = args.config_namespace or args.namespace
    try:
        await kube.get(CONFIGS, namespace, args.config)
        return True
    except NotFound:
        where = f"InferenceConfig {args.config!r} does not exist in namespace {namespace!r}"
        if args.no_wait_for_config:
            output.warning(
                f"{where}: the run waits for it (phase Error, ConfigNotFound, until it exists)"
            )
            return True
        output.problem(
            f"{where}; nothing is submitted (--no-wait-for-config submits the run anyway, "
            "to wait for the config)"
        )
        return False
    except ApiError as exc:
        if exc.status != 403:
            raise
        output.warning(f"cannot check that InferenceConfig {args.config!r} exists: {exc.message}")
        return True


async def submit(kube: KubeClient, args: argparse.Namespace, output: Output) -> Exit:
    body = runview.new_run(
        config=args.config,
        name=args.name,
        config_namespace=args.config_namespace,
        parameters=runview.parse_parameters(args.parameter),
        timeout_seconds=args.timeout_seconds,
        parallelism=args.parallelism,
        backoff_limit=args.backoff_limit,
        schedule=args.schedule,
    )
    runview.check_output(args.output, following=args.watch)
    if not await _config_exists(kube, args, output):
        return Exit.NOT_FOUND
    return await _create_run(kube, args, output, body)


async def watch(kube: KubeClient, args: argparse.Namespace, output: Output) -> Exit:
    return await Follower.of(kube, args, output).run(args.run)


async def logs(kube: KubeClient, args: argparse.Namespace, output: Output) -> Exit:
    """The runner's log: read out, or with ``-f`` followed until the run (execution) ends."""
    follower = Follower(
        kube,
        args.namespace,
        output,
        logs=True,
        quiet=True,
        shard=args.shard,
        prefix=args.prefix,
    )
    if args.follow:
        outcome = await follower.run(args.run)
        # The log is what was asked for; how the run ended is `watch`'s exit code.
        return Exit.SUCCEEDED if outcome in (Exit.FAILED, Exit.ERROR) else outcome
    run = await get_run(kube, args.namespace, args.run, output)
    if run is None:
        return Exit.NOT_FOUND
    runview.check_shard(run, args.shard)
    job_name = None
    if runview.is_scheduled(run):
        newest = runview.newest_job(await follower.jobs_of(run))
        if newest is None:
            output.problem(f"{args.run!r} has had no execution yet: no log")
            return Exit.NOT_FOUND
        job_name = str(newest["metadata"]["name"])
    if not await follower.print_logs(run, job_name):
        which = "" if args.shard is None else f" of shard {args.shard}"
        output.problem(
            f"{args.run!r} has no runner pod{which} with a log "
            f"({runview.status_line(run)}); -f waits for one"
        )
        return Exit.NOT_FOUND
    return Exit.SUCCEEDED


async def rerun(kube: KubeClient, args: argparse.Namespace, output: Output) -> Exit:
    run = await _run_to_act_on(kube, args, output, scheduled=False)
    if run is None:
        return Exit.NOT_FOUND
    phase = (run.get("status") or {}).get("phase")
    if phase not in (*runview.FINISHED_PHASES, "Error"):
        output.problem(
            f"{args.run!r} has not finished (phase {phase or 'Pending'}): "
            f"`kubectl infer watch {args.run}` follows it"
        )
        return Exit.NOT_FOUND
    body = runview.rerun_of(run, args.name)
    return await _create_run(kube, args, output, body, f" (a re-run of {args.run})")


async def trigger(kube: KubeClient, args: argparse.Namespace, output: Output) -> Exit:
    run = await _run_to_act_on(kube, args, output, scheduled=True)
    if run is None:
        return Exit.NOT_FOUND
    if runview.is_suspended(run) and not args.force:
        output.problem(
            f"{args.run!r} is suspended: its schedule starts nothing until "
            f"`kubectl infer resume {args.run}`; --force starts one execution anyway"
        )
        return Exit.USAGE
    ref = (run.get("status") or {}).get("jobStatus") or {}
    if ref.get("kind") != "CronJob" or not ref.get("name"):
        output.problem(f"{args.run!r} has no CronJob yet: {runview.status_line(run)}")
        return Exit.ERROR
    try:
        cronjob = await kube.get(CRONJOBS, args.namespace, ref["name"])
    except NotFound:
        output.problem(f"CronJob {ref['name']!r} of {args.run!r} is gone")
        return Exit.ERROR
    token = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))
    job = runview.job_from_cronjob(cronjob, runview.manual_job_name(ref["name"], token))
    created = await kube.create(JOBS, args.namespace, job)
    job_name = created["metadata"]["name"]
    output.line(f"job.batch/{job_name} created (from cronjob/{ref['name']})")
    if not args.watch:
        return Exit.SUCCEEDED
    return await Follower.of(kube, args, output).job(run, job_name)


async def _set_suspend(
    kube: KubeClient, args: argparse.Namespace, output: Output, *, suspend: bool
) -> Exit:
    run = await get_run(kube, args.namespace, args.run, output)
    if run is None:
        return Exit.NOT_FOUND
    word = "suspended" if suspend else "resumed"
    if runview.is_suspended(run) == suspend:
        output.line(f"{runview.RESOURCE}/{args.run} already {word}")
        return Exit.SUCCEEDED
    await kube.patch(RUNS, args.namespace, args.run, runview.suspend_patch(suspend))
    output.line(f"{runview.RESOURCE}/{args.run} {word}")
    return Exit.SUCCEEDED


async def suspend(kube: KubeClient, args: argparse.Namespace, output: Output) -> Exit:
    return await _set_suspend(kube, args, output, suspend=True)


async def resume(kube: KubeClient, args: argparse.Namespace, output: Output) -> Exit:
    return await _set_suspend(kube, args, output, suspend=False)


async def delete(kube: KubeClient, args: argparse.Namespace, output: Output) -> Exit:
    """Delete each run named (its Jobs and pods go with it); with ``--wait`` (the default, as
    kubectl's), return once each is gone."""
    outcome = Exit.SUCCEEDED
    deleted: list[str] = []
    for name in args.runs:
        try:
            await kube.delete(RUNS, args.namespace, name)
        except NotFound:
            output.problem(f"no InferenceRun {name!r} in namespace {args.namespace!r}")
            outcome = Exit.NOT_FOUND
            continue
        output.line(f'{runview.RESOURCE} "{name}" deleted')
        deleted.append(name)
    if args.wait:
        for name in deleted:
            while True:
                try:
                    await kube.get(RUNS, args.namespace, name)
                except NotFound:
                    break
                await asyncio.sleep(DELETE_POLL_SECONDS)
    return outcome


async def list_runs(kube: KubeClient, args: argparse.Namespace, output: Output) -> Exit:
    namespace = None if args.all_namespaces else args.namespace
    listed = await kube.list(RUNS, namespace)
    items = listed.get("items") or []
    if args.output:
        if items or args.output != "name":
            output.line(runview.render(items, args.output, as_list=True))
        return Exit.SUCCEEDED
    if not items:
        where = "any namespace" if namespace is None else f"namespace {namespace!r}"
        output.note(f"No InferenceRuns in {where}.")
        return Exit.SUCCEEDED
    output.line(
        runview.runs_table(items, now=dt.datetime.now(dt.UTC), all_namespaces=namespace is None)
    )
    return Exit.SUCCEEDED


COMMANDS: dict[str, Callable[[KubeClient, argparse.Namespace, Output], Awaitable[Exit]]] = {
    "submit": submit,
    "watch": watch,
    "logs": logs,
    "rerun": rerun,
    "trigger": trigger,
    "suspend": suspend,
    "resume": resume,
    "delete": delete,
    "list": list_runs,
}


# ----------------------------------------------------------------------- plumbing

EXIT_CODES = (
    "Exit codes: 0 succeeded, 1 failed, 2 bad command line, 3 the run cannot go on (phase "
    "Error), 4 --wait-timeout passed, 5 deleted while followed, 6 not found, 7 no kubeconfig, "
    "8 a kubeconfig that cannot be read, 9 a context not in the kubeconfig."
)


def _connection_flags(parser: argparse.ArgumentParser, *, default: Any) -> None:
    """``--kubeconfig``, ``--context`` and ``-n``: on the plugin and on every command, so they
    go anywhere on the line (a command's copy sets them only when given)."""
    parser.add_argument(
        "--kubeconfig",
        default=default,
        help="kubeconfig file (default: $KUBECONFIG's files merged, else ~/.kube/config)",
    )
    parser.add_argument(
        "--context", default=default, help="kubeconfig context (default: the current one)"
    )
    parser.add_argument(
        "-n", "--namespace", default=default, help="namespace (default: the context's)"
    )


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="kubectl infer",
        description="Submit, follow, re-run, trigger, list and manage InferenceRuns.",
        epilog=EXIT_CODES,
    )
    _connection_flags(top, default=None)
    connection = argparse.ArgumentParser(add_help=False)
    _connection_flags(connection, default=argparse.SUPPRESS)
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=summary, parents=[connection], epilog=EXIT_CODES)

    def following(sub: argparse.ArgumentParser, *, optional: bool) -> None:
        if optional:
            sub.add_argument("-w", "--watch", action="store_true", help="follow it until it ends")
        sub.add_argument("--logs", action="store_true", help="while following, print its log")
        wait_timeout(sub)

    def wait_timeout(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--wait-timeout",
            type=float,
            metavar="SECONDS",
            help="stop waiting after this long (exit 4)",
        )

    def output_format(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "-o", "--output", choices=runview.OUTPUT_FORMATS, help="print the run(s) as kubectl get"
        )

    sub = command("submit", "create a run of a config")
    sub.add_argument("config", help="the InferenceConfig to run")
    sub.add_argument("--config-namespace", help="the config's namespace (default: the run's)")
    sub.add_argument(
        "-p",
        "--parameter",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a run parameter (repeat for more)",
    )
    sub.add_argument("--name", help="the run's name (default: <config>-xxxxx)")
    sub.add_argument("--timeout-seconds", type=int, help="spec.timeoutSeconds")
    sub.add_argument("--parallelism", type=int, help="spec.parallelism (shards)")
    sub.add_argument("--backoff-limit", type=int, help="spec.backoffLimit")
    sub.add_argument("--schedule", help="a cron schedule: a scheduled run instead")
    sub.add_argument(
        "--no-wait-for-config",
        action="store_true",
        help="submit even if the config does not exist yet (the run waits for it)",
    )
    output_format(sub)
    following(sub, optional=True)

    def of_one_run(name: str, summary: str) -> argparse.ArgumentParser:
        sub = command(name, summary)
        sub.add_argument("run")
        return sub

    following(
        of_one_run("watch", "follow a run until it ends; exit code by outcome"), optional=False
    )
    sub = of_one_run("logs", "print the runner's log (a scheduled run: its newest execution's)")
    sub.add_argument(
        "-f", "--follow", action="store_true", help="follow the log until the run ends"
    )
    sub.add_argument(
        "--shard", type=int, metavar="N", help="only shard N's pods (0 to parallelism - 1)"
    )
    sub.add_argument("--prefix", action="store_true", help="start each line with [pod]")
    wait_timeout(sub)
    sub = of_one_run("rerun", "run a finished one-shot run again, as a new run")
    sub.add_argument("--name", help="the new run's name (default: <run>-xxxxx)")
    following(sub, optional=True)
    sub = of_one_run("trigger", "start a scheduled run's execution now")
    sub.add_argument("--force", action="store_true", help="even if the run is suspended")
    following(sub, optional=True)
    of_one_run("suspend", "pause a run: a scheduled one starts nothing, a one-shot one stops")
    of_one_run("resume", "undo suspend")
    sub = command("delete", "delete runs (their Jobs and pods go with them)")
    sub.add_argument("runs", nargs="+", metavar="RUN")
    sub.add_argument(
        "--wait",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="return once they are gone (default)",
    )
    wait_timeout(sub)

    sub = command("list", "runs with their phase and last result")
    sub.add_argument("-A", "--all-namespaces", action="store_true")
    output_format(sub)
    return top


async def connect(args: argparse.Namespace) -> KubeClient:
    """A client for the kubeconfig and context asked for; ``args.namespace`` filled in."""
    found = await kubeconfig.load(kubeconfig=args.kubeconfig, context=args.context)
    if args.namespace is None:
        args.namespace = found.namespace or "default"
    return KubeClient(found.configuration)


async def _main(args: argparse.Namespace, output: Output) -> Exit:
    kube = await connect(args)
    async with kube:
        command = COMMANDS[args.command](kube, args, output)
        timeout = getattr(args, "wait_timeout", None)
        try:
            async with asyncio.timeout(timeout):
                return await command
        except TimeoutError:
            output.problem(f"gave up waiting after {timeout:g}s (--wait-timeout)")
            return Exit.TIMEOUT


def main(argv: Sequence[str] | None = None, output: Output | None = None) -> int:
    args = parser().parse_args(argv)
    output = output or Output()
    try:
        return int(asyncio.run(_main(args, output)))
    except kubeconfig.KubeconfigProblem as exc:
        output.problem(str(exc))
        return int(exc.exit)
    except UsageError as exc:
        output.problem(str(exc))
        return int(Exit.USAGE)
    except TransportError as exc:
        output.problem(f"cannot reach the API server: {exc}")
        return int(Exit.ERROR)
    except ApiError as exc:
        # The API server's own words: a refused run says what is wrong with it.
        output.problem(exc.message or str(exc))
        return int(Exit.NOT_FOUND if isinstance(exc, NotFound) else Exit.ERROR)
    except KeyboardInterrupt:
        return 130


# --------------------------------------------------------------------- completion
#
# kubectl (1.26 and later) completes `kubectl infer ...` by running the executable
# `kubectl_complete-infer` found on PATH with the words after `infer` (the last one
# being completed, maybe empty). It answers as cobra's `__complete` does: one
# candidate a line, then `:DIRECTIVE` (4: no file names; 0: the shell's default).

DIRECTIVE_DEFAULT = 0
DIRECTIVE_NO_FILES = 4


@dataclass
class Completion:
    """What the word being completed can be: fixed ``words``, or names of ``kind`` read from
    the cluster or the kubeconfig; ``connection`` holds the connection flags already given."""

    prefix: str
    words: list[str] = field(default_factory=list)
    kind: str | None = None  # "runs", "configs", "namespaces", "contexts", "files"
    exclude: set[str] = field(default_factory=set)
    connection: dict[str, str] = field(default_factory=dict)

    @property
    def directive(self) -> int:
        return DIRECTIVE_DEFAULT if self.kind == "files" else DIRECTIVE_NO_FILES

    def answer(self, names: Sequence[str]) -> str:
        chosen = [
            n for n in [*self.words, *names] if n.startswith(self.prefix) and n not in self.exclude
        ]
        return "".join(f"{n}\n" for n in chosen) + f":{self.directive}\n"


# The positional argument each command completes: a run's name or a config's.
_POSITIONAL_KIND = {
    "submit": "configs",
    "watch": "runs",
    "logs": "runs",
    "rerun": "runs",
    "trigger": "runs",
    "suspend": "runs",
    "resume": "runs",
    "delete": "runs",
}
_VALUE_KIND = {"--namespace": "namespaces", "--context": "contexts", "--kubeconfig": "files"}


def _options(sub: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in sub._actions for flag in action.option_strings}


def completion_of(words: Sequence[str], top: argparse.ArgumentParser | None = None) -> Completion:
    """What ``kubectl infer WORDS...`` can be completed with (the last word is the partial one)."""
    top = top or parser()
    subs: dict[str, argparse.ArgumentParser] = {}
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            subs = dict(action.choices)
    *done, partial = list(words) or [""]
    command: str | None = None
    options = _options(top)
    connection: dict[str, str] = {}
    positionals: list[str] = []
    pending: argparse.Action | None = None
    for word in done:
        if pending is not None:
            if pending.dest in ("kubeconfig", "context", "namespace"):
                connection[pending.dest] = word
            pending = None
        elif word.startswith("-") and word != "-":
            flag, eq, value = word.partition("=")
            found = options.get(flag)
            if found is not None and found.nargs != 0:
                if eq:
                    if found.dest in ("kubeconfig", "context", "namespace"):
                        connection[found.dest] = value
                else:
                    pending = found
        elif command is None and word in subs:
            command = word
            options = _options(subs[word])
        elif command is not None:
            positionals.append(word)
    if pending is not None:
        flag = max(pending.option_strings, key=len)
        if pending.choices:
            return Completion(partial, [str(c) for c in pending.choices], connection=connection)
        return Completion(partial, kind=_VALUE_KIND.get(flag), connection=connection)
    if partial.startswith("-"):
        flags = sorted(f for f in options if f.startswith("--") or len(f) == 2)
        return Completion(partial, flags, connection=connection)
    if command is None:
        return Completion(partial, list(subs), connection=connection)
    kind = _POSITIONAL_KIND.get(command)
    if kind is None or (positionals and command != "delete"):
        return Completion(partial, connection=connection)
    return Completion(partial, kind=kind, exclude=set(positionals), connection=connection)


async def _names(completion: Completion) -> list[str]:
    """The names of ``completion.kind`` (nothing when they cannot be read)."""
    if completion.kind in (None, "files"):
        return []
    given = completion.connection
    args = argparse.Namespace(
        kubeconfig=given.get("kubeconfig"),
        context=given.get("context"),
        namespace=given.get("namespace"),
    )
    if completion.kind == "contexts":
        args.context = None
    try:
        if completion.kind == "contexts":
            return kubeconfig.context_names(args.kubeconfig)
        kube = await connect(args)
        async with kube:
            resource = {"runs": RUNS, "configs": CONFIGS, "namespaces": NAMESPACES}[completion.kind]
            namespace = None if resource is NAMESPACES else args.namespace
            listed = await kube.list(resource, namespace)
    except (kubeconfig.KubeconfigProblem, ApiError, TransportError):
        return []
    return sorted(str(item["metadata"]["name"]) for item in listed.get("items") or [])


def complete_main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """``kubectl_complete-infer WORD...``: the candidates for the last word, as kubectl asks."""
    words = list(sys.argv[1:] if argv is None else argv)
    completion = completion_of(words)
    names = asyncio.run(_names(completion))
    (out or sys.stdout).write(completion.answer(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
