"""Multi-turn prompts extend earlier ones token for token (what prefix-consistent steps rely on)."""

from __future__ import annotations

import json
from itertools import pairwise

from fastapi.testclient import TestClient

from claw_pipelines.demo import CALCULATOR_TOOL, calculator
from claw_pipelines.engine.tokenizer import IM_END_ID


def turn(client: TestClient, messages: list[dict], **extra) -> dict:
    body = {
        "model": "sim",
        "messages": messages,
        "tools": [CALCULATOR_TOOL],
        "return_token_ids": True,
        "max_tokens": 200,
        **extra,
    }
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_three_turn_tool_trajectory_extends_prefixes(client: TestClient) -> None:
    """Tool call, tool result, answer, then a follow-up question: every turn extends the last."""
    messages: list[dict] = [
        {"role": "system", "content": "You are a careful math assistant."},
        {"role": "user", "content": "What is 37 + 45?"},
    ]
    turns = [turn(client, messages, tool_choice="required")]
    while turns[-1]["choices"][0]["finish_reason"] == "tool_calls":
        message = turns[-1]["choices"][0]["message"]
        messages.append(message)
        for call in message["tool_calls"]:
            result = calculator(call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        turns.append(turn(client, messages))
    answer = turns[-1]["choices"][0]
    assert answer["finish_reason"] == "stop"
    assert "The answer is 82." in answer["message"]["content"]
    messages.append(answer["message"])
    messages.append({"role": "user", "content": "Thanks. What is 12 * 3?"})
    turns.append(turn(client, messages, tool_choice="none"))

    assert len(turns) >= 3
    for earlier, later in pairwise(turns):
        response_ids = earlier["choices"][0]["token_ids"]
        assert response_ids[-1] == IM_END_ID
        extended = earlier["prompt_token_ids"] + response_ids
        assert later["prompt_token_ids"][: len(extended)] == extended
        assert len(later["prompt_token_ids"]) > len(extended)


def test_streamed_turns_extend_prefixes_too(client: TestClient) -> None:
    messages: list[dict] = [{"role": "user", "content": "What is 9 * 8?"}]
    first = turn(client, messages, tool_choice="required")
    call = first["choices"][0]["message"]["tool_calls"][0]
    messages += [
        first["choices"][0]["message"],
        {"role": "tool", "tool_call_id": call["id"], "content": "72"},
    ]
    raw = client.post(
        "/v1/chat/completions",
        json={
            "messages": messages,
            "tools": [CALCULATOR_TOOL],
            "stream": True,
            "return_token_ids": True,
        },
    )
    first_chunk = raw.text.split("\n\n")[0]
    assert first_chunk.startswith("data: ")
    prompt = json.loads(first_chunk.removeprefix("data: "))["prompt_token_ids"]
    extended = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    assert prompt[: len(extended)] == extended
