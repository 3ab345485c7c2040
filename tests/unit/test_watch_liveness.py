"""Watch liveness settings: WATCH_IDLE_TIMEOUT and the API connections' TCP keepalive.

The idle bound itself is tested on the informer's loop in test_informer_logic.py;
a real connection's socket options in tests/integration/test_keepalive.py.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from controller.settings import SettingsError, load_settings
from kubeclient import informer, transport
from kubeclient.transport import keepalive_options, keepalive_socket

pytestmark = pytest.mark.unit

NO_FILE = Path("/nonexistent/namespace")


def idle_setting(value: str | None = None) -> float:
    env = {} if value is None else {"WATCH_IDLE_TIMEOUT": value}
    return load_settings([], env, namespace_file=NO_FILE).watch_idle_timeout


def test_the_default_bound_is_the_informers_and_the_keepalives() -> None:
    assert idle_setting() == informer.WATCH_IDLE_TIMEOUT == transport.KEEPALIVE == 75
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


@pytest.mark.parametrize("within", [4, 10, 30, 45, 75, 90, 600])
def test_keepalive_notices_a_dead_peer_within_the_bound(within: float) -> None:
    options = keepalive_options(within)
    if {"TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT"} <= set(options):
        probing = options["TCP_KEEPIDLE"] + options["TCP_KEEPINTVL"] * options["TCP_KEEPCNT"]
        assert probing <= within
        assert probing >= within / 2  # not needlessly chatty either
    if "TCP_USER_TIMEOUT" in options:
        assert options["TCP_USER_TIMEOUT"] == within * 1000


def test_a_keepalive_bound_under_four_seconds_is_refused() -> None:
    # Whole seconds, one at least each: 1 s of silence, then three probes a second apart.
    with pytest.raises(ValueError, match="at least 4 seconds"):
        keepalive_options(3.9)


def test_the_socket_factory_turns_keepalive_on() -> None:
    make = keepalive_socket(75)
    info = socket.getaddrinfo("127.0.0.1", 443, type=socket.SOCK_STREAM)[0]
    with make(info) as sock:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        for name, value in keepalive_options(75).items():
            assert sock.getsockopt(socket.IPPROTO_TCP, getattr(socket, name)) == value, name
