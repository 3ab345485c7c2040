"""OpenAI requests run with bounded concurrency: ``batching.concurrency`` in flight, never more.

A gate in front of ``hack.openai_server`` holds each request until
``concurrency`` of them are waiting (or a while has passed: the last rows of a
run are fewer), then forwards it; it records the most it ever held at once. A
runner that sent one request at a time would never fill the gate; one that did
not bound its requests would overfill it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from contract.exitcodes import ExitCode
from hack.loopback import ForwardingProxy
from tests.runner.conftest import World
from tests.runner.test_runner_openai import llm_contract, prompts, run, stored
from tests.servers import OpenAIServer, running

CONCURRENCY = 4
# How long the gate holds a request when fewer than CONCURRENCY come: a bound
# on the wait, not something asserted.
HOLD = 5.0


class Gate(ForwardingProxy):
    def __init__(self, target: str, size: int) -> None:
        super().__init__(target)
        self.size = size
        self.in_flight = 0
        self.most = 0
        self.passed = 0
        self._changed = asyncio.Condition()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.method != "POST":
            return await self.forward(request, body)
        async with self._changed:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self._changed.notify_all()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self.in_flight >= self.size), HOLD
                )
        try:
            return await self.forward(request, body)
        finally:
            async with self._changed:
                self.in_flight -= 1
                self.passed += 1


@pytest.fixture
async def gate(openai_server: OpenAIServer) -> AsyncIterator[Gate]:
    async with running(Gate(openai_server.url, CONCURRENCY)) as proxy:
        yield proxy


async def test_requests_fill_the_concurrency_and_never_exceed_it(
    llm: World, openai_server: OpenAIServer, gate: Gate
) -> None:
    table = prompts(48)
    llm.storage.seed_table("prompts", ("id", "prompt"), table)
    contract: dict[str, Any] = llm_contract(openai_server, batching={"concurrency": CONCURRENCY})
    contract["kserve"]["modelUrl"] = f"{gate.url}/openai/v1"
    outcome = await run(llm, contract)
    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert gate.passed == 48
    assert gate.most == CONCURRENCY
    assert [answer["id"] for answer in stored(llm.storage)] == [key for key, _ in table]
    assert (await openai_server.stats())["answered"] == 48
