"""Exit codes and the errors that lead to them: the runner's one place for both.

The controller reads the exit code (and the termination message) of the runner's
pod; upstream's runners use the same numbers, so a dashboard or alert written
for them keeps working:

==  ================  ==========================================================
0   ``DONE``          every row predicted and the predictions stored
2   ``BAD_CONTRACT``  the contract is missing, unreadable or invalid
3   ``INPUT``         the input storage could not be read (or answered nonsense)
4   ``INFERENCE``     the model refused a request or retries ran out
5   ``OUTPUT``        the predictions could not be stored
143 ``TERMINATED``    stopped by SIGTERM (e.g. ``activeDeadlineSeconds``), as a
                      shell would report it; the termination message says when
==  ================  ==========================================================
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    DONE = 0
    BAD_CONTRACT = 2
    INPUT = 3
    INFERENCE = 4
    OUTPUT = 5
    TERMINATED = 143


class RunnerError(Exception):
    """A failure of one stage of the run; its message becomes the termination message.

    Messages are written for the person reading ``kubectl get infrun``: what failed,
    against what, and the other side's own words (trimmed). They never contain a
    credential (see :mod:`runner.redact`).
    """

    exit_code: ExitCode = ExitCode.BAD_CONTRACT
    stage = "contract"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ContractError(RunnerError):
    exit_code = ExitCode.BAD_CONTRACT
    stage = "contract"


class InputError(RunnerError):
    exit_code = ExitCode.INPUT
    stage = "input"


class InferenceError(RunnerError):
    exit_code = ExitCode.INFERENCE
    stage = "inference"


class OutputError(RunnerError):
    exit_code = ExitCode.OUTPUT
    stage = "output"


STAGE_ERRORS: dict[str, type[RunnerError]] = {
    cls.stage: cls for cls in (ContractError, InputError, InferenceError, OutputError)
}
