"""How a failure below becomes a stage's failure, and how a run or a check ends with one.

The storage providers raise :class:`~runner.storage.base.StorageError` and
:class:`~runner.storage.base.StorageRejected`; the model client
:class:`~runner.inference.ModelRefused`, and the retries
:class:`~runner.retry.GaveUp`. Each stage of ``python -m runner`` and of
``python -m runner --check`` turns them into its own
:class:`~contract.exitcodes.RunnerError` (hence its exit code) the same way:
:func:`storage_failures` and :func:`model_failures`. :func:`failed` writes the
termination message of a command that ended with an error and says its exit code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from contract.exitcodes import (
    STAGE_ERRORS,
    ExitCode,
    InferenceError,
    InferenceRejected,
    InputError,
    InputRejected,
    ModelAuthFailed,
    OutputError,
    OutputRejected,
    RunnerError,
)
from runner import termination
from runner.inference import ModelRefused
from runner.retry import GaveUp
from runner.storage.base import Role, StorageError, StorageRejected
from runner.transport import AUTH_REFUSALS

# A storage role's errors: (another attempt may succeed, none can).
STORAGE_ERRORS: dict[Role, tuple[type[RunnerError], type[RunnerError]]] = {
    "input": (InputError, InputRejected),
    "output": (OutputError, OutputRejected),
}


@contextmanager
def storage_failures(role: Role) -> Iterator[None]:
    """A storage failure inside, as the ``role``'s error: exit 6/8 when rejected, else 3/5."""
    transient, rejected = STORAGE_ERRORS[role]
    try:
        yield
    except StorageRejected as error:
        raise rejected(error.message) from None
    except StorageError as error:
        raise transient(error.message) from None


@contextmanager
def model_failures() -> Iterator[None]:
    """A model call's failure inside, as the inference stage's: 7 when refused for good, else 4."""
    try:
        yield
    except ModelRefused as error:
        if error.status in AUTH_REFUSALS:
            raise ModelAuthFailed(
                f"the model refused access (see kserve.auth): {error.message}"
            ) from None
        raise (InferenceRejected if error.permanent else InferenceError)(error.message) from None
    except GaveUp as error:
        raise InferenceError(error.message) from None


def failed(
    log: Any, path: Path, command: str, error: BaseException, stage: str, stopped: str
) -> int:
    """Report ``command`` ending with ``error`` during ``stage``; its exit code.

    A stage error says its own stage and code; a cancellation (SIGTERM) is
    ``terminated`` with the reason ``stopped``; anything else is a bug, logged
    with its traceback, and exits with ``stage``'s retryable code. Called from the
    ``except`` clause that caught ``error``, so the traceback is the current one.
    """
    if isinstance(error, RunnerError):
        return termination.report_failure(
            log, path, command, error.stage, error.message, error.exit_code
        )
    if isinstance(error, asyncio.CancelledError):
        return termination.report_failure(
            log, path, command, "terminated", stopped, ExitCode.TERMINATED
        )
    log.exception("unexpected error", stage=stage)
    failure = STAGE_ERRORS[stage]
    reason = f"unexpected {type(error).__name__}: {error}"
    return termination.report_failure(log, path, command, failure.stage, reason, failure.exit_code)
