"""The proxy's ASGI entry: LiteLLM's app wrapped with what capture needs at the HTTP edge.

- A client's ``x-litellm-call-id`` header is dropped: LiteLLM would adopt it as the call id, which
  is the turn id, so every call gets its own id (returned in the response's ``x-litellm-call-id``).
- ``/t/<trajectory>/<group>/...`` is rewritten to ``/...`` with ``x-claw-*`` identity headers, so a
  black-box agent only changes its ``base_url``.
- ``GET``/``HEAD /`` answer 200 without a key (agents such as Claude Code probe the base URL).
- Request bodies are checked before LiteLLM sees them: size limit (413), UTF-8 and JSON (400);
  Responses and Messages requests against their APIs' rules (``api_requests``, 400 naming the
  field).
- A text completion's token-ID prompt goes to its model's token-prompt twin (``token_prompts``),
  or is refused with a 400 naming the field.
- Responses and Messages requests to models with ``api_mode: bridge`` are served through the
  engine's chat completions call (bridge.py), so their turns carry the engine's token IDs.
- Streamed chat and text completion requests to exact-capture models are served from a
  non-streaming upstream call and re-streamed in vLLM's chunk shape (LiteLLM drops token IDs from
  streams).
- ``/claw/v1/...`` goes to the lifecycle/reward/step/policy endpoints.
- With ``claw_compat.claw_r1`` on, Claw-R1's gateway routes go to ``claw_r1.routes`` (on a
  loopback bind without a key, if the block allows it; LiteLLM is handed the master key).
- Model calls pass ``policy.gate.PolicyGate``: held during a weight-sync pause, stamped with the
  version served.
- On lifespan shutdown (SIGTERM/SIGINT) the spool is committed before the process exits.
- Once LiteLLM has started, what start-up left on the heap is frozen out of garbage collection
  (``frozen_heap``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from litellm.proxy.proxy_server import app as litellm_app
from litellm.types.utils import ModelResponse

from claw_pipelines.capture.apis import api_for_path
from claw_pipelines.capture.bridge import BRIDGES, Bridge, BridgeRequestError
from claw_pipelines.capture.request_body import (
    BodyRejected,
    parse_json_object,
    read_body,
    replay,
)
from claw_pipelines.capture.request_context import context_from_body, current_request
from claw_pipelines.capture.runtime import CaptureRuntime, ModelCapture
from claw_pipelines.edge.api_requests import RequestShapeError, check_request
from claw_pipelines.edge.claw_r1.config import BIND_HOST_ENV
from claw_pipelines.edge.claw_r1.routes import ClawR1Edge
from claw_pipelines.edge.claw_r1.served import ClawR1Config
from claw_pipelines.edge.control import build_control_app
from claw_pipelines.edge.frozen_heap import freezing_after_startup
from claw_pipelines.edge.inner import (
    CapturedResponse,
    ChatChunkStream,
    inner_scope,
    send_body,
    without_entity_headers,
)
from claw_pipelines.edge.restream import sse_from_completion, sse_from_text_completion
from claw_pipelines.edge.token_prompts import TokenPromptError, TokenPrompts
from claw_pipelines.identity import split_identity_prefix
from claw_pipelines.policy.gate import PolicyGate
from claw_pipelines.settings import get_settings

Scope = dict[str, Any]
Restreamer = Callable[[dict[str, Any], bool], bytes]
RESTREAMERS: dict[str, Restreamer] = {
    "chat": sse_from_completion,
    "completions": sse_from_text_completion,
}
CHAT_PATH = "/v1/chat/completions"
JSON = b"application/json"
SSE = b"text/event-stream"
PUBLIC_PATHS = frozenset({"/health/liveliness", "/health/readiness"})
BODYLESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Requests of any other method have their body checked (limit, JSON) on every route."""
KEY_HEADERS = (b"authorization", b"x-api-key", b"api-key", b"x-litellm-api-key")
CALL_ID_HEADER = b"x-litellm-call-id"
ROOT_TEXT = b"claw capture proxy\n"


def _has_master_key(scope: Scope) -> bool:
    """Only the master key authenticates (virtual keys need LiteLLM's database, not used here).

    Checked at the edge because LiteLLM 1.108.7 answers a bad key with a 500 when it has no
    database client installed.
    """
    master = os.environ.get("LITELLM_MASTER_KEY", "")
    for name, value in scope["headers"]:
        if name in KEY_HEADERS:
            token = value.decode("latin-1").removeprefix("Bearer ").strip()
            if master and hmac.compare_digest(token, master):
                return True
    return False


def _with_master_key(scope: Scope) -> Scope:
    """The request as authenticated by the edge: LiteLLM sees the master key, not the client's."""
    master = os.environ.get("LITELLM_MASTER_KEY", "")
    headers = [(name, value) for name, value in scope["headers"] if name not in KEY_HEADERS]
    return {**scope, "headers": [*headers, (b"authorization", f"Bearer {master}".encode())]}


def _without_client_call_id(scope: Scope) -> Scope:
    """Clients reusing one call id would otherwise share, and corrupt, one turn row."""
    headers = [(name, value) for name, value in scope["headers"] if name != CALL_ID_HEADER]
    return {**scope, "headers": headers}


async def _send_json(send, status: int, payload: dict[str, Any]) -> None:
    await send_body(send, status, [], json.dumps(payload).encode(), JSON)


async def _send_root(send) -> None:
    """A plain 200 for the base URL: clients probe it to see whether the server is up (the
    server leaves out the body of a HEAD answer)."""
    await send_body(send, 200, [], ROOT_TEXT, b"text/plain; charset=utf-8")


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


async def _send_unauthorized(send) -> None:
    await _send_json(send, 401, _error("missing or invalid proxy key", "authentication_error"))


class CaptureApp:
    """ASGI wrapper around LiteLLM's proxy app (see module docstring)."""

    def __init__(
        self,
        inner,
        max_body_bytes: int,
        claw_r1: ClawR1Config | None = None,
        bind_host: str | None = None,
        token_prompts: TokenPrompts | None = None,
    ) -> None:
        self.inner = PolicyGate(inner, lambda: CaptureRuntime.current().policy)
        self.control = build_control_app()
        self.max_body_bytes = max_body_bytes
        self.token_prompts = token_prompts or TokenPrompts({})
        self.claw_r1 = None if claw_r1 is None else ClawR1Edge(claw_r1, self.inner, bind_host)

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self.inner(scope, self._watch_shutdown(receive), freezing_after_startup(send))
            return
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        scope = _without_client_call_id(scope)
        if self.claw_r1 is not None and self.claw_r1.serves(scope):
            await self._claw_r1(scope, receive, send)
            return
        scope = self._apply_identity_prefix(scope)
        if scope["path"] == "/" and scope["method"] in ("GET", "HEAD"):
            await _send_root(send)
            return
        if scope["path"] not in PUBLIC_PATHS and not _has_master_key(scope):
            await _send_unauthorized(send)
            return
        if scope["path"].startswith("/claw/"):
            await self.control(scope, receive, send)
            return
        if scope["method"] in BODYLESS_METHODS:
            await self.inner(scope, receive, send)
            return
        read = await self._read_body(receive, send)
        if read is not None:
            await self._serve_call(scope, *read, send)

    async def _claw_r1(self, scope: Scope, receive, send) -> None:
        if not (self.claw_r1.keyless or _has_master_key(scope)):
            await _send_unauthorized(send)
            return
        read = await self._read_body(receive, send)
        if read is not None:
            await self.claw_r1(_with_master_key(scope), replay(read[0]), send)

    async def _serve_call(
        self, scope: Scope, body: bytes, request: dict[str, Any] | None, send
    ) -> None:
        """Route a call by the API it speaks and the capture options of its model."""
        api = api_for_path(scope["path"])
        try:
            request, body = self._checked(api, request, body)
        except (RequestShapeError, TokenPromptError) as error:
            message = f"invalid {api} request: {error}"
            native = BRIDGES.get(api)
            payload = (
                native.error_body(400, message)
                if native
                else _error(message, "invalid_request_error")
            )
            await _send_json(send, 400, payload)
            return
        options = _options(request)
        stream = request is not None and request.get("stream") is True
        if api in BRIDGES and options.api_mode == "bridge":
            passthrough = stream and options.stream_mode == "passthrough"
            await self._bridged(scope, request, send, BRIDGES[api], passthrough)
            return
        restream = RESTREAMERS.get(api) if stream and options.stream_mode == "buffered" else None
        current_request.set(context_from_body(request, client_stream=restream is not None))
        if restream is not None:
            await self._buffered_stream(scope, request, send, restream)
            return
        await self.inner(scope, replay(body), send)

    def _checked(
        self, api: str | None, request: dict[str, Any] | None, body: bytes
    ) -> tuple[dict[str, Any] | None, bytes]:
        """The request and body to serve: a Responses or Messages request checked against its
        API's rules, a token-ID text completion sent to its model's twin."""
        if request is None:
            return request, body
        if api in BRIDGES:
            check_request(api, request)
        if api == "completions":
            routed = self.token_prompts.routed(request)
            if routed is not request:
                return routed, json.dumps(routed).encode()
        return request, body

    def _watch_shutdown(self, receive):
        async def wrapped() -> dict[str, Any]:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await asyncio.to_thread(CaptureRuntime.shutdown_current)
            return message

        return wrapped

    @staticmethod
    def _apply_identity_prefix(scope: Scope) -> Scope:
        raw_path = scope.get("raw_path")
        split = split_identity_prefix(raw_path.decode("latin-1") if raw_path else scope["path"])
        if split is None:
            return scope
        trajectory, group, rest = split
        headers = [
            (k, v) for k, v in scope["headers"] if k not in (b"x-claw-trajectory", b"x-claw-group")
        ]
        headers += [(b"x-claw-trajectory", trajectory.encode()), (b"x-claw-group", group.encode())]
        return {
            **scope,
            "path": unquote(rest),
            "raw_path": rest.encode("latin-1"),
            "headers": headers,
        }

    async def _read_body(self, receive, send) -> tuple[bytes, dict[str, Any] | None] | None:
        """The whole body and its parsed JSON object (None if empty), or None after answering
        413/400 for a body ``request_body`` refuses (the message names the field)."""
        try:
            body = await read_body(receive, self.max_body_bytes)
            if body is None:
                return None
            return body, parse_json_object(body)
        except BodyRejected as rejected:
            kind = "request_too_large" if rejected.status == 413 else "invalid_request_error"
            await _send_json(send, rejected.status, _error(rejected.message, kind))
            return None

    async def _buffered_stream(
        self, scope: Scope, request: dict[str, Any], send, restream: Restreamer
    ) -> None:
        include_usage = bool((request.pop("stream_options", None) or {}).get("include_usage"))
        request["stream"] = False
        upstream_body = json.dumps(request).encode()
        captured = CapturedResponse()
        await self.inner(inner_scope(scope, upstream_body), replay(upstream_body), captured.send)
        if captured.status != 200:
            await captured.forward(send)
            return
        stream = restream(json.loads(captured.body), include_usage)
        await send_body(send, 200, captured.headers, stream, SSE)

    async def _bridged(
        self,
        scope: Scope,
        request: dict[str, Any] | None,
        send,
        bridge_type: type[Bridge],
        passthrough: bool,
    ) -> None:
        """Serve a Responses or Messages call through the inner app's chat completions route."""
        try:
            bridge = bridge_type.from_request(request or {})
            chat = bridge.chat_request(stream=passthrough)
        except BridgeRequestError as error:
            await _send_json(send, 400, bridge_type.error_body(400, str(error)))
            return
        client_stream = bool(request and request.get("stream") is True)
        current_request.set(context_from_body(request, client_stream, bridge))
        body = json.dumps(chat).encode()
        upstream = inner_scope(scope, body, CHAT_PATH)
        if passthrough:
            await self._bridged_stream(upstream, body, send, bridge)
            return
        captured = CapturedResponse()
        await self.inner(upstream, replay(body), captured.send)
        if captured.status != 200:
            error = bridge.upstream_error(captured.status, captured.body)
            await send_body(send, captured.status, captured.headers, error, JSON)
            return
        if bridge.answer is None:
            bridge.answered(ModelResponse(**json.loads(captured.body)))
        if client_stream:
            await send_body(send, 200, captured.headers, bridge.events(), SSE)
        else:
            await send_body(send, 200, captured.headers, json.dumps(bridge.answer).encode(), JSON)

    async def _bridged_stream(self, scope: Scope, body: bytes, send, bridge: Bridge) -> None:
        """Translate the inner app's chat stream into the API's events as its chunks come."""
        stream = ChatChunkStream()

        async def call_inner() -> None:
            try:
                await self.inner(scope, replay(body), stream.send)
            finally:
                stream.finish()

        task = asyncio.create_task(call_inner())
        try:
            await stream.started.wait()
            if stream.status != 200:
                await task
                error = bridge.upstream_error(stream.status, bytes(stream.error))
                await send_body(send, stream.status, stream.headers, error, JSON)
                return
            headers = [*without_entity_headers(stream.headers), (b"content-type", SSE)]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            async for frame in bridge.stream(stream.chunks()):
                await send({"type": "http.response.body", "body": frame, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            await task
        finally:
            task.cancel()


def _options(request: dict[str, Any] | None) -> ModelCapture:
    model = str(request.get("model", "")) if request is not None else ""
    return CaptureRuntime.current().options_for(model)


app = CaptureApp(
    litellm_app,
    get_settings().max_body_bytes,
    ClawR1Config.load(os.environ.get("CONFIG_FILE_PATH")),
    os.environ.get(BIND_HOST_ENV),
    TokenPrompts.load(os.environ.get("CONFIG_FILE_PATH")),
)
