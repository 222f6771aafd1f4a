"""The agent APIs the proxy captures: which one a request path or a LiteLLM call type speaks.

Paths are matched after the ``/t/<trajectory>/<group>`` prefix is removed, with or without
``/v1`` (clients differ in how they join ``base_url`` and the route); a query string such as
Claude Code's ``?beta=true`` is not part of the path.
"""

from __future__ import annotations

from claw_pipelines.schemas import AgentApi

API_ROUTES: dict[str, AgentApi] = {
    "chat/completions": "chat",
    "completions": "completions",
    "responses": "responses",
    "messages": "messages",
}
API_PATHS: dict[str, AgentApi] = {
    f"{prefix}/{route}": api for route, api in API_ROUTES.items() for prefix in ("", "/v1")
}
CALL_TYPE_APIS: dict[str, AgentApi] = {
    "completion": "chat",
    "acompletion": "chat",
    "text_completion": "completions",
    "atext_completion": "completions",
    "responses": "responses",
    "aresponses": "responses",
    "anthropic_messages": "messages",
}
"""LiteLLM's ``call_type`` of each captured route, as its hooks receive it (1.108.7)."""
NATIVE_APIS: frozenset[AgentApi] = frozenset({"responses", "messages"})
"""APIs whose requests the proxy can serve through the engine's chat call (see bridge.py)."""


def api_for_path(path: str) -> AgentApi | None:
    return API_PATHS.get(path.rstrip("/"))
