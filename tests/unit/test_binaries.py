"""hack/binaries.py: the tools built in two lanes at once, waited for one by one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hack import binaries

pytestmark = pytest.mark.unit


def fake_builds(tmp_path: Path, scripts: dict[str, str]) -> binaries.Builds:
    """Builds whose tools are Python one-liners; lanes: (slow, after) and (fast, broken)."""

    def how(name: str) -> list[str]:
        return [sys.executable, "-c", scripts[name]]

    lanes = (("slow", "after"), ("fast", "broken"))
    return binaries.Builds(scripts, tmp_path, lanes=lanes, how=how)


def test_the_lanes_build_at_the_same_time_and_each_tool_is_waited_for(tmp_path: Path) -> None:
    signal = tmp_path / "fast-was-built"
    scripts = {
        # Finishes only once the other lane's first tool ran: one after the other, never.
        "slow": (
            "import os, sys, time\n"
            f"deadline = time.time() + 60\n"
            f"while not os.path.exists({str(signal)!r}):\n"
            "    time.sleep(0.01)\n"
            "    if time.time() > deadline: sys.exit('the lanes did not run at once')\n"
            "print('/cache/slow')"
        ),
        "after": "print('/cache/after')",
        "fast": f"open({str(signal)!r}, 'w').close(); print('/cache/fast')",
        "broken": "import sys; print('go: downloading x'); sys.exit('build failed: no space')",
    }
    builds = fake_builds(tmp_path, scripts).start()
    (fast,) = builds.wait(["fast"])
    assert fast.ok
    everything = builds.join()
    assert [b.name for b in everything] == ["slow", "after", "fast", "broken"]
    assert [b.ok for b in everything] == [True, True, True, False]
    assert builds.wait(["slow"])[0].summary().startswith("slow: /cache/slow (")


def test_a_failed_build_is_reported_with_its_log_and_fails_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scripts = {
        "slow": "print('/cache/slow')",
        "after": "print('/cache/after')",
        "fast": "print('/cache/fast')",
        "broken": "import sys; print('go: downloading x'); sys.exit('build failed: no space')",
    }
    builds = fake_builds(tmp_path, scripts).start()
    assert binaries.report(builds.join()) == 1
    out = capsys.readouterr().out
    assert "broken: FAILED with exit code 1 after" in out
    assert "  build failed: no space" in out  # the tail of its log
    assert "fast: /cache/fast (" in out
    assert binaries.report(builds.wait(["slow", "fast"])) == 0


def test_an_unknown_tool_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown tool\(s\) \['kind'\]"):
        binaries.Builds(["helm", "kind"], tmp_path)
    builds = binaries.Builds(["helm"], tmp_path)
    with pytest.raises(ValueError, match="'kwok' is not being built here"):
        builds.wait(["kwok"])


def test_every_tool_has_its_build_script_and_a_lane() -> None:
    in_lanes = [name for lane in binaries.LANES for name in lane]
    assert sorted(in_lanes) == sorted(binaries.ALL)
    for tool in binaries.TOOLS:
        script = Path(binaries.command(tool)[-1])
        assert script.is_file(), script
