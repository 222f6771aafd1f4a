"""The proxy's ASGI entry: LiteLLM's app wrapped with what capture needs at the HTTP edge.

- A client's ``x-litellm-call-id`` header is dropped: LiteLLM would adopt it as the call id, which
  is the turn id, so every call gets its own id (returned in the response's ``x-litellm-call-id``).
- ``/t/<trajectory>/<group>/...`` is rewritten to ``/...`` with ``x-claw-*`` identity headers, so a
  black-box agent only changes its ``base_url``.
- Request bodies are checked before LiteLLM sees them: size limit (413), UTF-8 and JSON (400).
- Streamed chat and text completion requests to exact-capture models are served from a
  non-streaming upstream call and re-streamed in vLLM's chunk shape (LiteLLM drops token IDs from
  streams).
- ``/claw/v1/...`` goes to the lifecycle/reward/step/policy endpoints.
- Model calls pass ``policy.PolicyGate``: held during a weight-sync pause, stamped with the
  version served.
- On lifespan shutdown (SIGTERM/SIGINT) the spool is committed before the process exits.
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

from claw_pipelines.capture.control import build_control_app
from claw_pipelines.capture.identity import split_identity_prefix
from claw_pipelines.capture.policy import PolicyGate
from claw_pipelines.capture.request_body import (
    BodyRejected,
    parse_json_object,
    read_body,
    replay,
)
from claw_pipelines.capture.request_context import context_from_body, current_request
from claw_pipelines.capture.restream import sse_from_completion, sse_from_text_completion
from claw_pipelines.capture.runtime import CaptureRuntime
from claw_pipelines.settings import get_settings

Scope = dict[str, Any]
Restreamer = Callable[[dict[str, Any], bool], bytes]
RESTREAMERS = {
    "/v1/chat/completions": sse_from_completion,
    "/chat/completions": sse_from_completion,
    "/v1/completions": sse_from_text_completion,
    "/completions": sse_from_text_completion,
}
PUBLIC_PATHS = frozenset({"/health/liveliness", "/health/readiness"})
BODYLESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Requests of any other method have their body checked (limit, JSON) on every route."""
KEY_HEADERS = (b"authorization", b"x-api-key", b"api-key", b"x-litellm-api-key")
CALL_ID_HEADER = b"x-litellm-call-id"


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


def _without_client_call_id(scope: Scope) -> Scope:
    """Clients reusing one call id would otherwise share, and corrupt, one turn row."""
    headers = [(name, value) for name, value in scope["headers"] if name != CALL_ID_HEADER]
    return {**scope, "headers": headers}


async def _send_json(send, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


class CaptureApp:
    """ASGI wrapper around LiteLLM's proxy app (see module docstring)."""

    def __init__(self, inner, max_body_bytes: int) -> None:
        self.inner = PolicyGate(inner, lambda: CaptureRuntime.current().policy)
        self.control = build_control_app()
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self.inner(scope, self._watch_shutdown(receive), send)
            return
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        scope = self._apply_identity_prefix(_without_client_call_id(scope))
        if scope["path"] not in PUBLIC_PATHS and not _has_master_key(scope):
            await _send_json(
                send, 401, _error("missing or invalid proxy key", "authentication_error")
            )
            return
        if scope["path"].startswith("/claw/"):
            await self.control(scope, receive, send)
            return
        if scope["method"] in BODYLESS_METHODS:
            await self.inner(scope, receive, send)
            return
        read = await self._read_body(receive, send)
        if read is None:
            return
        body, request = read
        restream = RESTREAMERS.get(scope["path"])
        buffer_stream = restream is not None and self._should_buffer_stream(request)
        current_request.set(context_from_body(request, client_stream=buffer_stream))
        if buffer_stream:
            await self._buffered_stream(scope, request, send, restream)
            return
        await self.inner(scope, replay(body), send)

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

    @staticmethod
    def _should_buffer_stream(request: dict[str, Any] | None) -> bool:
        if request is None or request.get("stream") is not True:
            return False
        options = CaptureRuntime.current().options_for(str(request.get("model", "")))
        return options.stream_mode == "buffered"

    async def _buffered_stream(
        self, scope: Scope, request: dict[str, Any], send, restream: Restreamer
    ) -> None:
        include_usage = bool((request.pop("stream_options", None) or {}).get("include_usage"))
        request["stream"] = False
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
        upstream_body = json.dumps(request).encode()
        headers.append((b"content-length", str(len(upstream_body)).encode()))
        captured = _CapturedResponse()
        await self.inner({**scope, "headers": headers}, replay(upstream_body), captured.send)
        if captured.status != 200:
            await captured.forward(send)
            return
        stream = restream(json.loads(captured.body), include_usage)
        response_headers = [
            (k, v)
            for k, v in captured.headers
            if k.lower() not in (b"content-length", b"content-type")
        ]
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [*response_headers, (b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": stream})


class _CapturedResponse:
    """Collects an inner ASGI response so it can be re-shaped before it reaches the client."""

    def __init__(self) -> None:
        self.status = 500
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            self.chunks.append(message.get("body", b""))

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    async def forward(self, send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})


app = CaptureApp(litellm_app, get_settings().max_body_bytes)
