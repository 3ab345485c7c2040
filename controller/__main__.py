"""``python -m controller``: run the KServe Inference Controller.

Settings come from flags and the environment (``--help`` lists them); a bad
setting exits 2 with a message naming it, and so does a kubeconfig that is
missing or unusable (one line naming the file, what is wrong and what to do).
``--version`` prints the version and exits 0. SIGTERM/SIGINT shut down
gracefully: workers stop, the Lease is released, watches close. Losing the
Lease exits 1 so that the pod restarts as a clean standby.

``python -m controller check [FLAGS]`` runs :mod:`controller.selfcheck` instead
(the chart's ``helm test``): the same settings and credentials, one
``ok:``/``FAIL:``/``skip:`` line per check on stdout, exit 0 when nothing
failed and 1 otherwise; a bad setting or kubeconfig is a ``FAIL:`` line too.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import os
import signal
import sys
from typing import Any

import structlog

from controller import selfcheck
from controller.controller import Controller
from controller.logging import configure_logging
from controller.metrics import Metrics
from controller.settings import Settings, SettingsError, load_settings
from kubeclient.client import KubeClient
from kubeclient.leaderelection import LeadershipLost
from kubeclient.transport import ConfigurationError

log = structlog.stdlib.get_logger("controller")

PROG = "kserve-inference-controller"
# What --version says when the package is not installed (a bare source tree).
FALLBACK_VERSION = "0.1.0"
DEFAULT_KUBECONFIG = "~/.kube/config"
_SECTIONS = ("clusters", "contexts", "users")


def version() -> str:
    try:
        return importlib.metadata.version("kserve-inference-controller")
    except importlib.metadata.PackageNotFoundError:
        return FALLBACK_VERSION


class KubeconfigError(Exception):
    """No usable cluster configuration: the message names the file, what is wrong, what to do."""


def check_kubeconfig(paths: str) -> None:
    """Raise :class:`KubeconfigError` unless ``paths`` leads to a usable context.

    ``paths`` is one file or a ``KUBECONFIG`` list. It is read the way
    kubernetes_asyncio will read it (files that exist, merged in order, the
    first entry of a name wins, the last ``current-context`` wins), so that
    what its loader would report as "Expected key current-context", crash on
    (an empty file, YAML that is not a mapping) or silently accept (a context
    naming a user that is not there) is said in the kubeconfig's own terms.
    """
    files = [os.path.expanduser(path) for path in paths.split(os.pathsep) if path]
    present = [path for path in files if os.path.exists(path)]
    if not present:
        missing = "file does not exist" if len(files) <= 1 else "none of its files exists"
        raise KubeconfigError(
            f"kubeconfig {paths}: {missing}; "
            "point KUBECONFIG or --kubeconfig at an existing kubeconfig"
        )
    entries: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {s: {} for s in _SECTIONS}
    current: tuple[str, object] | None = None
    for path in present:
        config = _read_kubeconfig(path)
        for section in _SECTIONS:
            listed = config.get(section) or []
            if not isinstance(listed, list) or not all(
                isinstance(entry, dict) and "name" in entry for entry in listed
            ):
                raise KubeconfigError(
                    f"kubeconfig {path}: {section} is not a list of entries with a name; "
                    "fix the file or pass --kubeconfig"
                )
            for entry in listed:
                entries[section].setdefault(str(entry["name"]), (path, entry))
        if "current-context" in config:
            current = (path, config["current-context"])

    def choices(section: str) -> str:
        return f"{section}: {', '.join(sorted(entries[section])) or 'none'}"

    def must_be_listed(section: str, what: str, value: object, command: str) -> None:
        """The context's ``what`` (its cluster, its user) is an entry of ``section``."""
        if str(value) not in entries[section]:
            raise KubeconfigError(
                f"kubeconfig {where}: context {name!r} names {what} {value!r}, which is not "
                f"in the kubeconfig ({choices(section)}); add it with "
                f"`kubectl config {command}` or fix the context"
            )

    where, name = current if current is not None else (paths, None)
    if not name:
        raise KubeconfigError(
            f"kubeconfig {where}: no current-context; set one with "
            f"`kubectl config use-context NAME` ({choices('contexts')}) or pass --kubeconfig"
        )
    if str(name) not in entries["contexts"]:
        raise KubeconfigError(
            f"kubeconfig {where}: current-context {name!r} is not one of its contexts "
            f"({choices('contexts')}); pick one with `kubectl config use-context NAME` "
            "or pass --kubeconfig"
        )
    where, entry = entries["contexts"][str(name)]
    context = entry.get("context")
    context = context if isinstance(context, dict) else {}
    cluster = context.get("cluster")
    if not cluster:
        raise KubeconfigError(
            f"kubeconfig {where}: context {name!r} names no cluster; set one with "
            f"`kubectl config set-context {name} --cluster NAME` or pass --kubeconfig"
        )
    must_be_listed("clusters", "cluster", cluster, "set-cluster")
    user = context.get("user")
    if user:
        must_be_listed("users", "user", user, "set-credentials")
    where, entry = entries["clusters"][str(cluster)]
    server = entry.get("cluster")
    if not isinstance(server, dict) or not server.get("server"):
        raise KubeconfigError(
            f"kubeconfig {where}: cluster {cluster!r} has no server; set one with "
            f"`kubectl config set-cluster {cluster} --server URL` or pass --kubeconfig"
        )


def _read_kubeconfig(path: str) -> dict[str, Any]:
    # Imported here: a controller in a pod reads no kubeconfig and need not hold it.
    import yaml

    fix = "fix it or point KUBECONFIG or --kubeconfig at another file"
    try:
        with open(path, "rb") as file:
            config = yaml.safe_load(file)
    except OSError as exc:
        raise KubeconfigError(
            f"kubeconfig {path}: cannot read it ({exc.strerror}); {fix}"
        ) from None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or getattr(exc, "reason", None) or "unreadable"
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise KubeconfigError(f"kubeconfig {path}: not valid YAML ({problem}{at}); {fix}") from None
    if config is None:
        raise KubeconfigError(
            f"kubeconfig {path}: the file is empty; write a kubeconfig there "
            "(`kubectl config view --flatten`) or point KUBECONFIG or --kubeconfig elsewhere"
        )
    if not isinstance(config, dict):
        raise KubeconfigError(
            f"kubeconfig {path}: not a kubeconfig (YAML {type(config).__name__}, "
            f"not a mapping of clusters, contexts and users); {fix}"
        )
    return config


def usable_kubeconfig(settings: Settings) -> str | None:
    """The kubeconfig to load (None: in-cluster), checked by :func:`check_kubeconfig`.

    ``--kubeconfig``/``KUBECONFIG``, else ``~/.kube/config``; no KUBECONFIG
    and no such file outside a pod is a :class:`KubeconfigError` too.
    """
    if settings.in_cluster:
        return None
    kubeconfig = settings.kubeconfig
    if kubeconfig is None:
        kubeconfig = os.path.expanduser(DEFAULT_KUBECONFIG)
        if not os.path.exists(kubeconfig):
            raise KubeconfigError(
                f"no kubeconfig: {kubeconfig} does not exist and this is not a pod "
                "(KUBERNETES_SERVICE_HOST is unset); set KUBECONFIG or pass --kubeconfig"
            )
    check_kubeconfig(kubeconfig)
    return kubeconfig


async def connect(settings: Settings, kubeconfig: str | None, metrics: Metrics) -> KubeClient:
    """The API client, or :class:`KubeconfigError` when the configuration is unusable.

    Only configuration errors become that error (a kubeconfig or a pod
    service account that cannot be used, a file that cannot be opened, bad
    TLS material); anything else
    is a bug and propagates.
    """
    if kubeconfig is None:
        where = "in-cluster configuration (KUBERNETES_SERVICE_HOST is set)"
        fix = "check the pod's service account token mount, or pass --kubeconfig"
    else:
        where = f"kubeconfig {kubeconfig}"
        fix = "fix it or pass --kubeconfig"
    try:
        return await KubeClient.connect(
            kubeconfig=kubeconfig,
            in_cluster=kubeconfig is None,
            qps=settings.kube_api_qps,
            burst=settings.kube_api_burst,
            metrics=metrics,
            keepalive=settings.watch_idle_timeout,
        )
    except (ConfigurationError, OSError) as exc:
        raise KubeconfigError(f"{where}: {str(exc).rstrip('.')}; {fix}") from None


async def run(settings: Settings, kubeconfig: str | None) -> int:
    shard = settings.shard
    metrics = Metrics(shard=shard.label)
    client = await connect(settings, kubeconfig, metrics)
    controller = Controller(settings, client, metrics)
    main = asyncio.create_task(controller.run(), name="controller")
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, main.cancel)
    log.info(
        "starting",
        namespaces=list(settings.watch_namespaces) or "all",
        workers=settings.workers,
        polling_interval=settings.polling_interval,
        leader_election=settings.leader_election,
        lease=settings.effective_lease_name,
        shards=shard.count,
    )
    try:
        await main
    except asyncio.CancelledError:
        log.info("stopped")
        return 0
    except BaseExceptionGroup as group:
        lost = group.subgroup(LeadershipLost)
        if lost is None:
            raise
        log.error("leadership lost", error=str(lost.exceptions[0]))
        return 1
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    return 0


CHECK_HELP = f"""usage: python -m controller check [SETTINGS FLAGS]

Checks that this installation can work, with the controller's own settings and
credentials: the API server answers and accepts them; the InferenceConfig and
InferenceRun CRDs are served and can be listed where the controller watches;
with leader election on, a live leader holds the Lease. One ok:/FAIL:/skip:
line per check; exit 0 when nothing failed, 1 otherwise.

The settings flags and environment variables are those of the controller
(`python -m controller --help`). The {PROG} chart runs this as its `helm test` hook."""


async def run_check(settings: Settings, kubeconfig: str | None) -> list[selfcheck.Result]:
    try:
        client = await connect(settings, kubeconfig, Metrics(process=False))
    except KubeconfigError as exc:
        return [selfcheck.fail(selfcheck.one_line(str(exc)))]
    client.request_timeout = selfcheck.REQUEST_TIMEOUT
    async with client:
        return await selfcheck.run_checks(client, settings)


def check(args: list[str]) -> int:
    """``python -m controller check``: print one line per check; 0 when none failed, else 1."""
    if "-h" in args or "--help" in args:
        print(CHECK_HELP)
        return 0
    try:
        settings = load_settings(args)
    except SettingsError as exc:
        print(selfcheck.fail(f"settings: {selfcheck.one_line(str(exc))}").line, flush=True)
        return 1
    # Only warnings and errors: stdout is for the check lines.
    configure_logging("WARNING", settings.log_format)
    try:
        kubeconfig = usable_kubeconfig(settings)
    except KubeconfigError as exc:
        print(selfcheck.fail(selfcheck.one_line(str(exc))).line, flush=True)
        return 1
    results = asyncio.run(run_check(settings, kubeconfig))
    for result in results:
        print(result.line, flush=True)
    return selfcheck.exit_code(results)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["check"]:
        return check(args[1:])
    if "--version" in args:
        print(f"{PROG} {version()}")
        return 0
    try:
        settings = load_settings(args)
    except SettingsError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    shard = settings.shard
    if shard.sharded:
        # Every log line says which shard wrote it (the tasks inherit the context).
        structlog.contextvars.bind_contextvars(shard=shard.label)
    try:
        kubeconfig = usable_kubeconfig(settings)
        return asyncio.run(run(settings, kubeconfig))
    except KubeconfigError as exc:
        print(f"{PROG}: {str(exc).replace(chr(10), ' ')}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
