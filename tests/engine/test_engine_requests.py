"""Request shapes vLLM accepts are accepted: what LiteLLM's bridges and agent CLIs send."""

from __future__ import annotations

import asyncio
import json

import litellm
import pytest
from fastapi.testclient import TestClient
from litellm.llms.anthropic.pass_through.adapters.transformation import (
    LiteLLMAnthropicMessagesAdapter,
)
from litellm.responses.litellm_completion_transformation.transformation import (
    LiteLLMCompletionResponsesConfig,
)

from claw_pipelines.engine.tasks import parse_final_answer
from claw_pipelines.engine.tokenizer import decode
from claw_pipelines.processes import Service

BASH = {
    "name": "Bash",
    "description": "Run a shell command.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
EPHEMERAL = {"type": "ephemeral"}
CLAUDE_CODE_REQUEST = {
    "model": "claude-sonnet-4",
    "max_tokens": 32000,
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.0.1; cch=5f1e"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
    ],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>Today: 2025-01-15</system-reminder>"},
                {"type": "text", "text": "What is 17 + 25?", "cache_control": EPHEMERAL},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Use the shell.", "signature": "c2ln"},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "README.md"}],
                }
            ],
        },
    ],
    "tools": [BASH],
    "tool_choice": {"type": "auto"},
    "thinking": {"type": "enabled", "budget_tokens": 4000},
    "metadata": {"user_id": "user-1"},
}
CODEX_INPUT = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Codex"}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "6 times 7"}]},
]
CODEX_OPTIONS = {
    "instructions": "You are a coding agent.",
    "tools": [
        {
            "type": "function",
            "name": "shell",
            "parameters": {"type": "object", "properties": {"command": {"type": "array"}}},
        },
        {"type": "custom", "name": "apply_patch", "description": "Patch files."},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
}


def bridged(kind: str) -> dict:
    """The chat request LiteLLM's Messages or Responses bridge makes of an agent's request."""
    if kind == "messages":
        chat, _ = LiteLLMAnthropicMessagesAdapter().translate_anthropic_to_openai(
            CLAUDE_CODE_REQUEST,  # type: ignore[arg-type]
            custom_llm_provider="hosted_vllm",
        )
        return dict(chat)
    responses = LiteLLMCompletionResponsesConfig
    return responses.transform_responses_api_request_to_chat_completion_request(
        model="hosted_vllm/sim",
        input=CODEX_INPUT,  # type: ignore[arg-type]
        responses_api_request=CODEX_OPTIONS,  # type: ignore[arg-type]
        custom_llm_provider="hosted_vllm",
        stream=True,
    )


SHELL_ARITHMETIC = {
    "messages": ("Bash", "command", {"echo $((17 + 25))", "echo $((25 + 17))"}),
    "responses": ("shell", "command", {"echo $((6 * 7))", "echo $((7 * 6))"}),
}
"""The agent's shell and the commands that compute each request's task, either way round."""


@pytest.mark.parametrize(("kind", "answer"), [("messages", 42), ("responses", 42)])
def test_litellm_bridged_agent_requests_are_answered(sim: Service, kind: str, answer: int) -> None:
    """Through LiteLLM's ``hosted_vllm`` client, as the proxy sends them: answered in text, or
    the task computed by the agent's shell (never its patch tool)."""
    request = {k: v for k, v in bridged(kind).items() if k not in ("model", "custom_llm_provider")}
    request["stream"] = True

    async def run() -> tuple[str, list]:
        stream = await litellm.acompletion(
            model="hosted_vllm/sim", api_base=f"{sim.url}/v1", api_key="none", **request
        )
        text, calls = "", []
        async for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                calls += choice.delta.tool_calls or []
        return text, calls

    name, parameter, commands = SHELL_ARITHMETIC[kind]
    for _ in range(8):
        text, calls = asyncio.run(run())
        for call in calls:
            assert call.function.name == name
            command = json.loads(call.function.arguments)[parameter]
            assert (command[-1] if isinstance(command, list) else command) in commands
        assert text or calls
        if parse_final_answer(text) is not None:
            assert parse_final_answer(text) in range(answer - 10, answer + 11)


def tokens(client: TestClient, messages: list[dict]) -> list[int]:
    response = client.post("/tokenize", json={"messages": messages})
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def test_content_parts_read_as_vllm_joins_them(client: TestClient) -> None:
    parts = [
        "plain string part",
        {"type": "text", "text": "first", "cache_control": {"type": "ephemeral"}},
        {"type": "input_text", "text": "second"},
        {"type": "text", "text": None},
        {"type": "output_text", "text": "third", "annotations": []},
    ]
    joined = "plain string part\nfirst\nsecond\nthird"
    for role in ("user", "tool", "developer", "assistant"):
        assert tokens(client, [{"role": role, "content": parts}]) == tokens(
            client, [{"role": role, "content": joined}]
        )
    thinking = [{"type": "thinking", "thinking": "hm"}, {"type": "refusal", "refusal": "no"}]
    assert tokens(client, [{"role": "assistant", "content": thinking}]) == tokens(
        client, [{"role": "assistant", "content": "hm\nno"}]
    )


def test_claude_codes_billing_header_is_dropped_from_the_system_prompt(client: TestClient) -> None:
    def system(cch: str) -> list[dict]:
        header = {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2; cch={cch}"}
        return [
            {"role": "system", "content": [header, {"type": "text", "text": "You are Claude."}]},
            {"role": "user", "content": "hi"},
        ]

    first, second = tokens(client, system("aaaa")), tokens(client, system("bbbb"))
    assert first == second
    assert "billing" not in decode(first)
    assert "You are Claude." in decode(first)


def test_fields_vllm_accepts_are_accepted(client: TestClient) -> None:
    body = {
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": "What is 6 * 7?", "name": "alice"},
        ],
        "tools": [{"type": "function", "function": {"name": "Bash", "strict": False}}],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning_effort": "high",
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": False},
        "stop": ["</s>"],
        "user": "u",
        "metadata": {"session": "s"},
        "some_future_field": {"vllm": "ignores it"},
    }
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    unstreamed = {"messages": body["messages"], "stream_options": {}, "stream": None}
    assert client.post("/v1/chat/completions", json=unstreamed).status_code == 200


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        (
            {"tools": []},
            "`tools` must not be an empty array. Either provide at least one tool or omit the "
            "field entirely. (parameter=tools)",
            "tools",
        ),
        (
            {"tool_choice": "auto"},
            "When using `tool_choice`, `tools` must be set. (parameter=tool_choice)",
            "tool_choice",
        ),
        (
            {
                "tools": [{"type": "function", "function": {"name": "Bash"}}],
                "tool_choice": {"type": "function", "function": {"name": "Read"}},
            },
            "The tool specified in `tool_choice` does not match any of the specified `tools` "
            "(parameter=tool_choice)",
            "tool_choice",
        ),
        (
            {"stream_options": {"include_usage": True}},
            "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
            "stream_options",
        ),
    ],
)
def test_requests_vllm_refuses_are_refused_in_its_words(
    client: TestClient, body: dict, message: str, param: str
) -> None:
    messages = [{"role": "user", "content": "What is 6 * 7?"}]
    response = client.post("/v1/chat/completions", json={"messages": messages, **body})
    assert response.status_code == 400
    assert response.json()["error"] | {"message": message} == {
        "message": message,
        "type": "BadRequestError",
        "param": param,
        "code": 400,
    }
    assert response.json()["error"]["message"] == message


def test_non_text_content_is_refused_naming_the_part(client: TestClient) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]
    response = client.post("/v1/chat/completions", json={"messages": messages})
    assert response.status_code == 400
    assert "'image_url' is not supported" in response.json()["error"]["message"]
    effort = {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "extreme"}
    assert client.post("/v1/chat/completions", json=effort).status_code == 400
