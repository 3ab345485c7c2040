"""``python -m runner``: execute the contract of this pod (see :mod:`runner.app`)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.metadata
import os
import signal
import sys

from contract.exitcodes import ExitCode
from runner import app, check, logs

EPILOG = """\
exit codes: 0 done, 2 bad contract, 3 input, 4 inference, 5 output (another attempt
may succeed), 6 input rejected, 7 inference rejected, 8 output rejected (the other
side refused: a 4xx other than 408/429, or an answer that is not what it should be;
no attempt can succeed), 143 SIGTERM.
The termination message (TERMINATION_LOG_PATH, default /dev/termination-log) holds
{"rows", "predictions", "durationSeconds"} on success (a streaming run, one whose
input entry has paging, adds "resumedRows", "pages", "chunks", "duplicates"), a
one-line reason otherwise.
Progress: JSON lines {"event": "progress", "rowsDone", "rowsTotal"} on stdout.
Environment: CONTRACT_PATH, TERMINATION_LOG_PATH, NODE_AGENT_ROOT, pod_uid,
POD_NAMESPACE, JOB_COMPLETION_INDEX, RUNNER_DEADLINE_SECONDS, LOG_LEVEL,
KUBECONFIG (outside a cluster).
--check: probe the contract's Secrets, storages and model metadata, moving no data
(runner/check.py); exit codes as above, {"check": "ok", "model", "inputs"} on success.
"""
# What --version says when the package is not installed (a bare source tree).
FALLBACK_VERSION = "0.1.0"


def version() -> str:
    try:
        return importlib.metadata.version("kserve-inference-controller")
    except importlib.metadata.PackageNotFoundError:
        return FALLBACK_VERSION


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runner",
        description=(
            "Reads the contract (/tmp/contract.json or $CONTRACT_PATH), fetches the input, "
            "calls the model over the Open Inference Protocol and stores the predictions."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"kserve-inference-runner {version()}"
    )
    parser.add_argument("--contract", help="contract file (overrides CONTRACT_PATH)")
    parser.add_argument(
        "--termination-log", help="termination message file (overrides TERMINATION_LOG_PATH)"
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("LOG_LEVEL", "info"),
        help="debug, info, warning or error (default: $LOG_LEVEL or info)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="probe Secrets, storages and the model's metadata; send and store no data",
    )
    args = parser.parse_args(argv)
    try:
        logs.configure(args.log_level)
    except ValueError as error:
        parser.error(str(error))
    environ = dict(os.environ)
    if args.contract:
        environ["CONTRACT_PATH"] = args.contract
    if args.termination_log:
        environ["TERMINATION_LOG_PATH"] = args.termination_log
    # Everything alive now (modules, classes, settings) lives as long as the process:
    # out of the collector's way, so its passes walk only what the run allocates.
    gc.freeze()
    return asyncio.run(_run_until_sigterm(environ, probe_only=args.check))


async def _run_until_sigterm(environ: dict[str, str], probe_only: bool = False) -> int:
    # SIGTERM (activeDeadlineSeconds, pod deletion) cancels the run, which then
    # still writes a termination message saying where it was stopped.
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await (check.run(environ) if probe_only else app.run(environ))
    except asyncio.CancelledError:
        return int(ExitCode.TERMINATED)
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(main())
