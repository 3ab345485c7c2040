"""Exit codes and the errors that lead to them: the runner's one place for both.

The controller reads the exit code (and the termination message) of the runner's
pod. 0 and 2-5 are upstream's numbers, so a dashboard or alert written for them
keeps working. Each failed stage has two codes: one for a failure that a later
attempt may not meet again (the Job may retry the pod), one for a failure that
every attempt would meet (the Job should fail at once: a ``podFailurePolicy`` rule
``FailJob`` on :data:`PERMANENT`, here 2, 6, 7, 8 and 9):

===  ======================  =====================  ===============================================
0    ``DONE``                ``Succeeded``          every row predicted and the predictions stored
2    ``BAD_CONTRACT``        ``InvalidContract``    the contract is missing, unreadable or invalid
3    ``INPUT``               ``InputFailed``        the input could not be read: no connection, a
                                                    timeout, 5xx, 429 or 408 after the retries; a
                                                    Secret missing or unusable; TLS
4    ``INFERENCE``           ``InferenceFailed``    the model could not be reached, timed out or
                                                    answered 5xx, 429 or 408 until the retries or
                                                    the deadline ran out; TLS
5    ``OUTPUT``              ``OutputFailed``       the predictions could not be stored, as for 3
                                                    (a write that may have arrived is never resent:
                                                    it fails on its first error)
6    ``INPUT_REJECTED``      ``InputRejected``      the input storage refused the request (a 4xx
                                                    except 408 and 429) or answered what is not
                                                    rows: an error text with a 200 (a missing
                                                    table), not JSON, a ragged table
7    ``INFERENCE_REJECTED``  ``InferenceRejected``  the model refused the request (a 4xx except 408
                                                    and 429: bad request, no such model, 422), the
                                                    rows contradict its declared shape, or its 2xx
                                                    is not an answer
8    ``OUTPUT_REJECTED``     ``OutputRejected``     the output storage refused the write (a 4xx
                                                    except 408 and 429) or answered it with an
                                                    error text
9    ``MODEL_AUTH``          ``ModelAuthFailed``    the model refused the runner's credentials
                                                    (401 or 403): a missing or wrong bearer token
143  ``TERMINATED``          ``RunnerTerminated``   stopped by SIGTERM (e.g.
                                                    ``activeDeadlineSeconds``), as a shell would
                                                    report it; the message says when
===  ======================  =====================  ===============================================

The termination message starts with the stage (``input``, ``inference``,
``output``, ``contract``, ``terminated``), whichever of the stage's two codes it
ends with: the code says whether retrying can help, the message what failed.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    DONE = 0
    BAD_CONTRACT = 2
    INPUT = 3
    INFERENCE = 4
    OUTPUT = 5
    INPUT_REJECTED = 6
    INFERENCE_REJECTED = 7
    OUTPUT_REJECTED = 8
    MODEL_AUTH = 9
    TERMINATED = 143


# The codes of failures that no later attempt can get past: a Job should not retry them.
PERMANENT: frozenset[ExitCode] = frozenset(
    {
        ExitCode.BAD_CONTRACT,
        ExitCode.INPUT_REJECTED,
        ExitCode.INFERENCE_REJECTED,
        ExitCode.OUTPUT_REJECTED,
        ExitCode.MODEL_AUTH,
    }
)

# The reason each code stands for (the table above), for whoever reports a run.
REASONS: dict[ExitCode, str] = {
    ExitCode.DONE: "Succeeded",
    ExitCode.BAD_CONTRACT: "InvalidContract",
    ExitCode.INPUT: "InputFailed",
    ExitCode.INFERENCE: "InferenceFailed",
    ExitCode.OUTPUT: "OutputFailed",
    ExitCode.INPUT_REJECTED: "InputRejected",
    ExitCode.INFERENCE_REJECTED: "InferenceRejected",
    ExitCode.OUTPUT_REJECTED: "OutputRejected",
    ExitCode.MODEL_AUTH: "ModelAuthFailed",
    ExitCode.TERMINATED: "RunnerTerminated",
}


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

    @property
    def permanent(self) -> bool:
        return self.exit_code in PERMANENT


class ContractError(RunnerError):
    exit_code = ExitCode.BAD_CONTRACT
    stage = "contract"


class InputError(RunnerError):
    """The input could not be read this time; another attempt may succeed."""

    exit_code = ExitCode.INPUT
    stage = "input"


class InputRejected(InputError):
    """The input storage refused the request or answered something that is not rows."""

    exit_code = ExitCode.INPUT_REJECTED


class InferenceError(RunnerError):
    """The model could not be reached or kept failing; another attempt may succeed."""

    exit_code = ExitCode.INFERENCE
    stage = "inference"


class InferenceRejected(InferenceError):
    """The model refused the request, or the rows cannot be what it takes."""

    exit_code = ExitCode.INFERENCE_REJECTED


class ModelAuthFailed(InferenceRejected):
    """The model refused the runner's credentials (401, 403): the token is missing or wrong."""

    exit_code = ExitCode.MODEL_AUTH


class OutputError(RunnerError):
    """The predictions could not be stored this time; another attempt may succeed."""

    exit_code = ExitCode.OUTPUT
    stage = "output"


class OutputRejected(OutputError):
    """The output storage refused the write."""

    exit_code = ExitCode.OUTPUT_REJECTED


# A stage's error for what nobody foresaw (a bug, most likely): retryable, as a
# bug may depend on timing; a permanent one would hide it behind one attempt.
STAGE_ERRORS: dict[str, type[RunnerError]] = {
    cls.stage: cls for cls in (ContractError, InputError, InferenceError, OutputError)
}
