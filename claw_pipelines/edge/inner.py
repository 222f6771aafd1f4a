"""The edge's calls to the inner LiteLLM app: a rewritten request, and its response collected
whole (to re-shape it) or read as a stream of chat chunks (to translate them as they come)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from litellm.types.utils import ModelResponseStream

Scope = dict[str, Any]
Headers = list[tuple[bytes, bytes]]
SSE_DATA = b"data: "
SSE_DONE = b"[DONE]"


def inner_scope(scope: Scope, body: bytes, path: str | None = None) -> Scope:
    """``scope`` for a new ``body`` (its own content-length) and, if given, another path."""
    headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    rewritten = {**scope, "headers": headers}
    if path is not None:
        rewritten |= {"path": path, "raw_path": path.encode(), "query_string": b""}
    return rewritten


def without_entity_headers(headers: Headers) -> Headers:
    """Response headers to keep when the edge sends a body of its own (x-litellm-call-id...)."""
    return [(k, v) for k, v in headers if k.lower() not in (b"content-length", b"content-type")]


async def send_body(send, status: int, headers: Headers, body: bytes, content_type: bytes) -> None:
    headers = [
        *without_entity_headers(headers),
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class CapturedResponse:
    """Collects an inner ASGI response so it can be re-shaped before it reaches the client."""

    def __init__(self) -> None:
        self.status = 500
        self.headers: Headers = []
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


class ChatChunkStream:
    """Reads an inner streamed chat response as LiteLLM chunks, as they arrive.

    A response that is not a 200 stream is collected whole (``error``) instead.
    """

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.status = 500
        self.headers: Headers = []
        self.error = bytearray()
        self._queue: asyncio.Queue[ModelResponseStream | None] = asyncio.Queue()
        self._pending = b""

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = list(message.get("headers", []))
            self.started.set()
        elif message["type"] == "http.response.body":
            if self.status != 200:
                self.error += message.get("body", b"")
                return
            self._parse(message.get("body", b""))
            if not message.get("more_body"):
                self.finish()

    def _parse(self, data: bytes) -> None:
        frames = (self._pending + data).split(b"\n\n")
        self._pending = frames.pop()
        for frame in frames:
            for line in frame.splitlines():
                if not line.startswith(SSE_DATA):
                    continue
                payload = line.removeprefix(SSE_DATA).strip()
                if payload == SSE_DONE:
                    self.finish()
                else:
                    self._queue.put_nowait(ModelResponseStream(**json.loads(payload)))

    def finish(self) -> None:
        """No more chunks (the stream ended, or the inner call returned or failed)."""
        self.started.set()
        self._queue.put_nowait(None)

    async def chunks(self) -> AsyncIterator[ModelResponseStream]:
        while (chunk := await self._queue.get()) is not None:
            yield chunk
