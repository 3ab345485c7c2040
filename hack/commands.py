"""Running a command-line tool (helm, kubectl, ctr, docker) and failing with its output.

One definition, so every tool's failure reads the same: the command, its exit
code, then what it printed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence


def run_tool(
    argv: Sequence[str],
    *,
    shown: str,
    check: bool = True,
    input: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    error: type[Exception] = RuntimeError,
    tail: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with text output captured; with ``check``, a non-zero exit raises ``error``.

    ``shown`` is the command as the error names it (without paths or flags the
    caller added); ``tail`` keeps only the last that many characters of each of
    stdout and stderr in the message, for tools that print a lot.
    """
    done = subprocess.run(
        list(argv), capture_output=True, text=True, input=input, env=env, timeout=timeout
    )
    if check and done.returncode != 0:
        out, err = (
            (done.stdout, done.stderr)
            if tail is None
            else (done.stdout[-tail:], done.stderr[-tail:])
        )
        raise error(f"{shown} failed ({done.returncode}):\n{out}{err}")
    return done
