"""The engine's fixed ChatML-style chat template (Qwen/Hermes-like tool calling).

One rule drives the design: a later turn's prompt must *extend* an earlier turn's prompt plus the
response tokens, exactly. So an assistant message is rendered back to the very text the engine
generated for it (``tool_call_text`` is shared by the policy and this template, JSON written with
fixed separators), followed by the end-of-turn token the engine emits, and every turn ends at a
newline, where the tokenizer always splits.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from claw_pipelines.engine.protocol import FunctionCall, Message, Tool
from claw_pipelines.engine.tokenizer import (
    IM_END,
    IM_START,
    TOOL_CALL_END,
    TOOL_CALL_START,
    TOOLS_END,
    TOOLS_START,
)

DEFAULT_SYSTEM = "You are a helpful assistant."
TOOLS_PREAMBLE = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
)
TOOLS_POSTAMBLE = (
    "\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>{"name": <function-name>, "arguments": '
    "<args-json-object>}</tool_call>"
)
GENERATION_PROMPT = f"{IM_START}assistant\n"


def dumps(value: object) -> str:
    """The one JSON spelling used in prompts and in generated tool calls."""
    return json.dumps(value, separators=(", ", ": "), ensure_ascii=False)


def tool_call_text(call: FunctionCall) -> str:
    """How a tool call reads in the token stream; arguments that are not JSON stay a string."""
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        arguments = call.arguments
    return f"{TOOL_CALL_START}{dumps({'name': call.name, 'arguments': arguments})}{TOOL_CALL_END}"


def _turn(role: str, text: str) -> str:
    return f"{IM_START}{role}\n{text}{IM_END}\n"


def _system_text(system: Message | None, tools: Sequence[Tool]) -> str | None:
    if not tools:
        return None if system is None else system.text()
    schemas = "\n".join(dumps(tool.model_dump(exclude_none=True)) for tool in tools)
    base = DEFAULT_SYSTEM if system is None else system.text()
    return f"{base}{TOOLS_PREAMBLE}{TOOLS_START}\n{schemas}\n{TOOLS_END}{TOOLS_POSTAMBLE}"


def assistant_text(message: Message) -> str:
    """An assistant turn's body: its text, then its tool calls, one per line."""
    calls = [tool_call_text(call.function) for call in message.tool_calls or []]
    return "\n".join([message.text(), *calls] if message.text() else calls)


def render_turns(
    messages: Sequence[Message],
    tools: Sequence[Tool] | None = None,
    add_generation_prompt: bool = True,
) -> list[str]:
    """The prompt for ``messages`` turn by turn (tool schemas in the system turn); each turn
    ends at a newline, so they tokenize one by one (``tokenizer.encode_turns``)."""
    system = messages[0] if messages and messages[0].role in ("system", "developer") else None
    rest = messages[1:] if system is not None else messages
    system_text = _system_text(system, tools or [])
    parts = [] if system_text is None else [_turn("system", system_text)]
    for message in rest:
        if message.role == "assistant":
            parts.append(_turn("assistant", assistant_text(message)))
        elif message.role == "developer":
            parts.append(_turn("system", message.text()))
        else:
            parts.append(_turn(message.role, message.text()))
    if add_generation_prompt:
        parts.append(GENERATION_PROMPT)
    return parts


def render(
    messages: Sequence[Message],
    tools: Sequence[Tool] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text for ``messages``."""
    return "".join(render_turns(messages, tools, add_generation_prompt))
