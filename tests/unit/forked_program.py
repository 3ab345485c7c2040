"""A program for tests/unit/test_forkserver.py to run through the fork server.

``python -m tests.unit.forked_program ACTION`` prints, as one JSON line, what
it was started with (argv, environment, working directory, what its stdin
holds, whether the server imported xml.dom.minidom before the fork), then:
``exit N`` exits N, ``sleep`` sleeps until signalled, ``raise`` raises. An
atexit handler prints ``atexit ran``, as the interpreter runs it at the end of
``python -m``.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time


def main() -> None:
    atexit.register(print, "atexit ran", flush=True)
    print(
        json.dumps(
            {
                "argv": sys.argv[1:],
                "env": dict(os.environ),
                "cwd": os.getcwd(),
                # This program never imports it: the fork server's preload did.
                "preloaded": "xml.dom.minidom" in sys.modules,
                "stdin": sys.stdin.read(),
            }
        ),
        flush=True,
    )
    action = sys.argv[1:]
    if action[:1] == ["exit"]:
        sys.exit(int(action[1]))
    if action[:1] == ["sleep"]:
        time.sleep(600)
    if action[:1] == ["raise"]:
        raise RuntimeError("the program failed")


if __name__ == "__main__":
    main()
