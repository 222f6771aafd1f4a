"""What the HTTP edge knows about a request, handed to the LiteLLM hooks of the same request.

LiteLLM merges its own fields into the body's ``metadata`` before any hook runs, so the edge
keeps the caller's original metadata (and whether the client asked for a stream that the edge
serves from a non-streaming upstream call) in a context variable, which follows the request
into the hooks.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RequestContext:
    body_metadata: dict[str, Any] | None
    client_stream: bool


current_request: ContextVar[RequestContext | None] = ContextVar("claw_request", default=None)


def context_from_body(request: object, client_stream: bool) -> RequestContext:
    metadata = request.get("metadata") if isinstance(request, dict) else None
    return RequestContext(metadata if isinstance(metadata, dict) else None, client_stream)
