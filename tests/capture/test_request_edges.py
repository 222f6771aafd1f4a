"""Bad-input edges through the real proxy: token-ID prompts on text completions land
engine-exact (LiteLLM answered them with a 500), and malformed Responses and Messages requests,
which LiteLLM's translations accepted with a 200, get a 400 naming the field."""

from __future__ import annotations

import json

import pytest
from proxy_calls import QUESTION, assert_matches_engine, client_for, landed, post
from stack_fixtures import CaptureStack

from claw_pipelines.edge.token_prompts import TOKEN_PROMPT_SUFFIX


def _engine_choices(stack: CaptureStack, response_id: str) -> list[dict]:
    lines = stack.engine_log.read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    return sorted((e for e in entries if e["id"] == response_id), key=lambda e: e["index"])


def test_token_id_prompts_land_engine_exact(capture_stack: CaptureStack) -> None:
    client = client_for(capture_stack)
    asked = {"return_token_ids": True}
    text = client.completions.with_raw_response.create(
        model="policy", prompt=QUESTION, max_tokens=4, extra_body=asked
    )
    ids = text.parse().choices[0].model_extra["prompt_token_ids"]
    (text_row,) = landed(capture_stack, [text.headers["x-litellm-call-id"]]).iter_rows(named=True)
    raw = client.completions.with_raw_response.create(
        model="policy", prompt=ids, max_tokens=8, extra_body=asked
    )
    completion = raw.parse()
    assert completion.choices[0].model_extra["prompt_token_ids"] == ids
    (row,) = landed(capture_stack, [raw.headers["x-litellm-call-id"]]).iter_rows(named=True)
    assert row["prompt_token_ids"] == ids
    assert row["model"] == text_row["model"]  # the engine's model, as for a text prompt
    assert completion.model == "policy" + TOKEN_PROMPT_SUFFIX
    assert_matches_engine(capture_stack, row, completion.id)

    batch = [ids, ids[: len(ids) // 2]]
    raw = client.completions.with_raw_response.create(model="policy", prompt=batch, max_tokens=8)
    completion = raw.parse()
    call_id = raw.headers["x-litellm-call-id"]
    rows = landed(capture_stack, [call_id, f"{call_id}.1"]).sort("turn_id")
    sent = _engine_choices(capture_stack, completion.id)
    assert rows["prompt_token_ids"].to_list() == batch == [c["prompt_token_ids"] for c in sent]
    assert rows["response_token_ids"].to_list() == [c["token_ids"] for c in sent]
    assert set(rows["token_source"]) == {"engine"}


@pytest.mark.parametrize(
    ("prompt", "field"),
    [
        ([1, "two"], "prompt[1]"),
        ([1, -2], "prompt[1]"),
        ([[1, 2], []], "prompt[1]"),
        ([[1], [2, 3.5]], "prompt[1][1]"),
        ([[1], 2], "prompt[1]"),
        ([True], "prompt[0]"),
    ],
)
def test_a_malformed_token_id_prompt_is_a_400_naming_the_item(
    capture_stack: CaptureStack, prompt: list, field: str
) -> None:
    body = {"model": "policy", "prompt": prompt, "max_tokens": 4}
    response = post(capture_stack, "/v1/completions", json.dumps(body).encode())
    assert response.status_code == 400, response.text
    assert f"{field}: " in response.json()["error"]["message"]


MESSAGES = [{"role": "user", "content": QUESTION}]
MALFORMED = {
    "messages: a role Messages has not": (
        "/v1/messages",
        {"messages": [*MESSAGES, {"role": "tool", "content": "4"}]},
        "messages[1].role",
    ),
    "messages: system not text": ("/v1/messages", {"system": 5, "messages": MESSAGES}, "system"),
    "messages: tool without input_schema": (
        "/v1/messages",
        {"tools": [{"name": "calculator"}], "messages": MESSAGES},
        "tools[0].input_schema",
    ),
    "messages: tool without name": (
        "/v1/messages",
        {"tools": [{"input_schema": {"type": "object"}}], "messages": MESSAGES},
        "tools[0].name",
    ),
    "messages: tool result without its call": (
        "/v1/messages",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "4"}],
                }
            ]
        },
        "messages[0].content[0].tool_use_id",
    ),
    "responses: function output without its call": (
        "/v1/responses",
        {"input": [{"type": "function_call_output", "call_id": "call_9", "output": "4"}]},
        "input[0].call_id",
    ),
    "responses: function tool without name": (
        "/v1/responses",
        {"input": QUESTION, "tools": [{"type": "function", "parameters": {"type": "object"}}]},
        "tools[0].name",
    ),
}


def test_a_system_message_inside_messages_is_served(capture_stack: CaptureStack) -> None:
    """Claude Code sends mid-conversation system messages in ``messages``; LiteLLM's adapter
    hands them on as a user turn's operator note."""
    system = {"role": "system", "content": "Be brief."}
    body = {"model": "policy", "max_tokens": 16, "messages": [*MESSAGES, system, *MESSAGES]}
    response = post(capture_stack, "/v1/messages", json.dumps(body).encode())
    assert response.status_code == 200, response.text
    (row,) = landed(capture_stack, [response.headers["x-litellm-call-id"]]).iter_rows(named=True)
    assert "Be brief." in row["request_messages"]


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_responses_or_messages_request_is_a_400_naming_the_field(
    capture_stack: CaptureStack, case: str
) -> None:
    path, fields, field = MALFORMED[case]
    body = {"model": "policy", "max_tokens": 16, **fields}
    before = capture_stack.rows().height
    response = post(capture_stack, path, json.dumps(body).encode())
    assert response.status_code == 400, response.text
    assert f"{field}: " in response.json()["error"]["message"], response.text
    assert capture_stack.rows().height == before
