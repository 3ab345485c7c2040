"""``kubectl infer``: submit, follow, re-run, trigger and list InferenceRuns.

A kubectl plugin (the ``kubectl-infer`` console script; kubectl finds it on
``PATH``), in the spirit of ``argo submit --watch``::

    kubectl infer submit iris-inference-config -p input_table_name=t --watch --logs
    kubectl infer watch my-run --logs      # follow until it ends; exit code by outcome
    kubectl infer rerun my-run --watch     # a new run with the same spec
    kubectl infer trigger iris-hourly -w   # a scheduled run, now (a Job from its CronJob)
    kubectl infer list -A                  # runs with their last result

Following prints the run's phase and progress as they change, its Events,
and with ``--logs`` the runner's log lines, and exits with the outcome:
0 succeeded, 1 failed, 3 the run cannot go on (phase Error: invalid spec,
missing config, refused by the API server), 4 ``--wait-timeout`` passed,
5 the run was deleted, 6 no such run (or the wrong kind of run); 2 is a bad
command line. Everything it builds or prints comes from :mod:`controller.runview`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import secrets
import string
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TextIO

from kubernetes_asyncio.config import kube_config

from controller import runview
from controller.kube.client import KubeClient
from controller.kube.errors import ApiError, NotFound, TransportError
from controller.kube.resources import CRONJOBS, EVENTS, JOBS, PODS, Resource
from controller.naming import run_selector
from controller.reconcile import RUNS
from controller.render import CONTAINER_NAME
from controller.runview import Exit, UsageError

Obj = dict[str, Any]
WATCH_SECONDS = 300
# How long a finished run's log followers may take to print what is left.
LOG_DRAIN_SECONDS = 5.0


class Output:
    """Where the plugin writes: lines to stdout, problems to stderr."""

    def __init__(self, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> None:
        self.out = out
        self.err = err

    def line(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def problem(self, text: str) -> None:
        print(f"error: {text}", file=self.err, flush=True)


# ---------------------------------------------------------------------- following


class Follower:
    """Follows one run (and, for a scheduled run, one of its Jobs) until it ends."""

    def __init__(self, kube: KubeClient, namespace: str, output: Output, *, logs: bool) -> None:
        self.kube = kube
        self.namespace = namespace
        self.output = output
        self.logs = logs
        self._followed_pods: set[str] = set()
        self._log_tasks: list[asyncio.Task[None]] = []
        self._seen_events: set[tuple[Any, Any]] = set()

    @classmethod
    def of(cls, kube: KubeClient, args: argparse.Namespace, output: Output) -> Follower:
        """The follower a command's ``--namespace`` and ``--logs`` ask for."""
        return cls(kube, args.namespace, output, logs=args.logs)

    async def run(self, name: str) -> Exit:
        """Follow a one-shot run to its end (a scheduled run: its next or current execution)."""
        run = await get_run(self.kube, self.namespace, name, self.output)
        if run is None:
            return Exit.NOT_FOUND
        if runview.is_scheduled(run):
            return await self._scheduled(run)
        return await self._with_side_streams(run, self._follow_run(run))

    async def job(self, run: Obj, job_name: str) -> Exit:
        """Follow one Job of a scheduled run (``trigger --watch``) to its end."""
        return await self._with_side_streams(run, self._follow_job(job_name), job_name=job_name)

    async def _scheduled(self, run: Obj) -> Exit:
        meta = run["metadata"]
        self.output.line(f"{meta['name']}: {runview.status_line(run)}")
        jobs = await self._jobs_of(run)
        current = runview.newest_job([j for j in jobs if runview.job_outcome(j) is None])
        if current is None:
            known = {j["metadata"]["name"] for j in jobs}
            self.output.line(f"{meta['name']}: waiting for its next execution")
            name = await self._next_job(run, known)
        else:
            name = current["metadata"]["name"]
        return await self.job(run, name)

    async def _with_side_streams(
        self, run: Obj, main: Awaitable[Exit], *, job_name: str | None = None
    ) -> Exit:
        side = [asyncio.create_task(self._events(run))]
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
        self.output.line(f"{name}: {last}")

        def seen(current: Obj) -> Exit | None:
            nonlocal last
            line = runview.status_line(current)
            if line != last:
                self.output.line(f"{name}: {line}")
                last = line
            outcome = runview.run_outcome(current)
            if outcome is not None:
                self.output.line(f"{name}: {runview.result_line(current)}")
            return outcome

        return await self._follow(RUNS, "InferenceRun", run, seen)

    async def _follow_job(self, job_name: str) -> Exit:
        try:
            job = await self.kube.get(JOBS, self.namespace, job_name)
        except NotFound:
            self.output.problem(f"Job {job_name!r} is gone")
            return Exit.DELETED
        self.output.line(f"following Job {job_name}")

        def seen(current: Obj) -> Exit | None:
            outcome = runview.job_outcome(current)
            if outcome is not None:
                word = "succeeded" if outcome is Exit.SUCCEEDED else "failed"
                self.output.line(f"Job {job_name}: {word}")
            return outcome

        return await self._follow(JOBS, "Job", job, seen)

    async def _follow(
        self, resource: Resource, kind: str, obj: Obj, seen: Callable[[Obj], Exit | None]
    ) -> Exit:
        """Hand ``obj`` and each later version of it to ``seen`` until it returns an outcome;
        :attr:`Exit.DELETED` once the object is gone."""
        name = obj["metadata"]["name"]
        async for current in self._watch_one(resource, name, obj):
            if current is None:
                self.output.problem(f"{kind} {name!r} was deleted")
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
        selector = run_selector(run["metadata"]["uid"])
        if job_name is not None:
            selector += f",job-name={job_name}"
        async for pod in self._present_and_later(PODS, label_selector=selector):
            self._maybe_follow_pod(pod)

    def _maybe_follow_pod(self, pod: Obj) -> None:
        name = pod["metadata"]["name"]
        if name in self._followed_pods or not _container_started(pod):
            return
        self._followed_pods.add(name)
        self._log_tasks.append(asyncio.create_task(self._log(name)))

    async def _log(self, pod: str) -> None:
        try:
            async for line in self.kube.follow_pod_log(
                self.namespace, pod, container=CONTAINER_NAME
            ):
                self.output.line(f"[{pod}] {line}")
        except (ApiError, TransportError) as exc:
            self.output.problem(f"cannot read the log of pod {pod}: {exc}")

    async def _jobs_of(self, run: Obj) -> list[Obj]:
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


def _container_started(pod: Obj) -> bool:
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
    """Create the run ``body`` and say so; with ``--watch``, follow it to its end."""
    created = await kube.create(RUNS, args.namespace, body)
    name = created["metadata"]["name"]
    output.line(f"inferencerun.ai.krateo.io/{name} created{note}")
    if not args.watch:
        return Exit.SUCCEEDED
    return await Follower.of(kube, args, output).run(name)


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
    return await _create_run(kube, args, output, body)


async def watch(kube: KubeClient, args: argparse.Namespace, output: Output) -> Exit:
    return await Follower.of(kube, args, output).run(args.run)


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


async def list_runs(kube: KubeClient, args: argparse.Namespace, output: Output) -> Exit:
    namespace = None if args.all_namespaces else args.namespace
    listed = await kube.list(RUNS, namespace)
    items = listed.get("items") or []
    if not items:
        where = "any namespace" if namespace is None else f"namespace {namespace!r}"
        output.line(f"No InferenceRuns in {where}.")
        return Exit.SUCCEEDED
    output.line(
        runview.runs_table(items, now=dt.datetime.now(dt.UTC), all_namespaces=namespace is None)
    )
    return Exit.SUCCEEDED


COMMANDS: dict[str, Callable[[KubeClient, argparse.Namespace, Output], Awaitable[Exit]]] = {
    "submit": submit,
    "watch": watch,
    "rerun": rerun,
    "trigger": trigger,
    "list": list_runs,
}


# ----------------------------------------------------------------------- plumbing


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="kubectl infer",
        description="Submit, follow, re-run, trigger and list InferenceRuns.",
        epilog="Exit codes: 0 succeeded, 1 failed, 2 bad command line, 3 the run cannot go "
        "on (phase Error), 4 --wait-timeout passed, 5 deleted while followed, 6 not found.",
    )
    top.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    top.add_argument("--context", help="kubeconfig context (default: the current one)")
    top.add_argument("-n", "--namespace", help="namespace (default: the context's)")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def following(sub: argparse.ArgumentParser, *, optional: bool) -> None:
        if optional:
            sub.add_argument("-w", "--watch", action="store_true", help="follow it until it ends")
        sub.add_argument("--logs", action="store_true", help="while following, print its log")
        sub.add_argument(
            "--wait-timeout",
            type=float,
            metavar="SECONDS",
            help="stop following after this long (exit 4)",
        )

    sub = commands.add_parser("submit", help="create a run of a config")
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
    following(sub, optional=True)

    def of_one_run(command: str, summary: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(command, help=summary)
        sub.add_argument("run")
        return sub

    following(
        of_one_run("watch", "follow a run until it ends; exit code by outcome"), optional=False
    )
    sub = of_one_run("rerun", "run a finished one-shot run again, as a new run")
    sub.add_argument("--name", help="the new run's name (default: <run>-xxxxx)")
    following(sub, optional=True)
    following(of_one_run("trigger", "start a scheduled run's execution now"), optional=True)

    sub = commands.add_parser("list", help="runs with their phase and last result")
    sub.add_argument("-A", "--all-namespaces", action="store_true")
    return top


def kubeconfig_path(explicit: str | None) -> str | None:
    """The kubeconfig to read: ``--kubeconfig``, else the first of ``$KUBECONFIG``."""
    if explicit:
        return explicit
    from_env = os.environ.get("KUBECONFIG", "")
    first = next((p for p in from_env.split(os.pathsep) if p), None)
    return first


def default_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace of the kubeconfig context in use, as kubectl picks it ("default" if none)."""
    with contextlib.suppress(Exception):  # no kubeconfig: in a pod, or kubectl's own default
        contexts, current = kube_config.list_kube_config_contexts(kubeconfig)
        chosen = next((c for c in contexts if c.get("name") == context), None) if context else None
        entry = chosen or current or {}
        namespace = (entry.get("context") or {}).get("namespace")
        if namespace:
            return str(namespace)
    return "default"


async def _main(args: argparse.Namespace, output: Output) -> Exit:
    kubeconfig = kubeconfig_path(args.kubeconfig)
    if args.namespace is None:
        args.namespace = default_namespace(kubeconfig, args.context)
    kube = await KubeClient.connect(kubeconfig=kubeconfig, context=args.context)
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


if __name__ == "__main__":
    sys.exit(main())
