"""A small reader for this repository's Dockerfiles, shared by the image tests.

Only what the tests need: instructions (continuations joined, comments
dropped), grouped into stages; ARG defaults substituted into FROM lines.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMPONENTS = ("controller", "runner")
# What both images carry beside their component: the contract both sides import.
SHARED = ("contract",)
# What only the controller image carries beside it: the Kubernetes API client
# (a package of its own, which the controller and the plugin both import) and
# the kubectl plugin.
CLIENT = "kubeclient"
PLUGIN = "kubectl_infer"
CONTROLLER_ONLY = (CLIENT, PLUGIN)


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [i.args for i in self.instructions if i.keyword == keyword]


def dockerfile(component: str) -> Path:
    return REPO / f"Dockerfile.{component}"


def instructions(text: str) -> list[Instruction]:
    """The instructions of a Dockerfile, continuation lines joined, comments dropped."""
    result: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        # Docker drops comment lines even in the middle of a continued instruction.
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, args = line.partition(" ")
        result.append(Instruction(keyword.upper(), " ".join(args.split())))
    if pending:
        raise ValueError("Dockerfile ends inside a continued instruction")
    return result


def stages(text: str) -> list[Stage]:
    """The build stages, each FROM image with ARG defaults substituted."""
    args: dict[str, str] = {}
    result: list[Stage] = []
    for instruction in instructions(text):
        if instruction.keyword == "ARG" and not result:
            arg, _, default = instruction.args.partition("=")
            args[arg] = default
        elif instruction.keyword == "FROM":
            image = re.sub(
                r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), instruction.args
            )
            parts = image.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            result.append(Stage(parts[0], name))
        elif result:
            result[-1].instructions.append(instruction)
        else:
            raise ValueError(f"{instruction.keyword} before the first FROM")
    return result


def third_party_imports(package: Path) -> set[str]:
    """Top-level modules imported anywhere under ``package`` that are neither stdlib nor ours."""
    ours = {*COMPONENTS, *SHARED, *CONTROLLER_ONLY}
    found: set[str] = set()
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names and name not in ours}
