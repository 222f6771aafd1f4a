"""Tools: the engine calls only the calculator and never makes up a call to an agent's own tool."""

from __future__ import annotations

import random

import pytest
from fastapi.testclient import TestClient

from claw_pipelines.demo import CALCULATOR_TOOL
from claw_pipelines.engine.policy import NO_TASK_REPLY, respond_chat
from claw_pipelines.engine.protocol import Message, Tool
from claw_pipelines.engine.tasks import parse_final_answer


def function(name: str, **properties: dict) -> dict:
    schema = {"type": "object", "properties": properties, "required": list(properties)}
    return {"type": "function", "function": {"name": name, "parameters": schema}}


BASH = function("Bash", command={"type": "string"})
READ = function("Read", file_path={"type": "string"})
APPLY_PATCH = function("apply_patch", input={"type": "string"})
AGENT_TOOLS = [BASH, READ, APPLY_PATCH]
QUESTION = [Message(role="user", content="What is 37 + 45?")]


def tools(*declared: dict) -> list[Tool]:
    return [Tool.model_validate(tool) for tool in declared]


@pytest.mark.parametrize("choice", [None, "auto", "required", "Bash", "apply_patch"])
def test_an_agents_own_tools_are_never_called(choice: str | None) -> None:
    """With a task and only a shell / file / patch tool, every draft is a plain-text answer."""
    for seed in range(60):
        draft = respond_chat(QUESTION, tools(*AGENT_TOOLS), choice, 200, random.Random(seed))
        assert draft.tool_call is None
        assert draft.text


def test_required_without_the_calculator_answers_the_task_in_text(client: TestClient) -> None:
    body = {"messages": [{"role": "user", "content": "What is 37 + 45?"}], "seed": 3}
    for choice in ("required", {"type": "function", "function": {"name": "Bash"}}):
        response = client.post(
            "/v1/chat/completions",
            json={**body, "tools": AGENT_TOOLS, "tool_choice": choice, "max_tokens": 2000},
        )
        message = response.json()["choices"][0]["message"]
        assert "tool_calls" not in message
        assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_only_the_calculator_is_called_among_an_agents_tools() -> None:
    declared = tools(BASH, CALCULATOR_TOOL, READ)
    calls = [
        respond_chat(QUESTION, declared, "required", 200, random.Random(seed)).tool_call
        for seed in range(30)
    ]
    assert {call.name for call in calls if call} == {"calculator"}
    assert all(calls)


def test_a_calculator_taking_other_arguments_is_not_called() -> None:
    other = tools(function("calculator", a={"type": "number"}, b={"type": "number"}))
    for seed in range(30):
        assert respond_chat(QUESTION, other, "required", 200, random.Random(seed)).tool_call is None


def test_no_task_with_a_forced_tool_is_the_canned_reply() -> None:
    hello = [Message(role="user", content="Fix the failing test in src/app.py")]
    for choice in ("required", "calculator", "Bash"):
        draft = respond_chat(hello, tools(CALCULATOR_TOOL, BASH), choice, 200, random.Random(0))
        assert (draft.text, draft.tool_call) == (NO_TASK_REPLY, None)


def test_a_long_window_does_not_make_a_ramble_endless() -> None:
    """With 32k tokens of room a ramble stops by itself, well short of the limit."""
    drafts = [respond_chat(QUESTION, [], None, 32_000, random.Random(s)) for s in range(300)]
    rambles = [d for d in drafts if parse_final_answer(d.text) is None]
    assert rambles
    assert all(len(d.text) < 10_000 for d in rambles)
