"""Watch liveness settings: WATCH_IDLE_TIMEOUT.

The idle bound itself is tested on the informer's loop in test_informer_logic.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.kube import informer
from controller.settings import SettingsError, load_settings

pytestmark = pytest.mark.unit

NO_FILE = Path("/nonexistent/namespace")


def idle_setting(value: str | None = None) -> float:
    env = {} if value is None else {"WATCH_IDLE_TIMEOUT": value}
    return load_settings([], env, namespace_file=NO_FILE).watch_idle_timeout


def test_the_default_bound_is_the_informers() -> None:
    assert idle_setting() == informer.WATCH_IDLE_TIMEOUT == 75
    # Over a minute (the API server's bookmark interval), at most 90 s.
    assert 60 < idle_setting() <= 90


@pytest.mark.parametrize(("text", "seconds"), [("30", 30), ("1m", 60), ("90s", 90), ("10s", 10)])
def test_the_bound_is_a_duration(text: str, seconds: float) -> None:
    assert idle_setting(text) == seconds
    flags = load_settings(["--watch-idle-timeout", text], {}, namespace_file=NO_FILE)
    assert flags.watch_idle_timeout == seconds


@pytest.mark.parametrize("text", ["9s", "91s", "2m", "0", "-5", "soon", ""])
def test_a_bound_outside_10s_to_90s_is_refused_by_name(text: str) -> None:
    with pytest.raises(SettingsError, match="WATCH_IDLE_TIMEOUT"):
        idle_setting(text)
