"""What the HTTP edge knows about a request, handed to the LiteLLM hooks of the same request.

LiteLLM merges its own fields into the body's ``metadata`` before any hook runs (and rewrites
Responses and Messages bodies into its own call arguments), so the edge keeps the caller's
original body and metadata, whether the client asked for a stream that the edge serves from a
non-streaming upstream call, and the bridge serving a Responses or Messages call through chat,
in a context variable, which follows the request into the hooks.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from claw_pipelines.capture.bridge import Bridge


@dataclass(frozen=True)
class RequestContext:
    body_metadata: dict[str, Any] | None
    client_stream: bool
    body: dict[str, Any] | None = None
    bridge: Bridge | None = None


current_request: ContextVar[RequestContext | None] = ContextVar("claw_request", default=None)


def context_from_body(
    request: object, client_stream: bool, bridge: Bridge | None = None
) -> RequestContext:
    body = request if isinstance(request, dict) else None
    metadata = body.get("metadata") if body is not None else None
    return RequestContext(
        metadata if isinstance(metadata, dict) else None, client_stream, body, bridge
    )
