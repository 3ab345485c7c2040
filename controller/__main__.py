"""``python -m controller``: start the controller (the loop arrives with the controller issue)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m controller",
        description="KServe Inference Controller: runs InferenceRuns as Kubernetes Jobs.",
    )
    parser.parse_args(argv)
    print("the controller loop is not implemented yet", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
