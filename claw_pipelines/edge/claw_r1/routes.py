"""Claw-R1's gateway routes on the proxy port, served by the HTTP edge (``asgi.CaptureApp``).

| Claw-R1 route | here |
|---|---|
| ``POST /init_trajectory`` | a fresh trajectory id and prompt id in ``base_url`` (no row) |
| ``POST /{t}/{p}/v1/register_trajectory`` | a ``trajectory_registrations`` row |
| ``POST /{t}/{p}/v1/chat/completions`` | our chat route with trajectory ``t``, group ``p`` |
| ``POST /{t}/{p}/v1/complete_trajectory`` | a ``trajectory_events`` row (``completed``) |
| ``POST /submit_steps?channel=`` | white-box ``turns`` rows, their ``rewards`` and completions |
| ``POST /generate`` | our text completion route with the token-ID prompt |

Model calls go through the edge's inner app (the policy gate, then LiteLLM), so their turns
are captured as every call's are. The edge has already checked the body (size, JSON) and the
key (or let the call in without one) and handed over the master key for LiteLLM.

A registration's channel and policy version are also kept in this process for the trajectory's
later calls (Claw-R1 stamps them on its steps): with several workers a call may reach another
one, whose turn then has neither; the registration row has both whichever worker took it.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from claw_pipelines.access import is_loopback
from claw_pipelines.capture.prompt_prefixes import land_turns
from claw_pipelines.capture.request_body import replay
from claw_pipelines.capture.request_context import context_from_body, current_request
from claw_pipelines.capture.runtime import CaptureRuntime
from claw_pipelines.edge.claw_r1.answers import chat_answer, completion_request, generate_answer
from claw_pipelines.edge.claw_r1.protocol import (
    DEFAULT_CHANNEL,
    CompleteTrajectory,
    GenerateAnswer,
    GenerateRequest,
    InitTrajectoryAnswer,
    RegisterTrajectory,
    SubmitSteps,
    SubmitStepsAnswer,
)
from claw_pipelines.edge.claw_r1.rows import completion_row, registration_row, step_rows
from claw_pipelines.edge.claw_r1.served import ClawR1Config
from claw_pipelines.edge.control import invalid_request
from claw_pipelines.edge.inner import CapturedResponse, inner_scope
from claw_pipelines.edge.restream import sse_from_completion
from claw_pipelines.identity import IdentityValue
from claw_pipelines.schemas import new_id, utc_now

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
ROOT_ROUTES = frozenset({"/init_trajectory", "/submit_steps", "/generate"})
TRAJECTORY_ROUTE = re.compile(
    r"^/[^/]+/[^/]+/v1/(chat/completions|register_trajectory|complete_trajectory)$"
)
IDENTITY_HEADERS = (
    b"x-claw-trajectory",
    b"x-claw-group",
    b"x-claw-channel",
    b"x-claw-policy-version",
)
ASGI_KEYS = frozenset({"type", "asgi", "http_version", "method", "scheme", "server",
                       "client", "root_path", "path", "raw_path", "query_string", "headers",
                       "state"})  # fmt: skip
"""The request's own scope keys: FastAPI adds its routing state, which LiteLLM's app must not
inherit."""
MAX_REGISTRATIONS = 100_000


class Registrations:
    """Channel and policy version per registered trajectory, in this process (bounded)."""

    def __init__(self) -> None:
        self._held: OrderedDict[str, dict[bytes, bytes]] = OrderedDict()

    def remember(self, trajectory: str, body: RegisterTrajectory) -> None:
        headers = {b"x-claw-channel": body.channel.encode()}
        if (version := body.policy_version) is not None:
            headers[b"x-claw-policy-version"] = str(version).encode()
        self._held[trajectory] = headers
        while len(self._held) > MAX_REGISTRATIONS:
            self._held.popitem(last=False)

    def headers(self, trajectory: str) -> dict[bytes, bytes]:
        return self._held.get(trajectory, {})

    def channel(self, trajectory: str) -> str:
        return self.headers(trajectory).get(b"x-claw-channel", DEFAULT_CHANNEL.encode()).decode()

    def forget(self, trajectory: str) -> None:
        self._held.pop(trajectory, None)


class ClawR1Edge:
    """The routes, the inner app their model calls go to, and whether they need the key."""

    def __init__(self, config: ClawR1Config, inner, bind_host: str | None) -> None:
        self.config = config
        self.inner = inner
        self.keyless = bool(
            config.settings.keyless_on_loopback and bind_host and is_loopback(bind_host)
        )
        self.registrations = Registrations()
        self.app = _build_app(self)

    def serves(self, scope: dict[str, Any]) -> bool:
        path = scope["path"]
        return scope["method"] == "POST" and (
            path in ROOT_ROUTES or TRAJECTORY_ROUTE.match(path) is not None
        )

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        await self.app(scope, receive, send)

    async def call_inner(
        self, scope: dict[str, Any], body: dict[str, Any], path: str, identity: dict[bytes, bytes]
    ) -> CapturedResponse:
        """``body`` posted to our own ``path`` with these identity headers, answer collected."""
        raw = json.dumps(body).encode()
        headers = [(k, v) for k, v in scope["headers"] if k not in IDENTITY_HEADERS]
        request = {k: v for k, v in scope.items() if k in ASGI_KEYS}
        upstream = inner_scope({**request, "headers": [*headers, *identity.items()]}, raw, path)
        captured = CapturedResponse()
        await self.inner(upstream, replay(raw), captured.send)
        return captured


def _edge(request: Request) -> ClawR1Edge:
    return request.app.state.edge


def _answer(captured: CapturedResponse, body: bytes, media_type: str) -> Response:
    """``body`` with the inner answer's status and headers (``x-litellm-call-id``...)."""
    headers = {
        k.decode("latin-1"): v.decode("latin-1")
        for k, v in captured.headers
        if k.lower() not in (b"content-length", b"content-type")
    }
    return Response(body, captured.status, headers, media_type)


def _trajectory_headers(edge: ClawR1Edge, trajectory: str, group: str) -> dict[bytes, bytes]:
    return {
        **edge.registrations.headers(trajectory),
        b"x-claw-trajectory": trajectory.encode(),
        b"x-claw-group": group.encode(),
    }


async def chat_completions(
    trajectory_uid: IdentityValue, prompt_uid: IdentityValue, request: Request
) -> Response:
    """Our chat route under this identity, answered in Claw-R1's shape (``answers``); a
    streamed request is served from a non-streaming call and re-streamed."""
    edge = _edge(request)
    body = json.loads(await request.body() or b"null")
    if body is None:
        return JSONResponse({"detail": "a chat completion needs a JSON body"}, 400)
    body.setdefault("model", edge.config.settings.default_model)
    client_stream = body.pop("stream", None) is True
    include_usage = bool((body.pop("stream_options", None) or {}).get("include_usage"))
    current_request.set(context_from_body(body, client_stream))
    identity = _trajectory_headers(edge, trajectory_uid, prompt_uid)
    captured = await edge.call_inner(request.scope, body, CHAT_PATH, identity)
    if captured.status != 200:
        return _answer(captured, captured.body, "application/json")
    answer = chat_answer(json.loads(captured.body), edge.config.layout_for(str(body["model"])))
    if client_stream:
        return _answer(captured, sse_from_completion(answer, include_usage), "text/event-stream")
    return _answer(captured, json.dumps(answer).encode(), "application/json")


async def register_trajectory(
    trajectory_uid: IdentityValue,
    prompt_uid: IdentityValue,
    request: Request,
    body: RegisterTrajectory | None = None,
) -> dict[str, str]:
    body = body or RegisterTrajectory()
    runtime = CaptureRuntime.current()
    await runtime.land_durably([registration_row(runtime, trajectory_uid, prompt_uid, body)])
    _edge(request).registrations.remember(trajectory_uid, body)
    return {"status": "ok"}


async def complete_trajectory(
    trajectory_uid: IdentityValue,
    prompt_uid: IdentityValue,
    request: Request,
    body: CompleteTrajectory | None = None,
) -> dict[str, str]:
    """The body is optional (Claw-R1's agent flow sends none)."""
    registrations = _edge(request).registrations
    channel = body.channel if body else registrations.channel(trajectory_uid)
    row = completion_row(trajectory_uid, prompt_uid, body, channel)
    await CaptureRuntime.current().land_durably([row])
    registrations.forget(trajectory_uid)
    return {"status": "ok"}


async def init_trajectory(request: Request) -> InitTrajectoryAnswer:
    """A fresh trajectory in a fresh group, at the address the caller reached."""
    trajectory = new_id()
    base = str(request.base_url).rstrip("/")
    return InitTrajectoryAnswer(
        trajectory_uid=trajectory, base_url=f"{base}/{trajectory}/{new_id()}/v1"
    )


async def submit_steps(
    body: SubmitSteps, channel: IdentityValue = DEFAULT_CHANNEL
) -> SubmitStepsAnswer:
    runtime = CaptureRuntime.current()
    await land_turns(runtime, step_rows(runtime, body.steps, channel, utc_now()))
    return SubmitStepsAnswer(accepted=len(body.steps))


async def generate(body: GenerateRequest, request: Request) -> GenerateAnswer | Response:
    """The token-ID prompt through the default model's token-prompt twin (``config``)."""
    edge = _edge(request)
    model = edge.config.generate_model
    if model is None:
        return JSONResponse(
            {"detail": "/generate needs a vLLM-protocol (hosted_vllm/) default model; "
                       f"{edge.config.settings.default_model!r} is not one"},
            501,
        )  # fmt: skip
    identity = {}
    if body.trajectory_uid is not None:
        identity = _trajectory_headers(edge, body.trajectory_uid, body.prompt_uid or "")
    call = completion_request(body, model, edge.config.settings.response_length)
    captured = await edge.call_inner(request.scope, call, COMPLETIONS_PATH, identity)
    if captured.status != 200:
        return _answer(captured, captured.body, "application/json")
    answer = generate_answer(json.loads(captured.body), bool(body.sampling_params.get("logprobs")))
    if answer is None:
        return JSONResponse({"detail": "the engine returned no token IDs"}, 502)
    return _answer(captured, answer.model_dump_json().encode(), "application/json")


def _build_app(edge: ClawR1Edge) -> FastAPI:
    app = FastAPI(title="Claw-R1 gateway routes", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.edge = edge

    @app.exception_handler(RequestValidationError)
    async def _invalid(_, error: RequestValidationError) -> JSONResponse:
        return invalid_request(error.errors())

    trajectory = "/{trajectory_uid}/{prompt_uid}/v1"
    app.add_api_route(f"{trajectory}/chat/completions", chat_completions, methods=["POST"])
    app.add_api_route(f"{trajectory}/register_trajectory", register_trajectory, methods=["POST"])
    app.add_api_route(f"{trajectory}/complete_trajectory", complete_trajectory, methods=["POST"])
    app.add_api_route("/init_trajectory", init_trajectory, methods=["POST"])
    app.add_api_route("/submit_steps", submit_steps, methods=["POST"])
    app.add_api_route("/generate", generate, methods=["POST"], response_model=None)
    return app
