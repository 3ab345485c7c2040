"""Every relative link of the repository's Markdown reaches a file, and a section that exists.

The operator guide is split into pages by topic (docs/operator-guide.md is
their index), and pages link to each other's sections: a moved or renamed
heading must not leave a link behind.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.chart import REPO

pytestmark = [pytest.mark.unit]

PAGES = [
    REPO / "README.md",
    REPO / "deploy" / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "bench" / "results").glob("*.md")),
]
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(markdown: str) -> str:
    """The text outside code blocks and code spans."""
    return CODE.sub("", FENCE.sub("", markdown))


def github_anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#{1,6} (.+)$", FENCE.sub("", markdown), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def relative_links(page: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(page.read_text()))
        if not re.match(r"[a-z]+:", target)
    ]


def test_github_anchors_read_headings_as_github_does() -> None:
    text = "# Runner pods: shape, queues\n```sh\n# not a heading\n```\n## `kubectl infer`\n"
    assert github_anchors(text) == {"runner-pods-shape-queues", "kubectl-infer"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_reaches_its_file_and_section(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif (
            anchor
            and destination.suffix == ".md"
            and anchor not in github_anchors(destination.read_text())
        ):
            broken.append(f"{target}: no such section")
    assert not broken, f"{page.relative_to(REPO)}: {broken}"


def test_the_operator_guide_links_every_page_it_was_split_into() -> None:
    guide = REPO / "docs" / "operator-guide.md"
    linked = {target.partition("#")[0] for target in relative_links(guide)}
    assert len(linked) >= 10, linked
    for page in linked:
        assert (guide.parent / page).is_file(), page
