"""The pinned tools the suite and the demo run, built two at a time (cached after).

Each tool has its build script, ``hack/<tool>/build.sh`` (see hack/gobuild.sh):
it reuses ``~/.cache/kserve-controller/<tool>/<version>-<key>`` when that
exists, and otherwise builds there while holding that directory's lock, so a
test that asks for a tool being built waits for it instead of building it
again. The real-node tier's pieces (kubelet, containerd's packages, the base
image) come from ``python -m hack.realnode prepare``.

Cold, the control plane's build (kubernetes and etcd from their modules) is
about half of all the compiling; built one after another, the tools took
20 minutes on 2 cores, with one core idle through every download and link.
Here the control plane has a lane of its own (then kubelet, which compiles
mostly the same kubernetes packages and so reuses them from Go's build cache),
and the smaller tools are built one by one in a second lane beside it.

:class:`Builds` starts both lanes in the background and lets a caller wait
for the tools it needs: ``hack/suite.py`` starts the unit tests once helm is
there, the control plane's tests once every tool is.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The tools `make binaries` builds, each by hack/<name>/build.sh.
TOOLS = ("controlplane", "helm", "helm-docs", "kstatus", "promtool", "versitygw", "kwok")
# The real-node tier's pieces (hack.realnode prepare), built only when asked.
NODE = "node"
# The real-node tier's two images, built once into an empty layer cache
# (hack.realnode images --if-cold). A cold cache makes the images' dependency
# layers from scratch, 2-3 minutes that the tier would otherwise spend after
# the parallel run, beside a fault run that finishes without it. Built here,
# they go while the parallel run does; the tier's own build then reuses every
# layer (6 s). Warm, this only looks and stops.
NODE_IMAGES = "node-images"
# Everything a lane can build: what the suite builds.
ALL = (*TOOLS, NODE, NODE_IMAGES)
# Each lane builds its tools one after the other; the lanes run at the same time.
# The second lane's order is the order the suite needs them in (helm for the unit run).
LANES: tuple[tuple[str, ...], ...] = (
    ("controlplane", NODE, NODE_IMAGES),
    ("helm", "helm-docs", "kstatus", "promtool", "versitygw", "kwok"),
)
LOG_TAIL = 60  # lines of a failed build's log printed


@dataclass(frozen=True)
class Built:
    name: str
    returncode: int
    seconds: float
    log: Path

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def summary(self) -> str:
        said = self.log.read_text(errors="replace").strip().splitlines()
        last = said[-1] if said else ""
        if self.ok:
            return f"{self.name}: {last} ({self.seconds:.0f} s)"
        return f"{self.name}: FAILED with exit code {self.returncode} after {self.seconds:.0f} s"

    def tail(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines()[-LOG_TAIL:]
        return "\n".join(f"  {line}" for line in lines)


def command(name: str) -> list[str]:
    """How tool ``name`` is built (or found in the cache)."""
    if name == NODE:
        return [sys.executable, "-m", "hack.realnode", "prepare", "--if-possible"]
    if name == NODE_IMAGES:
        return [sys.executable, "-m", "hack.realnode", "images", "--if-possible", "--if-cold"]
    if name not in TOOLS:
        raise ValueError(f"unknown tool {name!r}: one of {list(ALL)}")
    return ["bash", str(REPO / "hack" / name / "build.sh")]


def build(name: str, log_dir: Path, how: Callable[[str], list[str]] = command) -> Built:
    """Build (or reuse) ``name`` by running ``how(name)``; both its streams go to a log file."""
    log = log_dir / f"{name}.log"
    started = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(how(name), cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    return Built(name, done.returncode, time.monotonic() - started, log)


class Builds:
    """The lanes, built in background threads; :meth:`wait` for the tools you need.

    ``names`` limits the build to those tools (and the lanes' order stays). A
    tool after a failed one in its lane is still built: lanes are an order, not
    a dependency, and each failure is reported on its own.
    """

    def __init__(
        self,
        names: Iterable[str],
        log_dir: Path,
        *,
        lanes: Sequence[Sequence[str]] = LANES,
        how: Callable[[str], list[str]] = command,
    ) -> None:
        wanted = set(names)
        known = {name for lane in lanes for name in lane}
        unknown = wanted - known
        if unknown:
            raise ValueError(f"unknown tool(s) {sorted(unknown)}: one of {sorted(known)}")
        self._lanes = [[n for n in lane if n in wanted] for lane in lanes]
        self._how = how
        self.log_dir = log_dir
        self._done: dict[str, Built] = {}
        self._finished = {name: threading.Event() for name in wanted}
        self._threads = [
            threading.Thread(target=self._run_lane, args=(lane,), name=f"build-{lane[0]}")
            for lane in self._lanes
            if lane
        ]

    def start(self) -> Builds:
        for thread in self._threads:
            thread.start()
        return self

    def _run_lane(self, lane: list[str]) -> None:
        for name in lane:
            try:
                self._done[name] = build(name, self.log_dir, self._how)
            finally:
                self._finished[name].set()

    def wait(self, names: Iterable[str]) -> list[Built]:
        """Wait until each of ``names`` is built or failed; what became of each."""
        results = []
        for name in names:
            if name not in self._finished:
                raise ValueError(f"{name!r} is not being built here")
            self._finished[name].wait()
            results.append(self._done[name])
        return results

    def join(self) -> list[Built]:
        """Wait for every lane; every tool's outcome, in the lanes' order."""
        for thread in self._threads:
            thread.join()
        return [self._done[name] for lane in self._lanes for name in lane]


def report(results: Sequence[Built]) -> int:
    """Print one line per tool and the log tail of each failure; 0 when all were built."""
    failed = [r for r in results if not r.ok]
    for result in results:
        print(result.summary(), flush=True)
    for result in failed:
        print(f"\n--- {result.name}: the last lines of {result.log} ---\n{result.tail()}")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.binaries", description=__doc__)
    parser.add_argument(
        "tools",
        nargs="*",
        default=list(TOOLS),
        help=f"what to build (default: every tool but {NODE!r} and {NODE_IMAGES!r}); "
        f"one of {list(ALL)}",
    )
    args = parser.parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="ksc-builds-"))
    try:
        builds = Builds(args.tools, log_dir).start()
    except ValueError as exc:
        parser.error(str(exc))
    status = report(builds.join())
    if status == 0:
        shutil.rmtree(builds.log_dir)
    return status


if __name__ == "__main__":
    sys.exit(main())
