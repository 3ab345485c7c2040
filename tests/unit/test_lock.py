"""The locked install (hack/lock.py): uv.lock matches pyproject.toml, and the
image requirement files hold exactly the lock's versions of what each image needs."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from hack import lock

pytestmark = pytest.mark.unit

PROJECT = tomllib.loads(lock.PYPROJECT.read_text())["project"]
LOCKED = tomllib.loads(lock.LOCK.read_text())


def test_uv_lock_matches_pyproject() -> None:
    assert lock.lock_is_current() is None


def test_uv_lock_check_fails_when_pyproject_changes(tmp_path: Path) -> None:
    # The check above can fail: a dependency the lock has never seen makes it stale.
    shutil.copy(lock.LOCK, tmp_path / "uv.lock")
    text = lock.PYPROJECT.read_text().replace(
        "dependencies = [\n", 'dependencies = [\n    "ksc-not-in-the-lock>=1",\n', 1
    )
    assert "ksc-not-in-the-lock" in text
    (tmp_path / "pyproject.toml").write_text(text)
    done = subprocess.run(
        [lock.uv(), "lock", "--check", "--offline"], cwd=tmp_path, capture_output=True
    )
    assert done.returncode != 0


@pytest.mark.parametrize("component", lock.REQUIREMENT_FILES)
def test_image_requirements_are_current(component: str) -> None:
    expected = lock.expected_image_requirements()[component]
    assert lock.requirements_path(component).read_text() == expected, "run `make lock`"


def _pins(component: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for name, body in lock.export_blocks(lock.requirements_path(component).read_text()):
        version = body.split("==", 1)[1].split()[0].rstrip("\\").strip()
        assert "--hash=sha256:" in body, f"{name} is not hash-pinned"
        pins[name] = version
    assert pins
    return pins


@pytest.mark.parametrize("component", lock.REQUIREMENT_FILES)
def test_image_requirements_pin_the_locked_versions(component: str) -> None:
    for name, version in _pins(component).items():
        assert lock.locked_version(LOCKED, name) == version, name


def test_each_image_gets_the_closure_of_what_it_needs() -> None:
    graph = lock.lock_graph(LOCKED)
    controller = lock.closure(graph, PROJECT["dependencies"])
    runner = lock.closure(graph, PROJECT["optional-dependencies"]["runner"])
    assert set(_pins("controller")) == controller
    assert set(_pins("runner")) == runner
    sbom = lock.closure(graph, PROJECT["optional-dependencies"]["sbom"])
    assert set(_pins("sbom")) == sbom
    assert "cyclonedx-bom" in sbom
    # The runner image leaves out what only the controller uses.
    assert "prometheus-client" in controller - runner


SMALL_LOCK = {
    "package": [
        {"name": "app", "version": "1", "dependencies": [{"name": "a"}, {"name": "b"}]},
        {"name": "a", "version": "1.0", "dependencies": [{"name": "Shared_Dep"}]},
        {"name": "b", "version": "2.0", "dependencies": [{"name": "c"}]},
        {
            "name": "c",
            "version": "3.0",
            "optional-dependencies": {"fast": [{"name": "shared-dep"}]},
        },
        {"name": "shared-dep", "version": "4.0"},
    ]
}
SMALL_EXPORT = """\
# a comment uv may print
a==1.0 \\
    --hash=sha256:aa
b==2.0 \\
    --hash=sha256:bb
c==3.0 \\
    --hash=sha256:cc
shared-dep==4.0 ; sys_platform == 'linux' \\
    --hash=sha256:dd
"""


def test_runner_requirements_keep_only_the_runner_closure() -> None:
    project = {
        "dependencies": ["a", "b"],
        "optional-dependencies": {"runner": ["A>=1"], "sbom": ["b"]},
    }
    texts = lock.image_requirements(SMALL_EXPORT, SMALL_LOCK, project)
    assert [name for name, _ in lock.export_blocks(texts["controller"])] == [
        "a",
        "b",
        "c",
        "shared-dep",
    ]
    runner = lock.export_blocks(texts["runner"])
    assert [name for name, _ in runner] == ["a", "shared-dep"]
    # Lines are kept whole: marker and hashes.
    assert runner[1][1] == "shared-dep==4.0 ; sys_platform == 'linux' \\\n    --hash=sha256:dd\n"
    assert [name for name, _ in lock.export_blocks(texts["sbom"])] == ["b", "c"]


def test_runner_extra_outside_the_project_dependencies_is_refused() -> None:
    lock_data = {"package": [*SMALL_LOCK["package"], {"name": "d", "version": "5"}]}
    project = {"dependencies": ["a"], "optional-dependencies": {"runner": ["d"], "sbom": ["b"]}}
    with pytest.raises(ValueError, match=r"runner extra needs \['d'\]"):
        lock.image_requirements(SMALL_EXPORT, lock_data, project)


def test_a_runner_only_dependency_comes_from_the_runner_export_not_the_controllers() -> None:
    # The runner extra may need what the controller does not (the postgres driver).
    lock_data = {"package": [*SMALL_LOCK["package"], {"name": "d", "version": "5"}]}
    project = {
        "dependencies": ["a"],
        "optional-dependencies": {"runner": ["a", "d"], "sbom": ["b"]},
    }
    runner_export = SMALL_EXPORT + "d==5 \\\n    --hash=sha256:ee\n"
    texts = lock.image_requirements(SMALL_EXPORT, lock_data, project, {"runner": runner_export})
    assert "d==5" not in texts["controller"]
    assert [name for name, _ in lock.export_blocks(texts["runner"])] == ["a", "shared-dep", "d"]


def test_closure_follows_extras_only_where_requested() -> None:
    graph = lock.lock_graph(SMALL_LOCK)
    assert lock.closure(graph, ["c"]) == {"c"}
    assert lock.closure(graph, ["c[fast] >= 3"]) == {"c", "shared-dep"}


def test_a_requirement_missing_from_the_lock_is_refused() -> None:
    with pytest.raises(ValueError, match=r"nope is not in uv\.lock"):
        lock.closure(lock.lock_graph(SMALL_LOCK), ["nope"])
    with pytest.raises(ValueError, match=r"c\[slow\] is not in uv.lock"):
        lock.closure(lock.lock_graph(SMALL_LOCK), ["c[slow]"])


def test_no_runner_extra_is_refused() -> None:
    with pytest.raises(ValueError, match=r"no .* runner extra"):
        lock.image_requirements(SMALL_EXPORT, SMALL_LOCK, {"dependencies": ["a"]})


def test_the_locked_uv_is_one_version() -> None:
    assert lock.locked_version(LOCKED, "uv")
    with pytest.raises(ValueError, match="no version"):
        lock.locked_version(SMALL_LOCK, "uv")
