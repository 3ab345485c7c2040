"""``python -m runner``: execute one contract (the real runner arrives with the runner issue)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runner",
        description="Reads the contract, fetches the input, calls the model, stores predictions.",
    )
    parser.parse_args(argv)
    print("the runner is not implemented yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
