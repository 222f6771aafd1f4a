"""The embedded engine's HTTP server (``claw sim``): vLLM's OpenAI-compatible routes on FastAPI.

It is a simulator and says so in ``/v1/models``. Bodies are parsed by hand rather than by FastAPI
so that malformed JSON and invalid parameters come back as vLLM does: HTTP 400 with
``{"error": {"message", "type": "BadRequestError", "param", "code": 400}}``. The context window
(``--max-model-len``, ``CLAW_ENGINE_MAX_MODEL_LEN``) is checked as vLLM does (``context``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, TypeVar

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from claw_pipelines.engine.answer_log import AnswerLog
from claw_pipelines.engine.chat_template import render, render_turns
from claw_pipelines.engine.context import DEFAULT_MAX_MODEL_LEN, ContextWindow
from claw_pipelines.engine.errors import BadRequest
from claw_pipelines.engine.policy import respond_chat, respond_text
from claw_pipelines.engine.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorInfo,
    ErrorResponse,
    NamedToolChoice,
    TokenizeRequest,
    TokenizeResponse,
    UsageInfo,
)
from claw_pipelines.engine.responses import (
    Choice,
    Head,
    chat_chunks,
    chat_response,
    completion_chunks,
    completion_response,
    usage,
)
from claw_pipelines.engine.sampling import choice_rng, realize
from claw_pipelines.engine.tokenizer import (
    ENDOFTEXT_ID,
    IM_END_ID,
    VOCAB_SIZE,
    decode,
    encode,
    token_str,
)

MODEL_NAME = "claw-sim"
OWNED_BY = "claw-sim (simulator)"
DESCRIPTION = (
    "Simulated policy engine: no GPU, no model weights. A seeded stochastic policy answers "
    "arithmetic questions in vLLM's OpenAI-compatible shapes (token IDs, logprobs, tool calls)."
)
LOG_ENV = "CLAW_ENGINE_LOG"
LATENCY_ENV = "CLAW_ENGINE_LATENCY_MS"
MAX_MODEL_LEN_ENV = "CLAW_ENGINE_MAX_MODEL_LEN"

Body = TypeVar("Body", bound=BaseModel)


def error_response(message: str, param: str | None = None, code: int = 400) -> JSONResponse:
    error = ErrorInfo(message=message, type="BadRequestError", param=param, code=code)
    return JSONResponse(ErrorResponse(error=error).model_dump(), status_code=code)


@dataclass
class Engine:
    """Per-process state: the seed, the request counter that varies rollouts, the answer log,
    the context window."""

    seed: int
    log: AnswerLog | None = None
    latency_s: float = 0.0
    window: ContextWindow = field(default_factory=ContextWindow)
    counter: Iterator[int] = field(default_factory=itertools.count)

    def request_key(self, seed: int | None) -> str:
        """A request's own ``seed`` makes it reproducible alone; otherwise the counter varies it."""
        return f"seed={seed}" if seed is not None else f"request={next(self.counter)}"

    async def delay(self) -> None:
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)

    def record(self, head: Head, choices: Sequence[Choice], stream: bool) -> None:
        if self.log is not None:
            self.log.write(head.id, choices, stream)


async def parse_body(request: Request, model: type[Body]) -> Body:
    try:
        payload = json.loads(await request.body())
    except ValueError as exc:
        raise BadRequest(f"Malformed JSON body: {exc}") from exc
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise BadRequest(f"{param or 'body'}: {first['msg']}", param) from exc


def check_token_ids(ids: list[int]) -> list[int]:
    bad = [i for i in ids if not 0 <= i < VOCAB_SIZE]
    if bad:
        raise BadRequest(f"token ids out of vocabulary (size {VOCAB_SIZE}): {bad[:5]}", "tokens")
    return ids


def _head(prefix: str, model: str | None) -> Head:
    return Head(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model or MODEL_NAME)


def _json(body: BaseModel) -> Response:
    """A JSON body serialized by pydantic (a 200k-token ``prompt_token_ids`` in a few ms)."""
    return Response(body.model_dump_json(), media_type="application/json")


def _sse(chunks: Iterator[BaseModel]) -> Iterator[str]:
    for chunk in chunks:
        yield f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n"


def _usage_chunk(head: Head, obj: str, info: UsageInfo) -> str:
    chunk = {"id": head.id, "object": obj, "created": head.created, "model": head.model}
    body = {**chunk, "choices": [], "usage": info.model_dump(exclude_none=True)}
    return f"data: {json.dumps(body)}\n\n"


def create_app(
    seed: int = 0,
    log_file: Path | None = None,
    latency_ms: float = 0.0,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
) -> FastAPI:
    """The engine app; ``log_file`` gets one JSON line per answered choice."""
    log = AnswerLog(log_file) if log_file else None
    app = FastAPI(title="claw-sim (simulated vLLM engine)")
    app.state.engine = Engine(seed, log, latency_ms / 1000.0, ContextWindow(max_model_len))
    app.add_exception_handler(BadRequest, _bad_request)
    app.include_router(routes)
    return app


async def _bad_request(_: Request, exc: BadRequest) -> JSONResponse:
    return error_response(exc.message, exc.param)


def _engine(request: Request) -> Engine:
    return request.app.state.engine


Current = Annotated[Engine, Depends(_engine)]
"""A route's ``Engine``: the process's one."""

routes = APIRouter()


@routes.get("/health")
async def health() -> Response:
    return Response(status_code=200)


@routes.get("/v1/models")
async def models(engine: Current) -> dict:
    card = {
        "id": MODEL_NAME,
        "object": "model",
        "created": int(time.time()),
        "owned_by": OWNED_BY,
        "root": MODEL_NAME,
        "parent": None,
        "max_model_len": engine.window.max_model_len,
        "description": DESCRIPTION,
        "simulator": True,
    }
    return {"object": "list", "data": [card]}


@routes.post("/tokenize")
async def tokenize(request: Request, engine: Current) -> TokenizeResponse:
    body = await parse_body(request, TokenizeRequest)
    text = (
        body.prompt
        if body.messages is None
        else render(body.messages, body.tools, body.add_generation_prompt)
    )
    ids = encode(text)
    strs = [token_str(i) for i in ids] if body.return_token_strs else None
    return TokenizeResponse(
        count=len(ids), max_model_len=engine.window.max_model_len, tokens=ids, token_strs=strs
    )


@routes.post("/detokenize")
async def detokenize(request: Request) -> DetokenizeResponse:
    body = await parse_body(request, DetokenizeRequest)
    return DetokenizeResponse(prompt=decode(check_token_ids(body.tokens)))


@routes.post("/v1/chat/completions")
async def chat_completions(request: Request, engine: Current) -> Response:
    body = await parse_body(request, ChatCompletionRequest)
    engine.window.check_output_request(body.output_limit, body.output_param)
    turns = render_turns(body.messages, body.tools, body.add_generation_prompt)
    prompt_ids = engine.window.encode_prompt(turns)
    budget = engine.window.output_budget(len(prompt_ids), body.output_limit)
    tool_choice = (
        body.tool_choice.function.name
        if isinstance(body.tool_choice, NamedToolChoice)
        else body.tool_choice
    )
    key = engine.request_key(body.seed)
    top_k = (body.top_logprobs or 0) if body.logprobs else None
    choices = []
    for index in range(body.n):
        rng = choice_rng(engine.seed, key, index)
        draft = respond_chat(body.messages, body.tools or [], tool_choice, budget, rng)
        sample = realize(draft, IM_END_ID, budget, top_k or 0, rng)
        choices.append(Choice(index, prompt_ids, sample))
    head = _head("chatcmpl", body.model)
    with_ids = bool(body.return_token_ids)
    answer = Answer(head, choices, len(prompt_ids), "chat.completion.chunk")
    return await answer.sent(
        engine,
        body.stream,
        body.include_usage,
        lambda: chat_response(head, prompt_ids, choices, top_k, with_ids),
        lambda choice: chat_chunks(head, choice, top_k, with_ids),
    )


@routes.post("/v1/completions")
async def completions(request: Request, engine: Current) -> Response:
    body = await parse_body(request, CompletionRequest)
    engine.window.check_output_request(body.output_limit, body.output_param)
    prompts = _prompt_ids(body.prompt, engine.window)
    key = engine.request_key(body.seed)
    top_k = body.logprobs
    choices = []
    for prompt_index, prompt_ids in enumerate(prompts):
        budget = engine.window.output_budget(len(prompt_ids), body.output_limit)
        for n in range(body.n):
            index = prompt_index * body.n + n
            rng = choice_rng(engine.seed, key, index)
            draft = respond_text(decode(prompt_ids), budget, rng)
            sample = realize(draft, ENDOFTEXT_ID, budget, top_k or 0, rng)
            choices.append(Choice(index, prompt_ids, sample))
    head = _head("cmpl", body.model)
    with_ids = bool(body.return_token_ids)
    prompt_tokens = sum(len(ids) for ids in prompts)
    answer = Answer(head, choices, prompt_tokens, "text_completion")
    return await answer.sent(
        engine,
        body.stream,
        body.include_usage,
        lambda: completion_response(head, prompt_tokens, choices, top_k, with_ids),
        lambda choice: completion_chunks(head, choice, top_k, with_ids),
    )


@dataclass(frozen=True)
class Answer:
    """The sampled choices of one request, sent whole or streamed."""

    head: Head
    choices: list[Choice]
    prompt_tokens: int
    chunk_object: str
    """The ``object`` of a streamed chunk."""

    async def sent(
        self,
        engine: Engine,
        stream: bool | None,
        include_usage: bool | None,
        whole: Callable[[], BaseModel],
        chunks: Callable[[Choice], Iterator[BaseModel]],
    ) -> Response:
        """The response after the engine's latency: ``whole()``, or each choice's ``chunks``
        as server-sent events (and a usage chunk when asked), recorded once sent."""
        await engine.delay()
        if not stream:
            engine.record(self.head, self.choices, stream=False)
            return _json(whole())
        return StreamingResponse(
            self._events(engine, include_usage, chunks), media_type="text/event-stream"
        )

    async def _events(
        self,
        engine: Engine,
        include_usage: bool | None,
        chunks: Callable[[Choice], Iterator[BaseModel]],
    ) -> AsyncIterator[str]:
        for choice in self.choices:
            for line in _sse(chunks(choice)):
                yield line
        if include_usage:
            info = usage(self.prompt_tokens, self.choices)
            yield _usage_chunk(self.head, self.chunk_object, info)
        engine.record(self.head, self.choices, stream=True)
        yield "data: [DONE]\n\n"


def _prompt_ids(
    prompt: str | list[str] | list[int] | list[list[int]], window: ContextWindow
) -> list[list[int]]:
    """vLLM's prompt forms: text, token IDs, or a batch of either; each must fit the window."""
    if isinstance(prompt, str):
        return [window.encode_prompt([prompt])]
    if all(isinstance(item, int) for item in prompt):
        return [window.check_prompt_ids(check_token_ids(prompt))]
    return [
        window.encode_prompt([item])
        if isinstance(item, str)
        else window.check_prompt_ids(check_token_ids(item))
        for item in prompt
    ]


def serve(
    host: str = "127.0.0.1",
    port: int = 8001,
    seed: int = 0,
    log_file: Path | None = None,
    latency_ms: float | None = None,
    max_model_len: int | None = None,
) -> None:
    """Run the engine until interrupted (env defaults: CLAW_ENGINE_LOG, CLAW_ENGINE_LATENCY_MS,
    CLAW_ENGINE_MAX_MODEL_LEN)."""
    log_file = log_file or (Path(os.environ[LOG_ENV]) if os.environ.get(LOG_ENV) else None)
    if latency_ms is None:
        latency_ms = float(os.environ.get(LATENCY_ENV, "0"))
    if max_model_len is None:
        max_model_len = int(os.environ.get(MAX_MODEL_LEN_ENV, DEFAULT_MAX_MODEL_LEN))
    if max_model_len < 1:
        raise ValueError(f"max_model_len must be at least 1, got {max_model_len}")
    app = create_app(seed, log_file, latency_ms, max_model_len)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
