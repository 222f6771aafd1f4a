"""The shape rules of Responses and Messages requests that the edge checks before serving them.

A chat request the engine cannot take comes back a 400 naming the field; LiteLLM's translations
of these two APIs accept malformed requests the providers refuse (a ``tool`` role inside
Messages ``messages``, ``system: 5``, a tool without its name or schema, a tool result answering
no call) and serve them as something else. So the edge refuses them with a 400 naming the
field, in both ``api_mode``s. Fields these models do not name pass through unchecked.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from claw_pipelines.capture.request_body import path_text
from claw_pipelines.schemas import AgentApi


class RequestShapeError(ValueError):
    """A request the API's rules refuse; ``field`` is its path (``messages[1].role``)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field


MESSAGES_ROLES = ("user", "assistant", "system")


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextBlock(_Open):
    type: Literal["text"]
    text: str


class MessagesTool(_Open):
    """A custom tool needs a name and a JSON schema; server tools (``type: web_search_…``) have
    no schema."""

    type: str = "custom"
    name: str = Field(min_length=1)
    input_schema: dict[str, Any] | None = Field(default=None, validate_default=True)

    @field_validator("input_schema")
    @classmethod
    def _custom_has_schema(cls, schema: dict | None, info: ValidationInfo) -> dict | None:
        if schema is None and info.data.get("type") == "custom":
            raise ValueError("a custom tool needs `input_schema` (a JSON schema object)")
        return schema


class MessagesMessage(_Open):
    role: str
    content: str | list[dict[str, Any]]

    @field_validator("role")
    @classmethod
    def _a_messages_role(cls, role: str) -> str:
        """``system`` too: Claude Code sends mid-conversation system messages (its Agent tool's
        agent types), which LiteLLM's adapter translates to chat system messages."""
        if role not in MESSAGES_ROLES:
            raise ValueError(f"must be one of {', '.join(MESSAGES_ROLES)}, not {role!r}")
        return role


class MessagesShape(_Open):
    messages: list[MessagesMessage]
    system: str | list[TextBlock] | None = None
    tools: list[MessagesTool] | None = None


class ResponsesTool(_Open):
    """A function tool needs a name; built-in tools (``web_search``…) have none."""

    type: str
    name: str | None = Field(default=None, min_length=1, validate_default=True)

    @field_validator("name")
    @classmethod
    def _function_has_name(cls, name: str | None, info: ValidationInfo) -> str | None:
        if name is None and info.data.get("type") == "function":
            raise ValueError("a function tool needs a `name`")
        return name


class ResponsesShape(_Open):
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None


SHAPES: dict[AgentApi, type[BaseModel]] = {"messages": MessagesShape, "responses": ResponsesShape}


def check_request(api: AgentApi, request: dict[str, Any]) -> None:
    """Raise ``RequestShapeError`` for the first rule ``request`` breaks."""
    try:
        SHAPES[api].model_validate(request)
    except ValidationError as error:
        first = error.errors()[0]
        raise RequestShapeError(_field_path(request, first["loc"]), first["msg"]) from error
    unanswered = _unanswered_messages_result(request) if api == "messages" else None
    if api == "responses":
        unanswered = _unanswered_responses_output(request)
    if unanswered is not None:
        raise RequestShapeError(path_text(unanswered), "answers no earlier tool call")


def _field_path(request: dict[str, Any], loc: tuple) -> str:
    """``loc`` of a validation error as a path into ``request``: the names pydantic adds for
    the members of a union (``system.str``) are left out; a missing field, last, is kept."""
    path: list[object] = []
    node: object = request
    for k, part in enumerate(loc):
        within = isinstance(node, list) and isinstance(part, int) and part < len(node)
        if within or (isinstance(node, dict) and part in node):
            node = node[part]
        elif not (k == len(loc) - 1 and isinstance(node, dict)):
            continue
        path.append(part)
    return path_text(tuple(path))


def _unanswered_messages_result(request: dict[str, Any]) -> tuple | None:
    """The path of the first ``tool_result`` whose ``tool_use_id`` no earlier ``tool_use`` has."""
    calls: set[object] = set()
    for i, message in enumerate(request["messages"]):
        blocks = message["content"] if isinstance(message["content"], list) else []
        for j, block in enumerate(blocks):
            if block.get("type") == "tool_use":
                calls.add(block.get("id"))
            elif block.get("type") == "tool_result" and block.get("tool_use_id") not in calls:
                return ("messages", i, "content", j, "tool_use_id")
    return None


def _unanswered_responses_output(request: dict[str, Any]) -> tuple | None:
    """The path of the first ``function_call_output`` whose ``call_id`` no earlier
    ``function_call`` has; a request continuing a stored response (a native backend's
    ``previous_response_id``) may answer the calls of that response."""
    if request.get("previous_response_id") is not None:
        return None
    items = request["input"] if isinstance(request["input"], list) else []
    calls: set[object] = set()
    for i, item in enumerate(items):
        if item.get("type") == "function_call":
            calls.add(item.get("call_id"))
        elif item.get("type") == "function_call_output" and item.get("call_id") not in calls:
            return ("input", i, "call_id")
    return None
