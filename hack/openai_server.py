"""An OpenAI-compatible model server on loopback, on KServe's own OpenAI types.

``python -m hack.openai_server --port P`` serves the model ``echo`` on KServe's
routes (``/openai/v1/chat/completions``, ``/openai/v1/completions``,
``/openai/v1/embeddings``, ``/openai/v1/models``) and vLLM's (the same under
``/v1``). No weights: the answers are computed from the prompt, so tests know
them (:func:`chat_reply`, :func:`completion_text`, :func:`embedding`,
:func:`usage`):

- a chat answer is the last message's content reversed; a completion the prompt
  reversed; an embedding four numbers counted from the text;
- tokens are whitespace-separated words: ``prompt_tokens`` counts the prompt's
  (every message's content), ``completion_tokens`` the answer's; an answer longer
  than ``max_tokens`` words is cut there with ``finish_reason: "length"``.

**Why not KServe's own server.** KServe's Python package ships an OpenAI data
plane (``kserve.protocol.rest.openai``: ``OpenAIDataPlane``, the endpoints, the
``OpenAIGenerativeModel`` base class), but since 0.15 every module of it imports
its request and answer types from vLLM (``kserve/protocol/rest/openai/types/
__init__.py`` imports ``vllm.entrypoints.openai...``), and vLLM needs PyTorch and
a GPU build: gigabytes, for a test. What does not need vLLM is KServe's own
generated copy of the OpenAI API's types, ``types/openapi.py`` (pydantic only).
It cannot be imported as ``kserve.protocol.rest.openai.types.openapi`` (that runs
the package's ``__init__``, hence vLLM), so :func:`kserve_openai_types` loads the
file by its path. Requests are validated with its ``CreateChatCompletionRequest``,
``CreateCompletionRequest`` and ``CreateEmbeddingRequest``; answers are built
with its ``CreateChatCompletionResponse``, ``CreateCompletionResponse``,
``CreateEmbeddingResponse`` and ``ErrorResponse``, on the paths KServe's
``register_openai_endpoints`` serves.

**Errors.** A body those types refuse is answered 400, an unknown model 404,
both in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}`` with
the server's words.

**Faults** (tests drive them over HTTP, on the same port):
``POST /admin/faults {"status": 429, "count": N, "retryAfter": "1"}`` answers the
next ``N`` model requests with ``status`` (and ``Retry-After`` when given);
``GET /admin/stats`` gives ``{"requests", "answered", "faulted"}``;
``POST /admin/reset`` clears both.

``--delay SECONDS`` makes every answer wait that long first (an asyncio sleep:
no CPU), as a model generating its answer would; benchmarks use it to compare
clients against a server whose latency, not its CPU, sets the pace.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import sys
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

MODEL = "echo"
PREFIXES = ("/openai/v1", "/v1")
EMBEDDING_SIZE = 4
_TYPES_MODULE = "hack_kserve_openai_types"


@cache
def kserve_openai_types() -> ModuleType:
    """KServe's ``kserve/protocol/rest/openai/types/openapi.py``, loaded without vLLM."""
    spec = importlib.util.find_spec("kserve")
    if spec is None or spec.origin is None:
        raise RuntimeError("the kserve package is not installed")
    path = Path(spec.origin).parent / "protocol" / "rest" / "openai" / "types" / "openapi.py"
    module_spec = importlib.util.spec_from_file_location(_TYPES_MODULE, path)
    if module_spec is None or module_spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(module_spec)
    # pydantic resolves the module's generic models through sys.modules.
    sys.modules[_TYPES_MODULE] = module
    module_spec.loader.exec_module(module)
    return module


# -- the model: deterministic answers ------------------------------------------------


def words(text: str) -> int:
    return len(text.split())


def reverse(text: str) -> str:
    return text[::-1]


def cut(text: str, max_tokens: int | None) -> tuple[str, str]:
    """``text`` cut to ``max_tokens`` words, and the finish reason."""
    if max_tokens is not None and words(text) > max_tokens:
        return " ".join(text.split()[:max_tokens]), "length"
    return text, "stop"


def content_text(content: Any) -> str:
    """A message's content: a string, or the text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def chat_reply(messages: list[dict[str, Any]], max_tokens: int | None = None) -> tuple[str, str]:
    """The answer to ``messages`` and its finish reason: the last content reversed."""
    last = content_text(messages[-1].get("content")) if messages else ""
    return cut(reverse(last), max_tokens)


def completion_text(prompt: str, max_tokens: int | None = None) -> tuple[str, str]:
    return cut(reverse(prompt), max_tokens)


def embedding(text: str) -> list[float]:
    """Four numbers counted from ``text``."""
    return [
        float(len(text)),
        float(words(text)),
        float(sum(c in "aeiou" for c in text.lower())),
        float(sum(map(ord, text)) % 97),
    ]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_usage(messages: list[dict[str, Any]], reply: str) -> dict[str, int]:
    prompt = sum(words(content_text(m.get("content"))) for m in messages)
    return usage(prompt, words(reply))


# -- the server -----------------------------------------------------------------------


@dataclass
class Faults:
    status: int = 0
    count: int = 0
    retry_after: str | None = None
    requests: int = 0
    answered: int = 0
    faulted: int = 0


class OpenAIServer:
    """The aiohttp application: routes, validation with KServe's types, faults."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.types = kserve_openai_types()
        self.faults = Faults()
        self._ids = itertools.count(1)
        self.created = int(time.time())

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        for prefix in PREFIXES:
            app.router.add_post(f"{prefix}/chat/completions", self.chat)
            app.router.add_post(f"{prefix}/completions", self.completions)
            app.router.add_post(f"{prefix}/embeddings", self.embeddings)
            app.router.add_get(f"{prefix}/models", self.models)
            app.router.add_get(f"{prefix}/models/{{name}}", self.model)
        app.router.add_post("/admin/faults", self.set_faults)
        app.router.add_post("/admin/reset", self.reset)
        app.router.add_get("/admin/stats", self.stats)
        return app

    # -- answers --------------------------------------------------------------------

    def error(self, status: int, message: str, kind: str, param: str | None = None) -> web.Response:
        body = self.types.ErrorResponse(
            error=self.types.Error(code=str(status), message=message, param=param, type=kind)
        )
        return self._json(body.model_dump(), status)

    def _json(
        self, body: Any, status: int = 200, headers: dict[str, str] | None = None
    ) -> web.Response:
        return web.Response(
            body=orjson.dumps(body),
            status=status,
            content_type="application/json",
            headers=headers,
        )

    async def _answer(self, body: Any) -> web.Response:
        if self.delay:
            await asyncio.sleep(self.delay)
        self.faults.answered += 1
        request_id = f"req-{next(self._ids)}"
        return self._json(
            body.model_dump(mode="json", exclude_none=True), headers={"X-Request-Id": request_id}
        )

    async def _request(self, request: web.Request, kind: Any) -> Any:
        """The validated request, or the error answer to send instead."""
        self.faults.requests += 1
        faults = self.faults
        if faults.count > 0:
            faults.count -= 1
            faults.faulted += 1
            headers = {"Retry-After": faults.retry_after} if faults.retry_after else None
            body = self.types.ErrorResponse(
                error=self.types.Error(
                    code=str(faults.status),
                    message=f"injected fault: {faults.status}",
                    param=None,
                    type="rate_limit_error" if faults.status == 429 else "server_error",
                )
            )
            return self._json(body.model_dump(), faults.status, headers)
        try:
            raw = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return self.error(400, f"the body is not JSON: {exc}", "invalid_request_error")
        try:
            parsed = kind.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:4]
            )
            return self.error(400, problems, "invalid_request_error")
        model = parsed.model if isinstance(parsed.model, str) else parsed.model.value
        if model != MODEL:
            return self.error(
                404, f"The model `{model}` does not exist.", "invalid_request_error", "model"
            )
        return parsed

    async def chat(self, request: web.Request) -> web.Response:
        types = self.types
        parsed = await self._request(request, types.CreateChatCompletionRequest)
        if isinstance(parsed, web.Response):
            return parsed
        messages = [m.model_dump(mode="json") for m in parsed.messages]
        text, reason = chat_reply(messages, parsed.max_tokens)
        return await self._answer(
            types.CreateChatCompletionResponse(
                id=f"chatcmpl-{self.faults.answered}",
                choices=[
                    types.Choice1(
                        finish_reason=reason,
                        index=0,
                        message=types.ChatCompletionResponseMessage(content=text, role="assistant"),
                        logprobs=None,
                    )
                ],
                created=self.created,
                model=MODEL,
                object="chat.completion",
                usage=types.CompletionUsage(**chat_usage(messages, text)),
            )
        )

    async def completions(self, request: web.Request) -> web.Response:
        types = self.types
        parsed = await self._request(request, types.CreateCompletionRequest)
        if isinstance(parsed, web.Response):
            return parsed
        prompt = parsed.prompt if isinstance(parsed.prompt, str) else None
        if prompt is None:
            return self.error(400, "prompt must be a string", "invalid_request_error", "prompt")
        text, reason = completion_text(prompt, parsed.max_tokens)
        return await self._answer(
            types.CreateCompletionResponse(
                id=f"cmpl-{self.faults.answered}",
                choices=[types.Choice(finish_reason=reason, index=0, logprobs=None, text=text)],
                created=self.created,
                model=MODEL,
                object="text_completion",
                usage=types.CompletionUsage(**usage(words(prompt), words(text))),
            )
        )

    async def embeddings(self, request: web.Request) -> web.Response:
        types = self.types
        parsed = await self._request(request, types.CreateEmbeddingRequest)
        if isinstance(parsed, web.Response):
            return parsed
        given = parsed.input if isinstance(parsed.input, list) else [parsed.input]
        texts = [t for t in given if isinstance(t, str)]
        if len(texts) != len(given):
            return self.error(400, "input must be text", "invalid_request_error", "input")
        return await self._answer(
            types.CreateEmbeddingResponse(
                data=[
                    types.Embedding(index=i, embedding=embedding(t), object="embedding")
                    for i, t in enumerate(texts)
                ],
                model=MODEL,
                object="list",
                usage={
                    "prompt_tokens": sum(map(words, texts)),
                    "total_tokens": sum(map(words, texts)),
                },
            )
        )

    async def models(self, request: web.Request) -> web.Response:
        model = self.types.Model(id=MODEL, created=self.created, object="model", owned_by="hack")
        return self._json({"object": "list", "data": [model.model_dump(mode="json")]})

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name != MODEL:
            return self.error(404, f"The model `{name}` does not exist.", "invalid_request_error")
        return self._json({"id": MODEL, "object": "model", "owned_by": "hack"})

    # -- faults -----------------------------------------------------------------------

    async def set_faults(self, request: web.Request) -> web.Response:
        wanted = orjson.loads(await request.read())
        self.faults.status = int(wanted["status"])
        self.faults.count = int(wanted["count"])
        retry_after = wanted.get("retryAfter")
        self.faults.retry_after = None if retry_after is None else str(retry_after)
        return self._json({"ok": True})

    async def reset(self, request: web.Request) -> web.Response:
        self.faults = Faults()
        return self._json({"ok": True})

    async def stats(self, request: web.Request) -> web.Response:
        f = self.faults
        return self._json(
            {"requests": f.requests, "answered": f.answered, "faulted": f.faulted, "left": f.count}
        )


async def serve(host: str, port: int, delay: float = 0.0) -> None:
    runner = web.AppRunner(OpenAIServer(delay).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hack.openai_server",
        description="Serve the deterministic 'echo' model on the OpenAI API (KServe's types).",
    )
    parser.add_argument("--port", type=int, default=8081, help="HTTP port")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--delay", type=float, default=0.0, help="seconds every answer waits (generation time)"
    )
    args = parser.parse_args(argv)
    asyncio.run(serve(args.host, args.port, args.delay))
    return 0


if __name__ == "__main__":
    sys.exit(main())
