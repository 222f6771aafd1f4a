"""The Responses and Messages APIs through the real proxy and engine, with the official SDKs.

The default config bridges both to the engine's chat completions call: every turn lands with the
engine's exact token IDs and logprobs, the request and answer in the agent's API shape, and the
agent gets a correct native answer or event stream.
"""

from __future__ import annotations

import json
import uuid

import anthropic
import httpx
import openai
import polars as pl
import pytest
from proxy_calls import QUESTION, assert_matches_engine, landed, post
from stack_fixtures import CaptureStack

from claw_pipelines.redaction import REDACTED

CALCULATOR_PARAMETERS = {
    "type": "object",
    "properties": {"expression": {"type": "string"}},
    "required": ["expression"],
}
RESPONSES_CALCULATOR = {
    "type": "function",
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "parameters": CALCULATOR_PARAMETERS,
}
ANTHROPIC_CALCULATOR = {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "input_schema": CALCULATOR_PARAMETERS,
}
MAX_TOOL_ROUNDS = 6


def openai_client(stack: CaptureStack, base_path: str = "/v1") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=stack.proxy_url + base_path, api_key=stack.key, max_retries=0, timeout=60
    )


def anthropic_client(stack: CaptureStack, base_path: str = "") -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=stack.proxy_url + base_path, api_key=stack.key, max_retries=0, timeout=60
    )


def landed_row(stack: CaptureStack, turn_id: str) -> dict:
    return landed(stack, [turn_id]).row(0, named=True)


def rejected_message(client: anthropic.Anthropic, model: str) -> anthropic.BadRequestError:
    """The error of a Messages call the engine refuses (a negative temperature)."""
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(
            model=model,
            max_tokens=16,
            messages=[{"role": "user", "content": QUESTION}],
            extra_body={"temperature": -1},
        )
    return raised.value


def streamed_message(client: anthropic.Anthropic, model: str) -> tuple[str, str, object]:
    """One streamed Messages call: (turn id, text streamed, final message)."""
    messages = [{"role": "user", "content": QUESTION}]
    with client.messages.stream(model=model, max_tokens=64, messages=messages) as stream:
        text = "".join(stream.text_stream)
        return stream.response.headers["x-litellm-call-id"], text, stream.get_final_message()


def test_responses_create_lands_the_engines_ids_and_both_shapes(
    capture_stack: CaptureStack,
) -> None:
    trajectory = f"traj-r-{uuid.uuid4().hex[:8]}"
    client = openai_client(capture_stack, f"/t/{trajectory}/g-r/v1")
    raw = client.responses.with_raw_response.create(
        model="policy", input=QUESTION, instructions="Answer briefly.", max_output_tokens=64
    )
    response = raw.parse()
    row = landed_row(capture_stack, raw.headers["x-litellm-call-id"])
    assert (row["api"], row["call_type"], row["stream"]) == ("responses", "chat", False)
    assert (row["trajectory_id"], row["group_id"]) == (trajectory, "g-r")
    assert_matches_engine(capture_stack, row, response.id)
    assert json.loads(row["api_request"]) == {
        "model": "policy",
        "input": QUESTION,
        "instructions": "Answer briefly.",
        "max_output_tokens": 64,
    }
    assert json.loads(row["api_response"]) == json.loads(raw.http_response.text)
    assert json.loads(row["request_messages"]) == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": QUESTION},
    ]
    assert row["response_text"] == response.output_text
    assert response.model == "policy" and response.status in ("completed", "incomplete")


def test_streamed_responses_land_the_engines_ids(capture_stack: CaptureStack) -> None:
    client = openai_client(capture_stack)
    raw = client.responses.with_raw_response.create(
        model="policy", input=QUESTION, max_output_tokens=64, stream=True
    )
    events = list(raw.parse())
    final = events[-1].response
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text
    row = landed_row(capture_stack, raw.headers["x-litellm-call-id"])
    assert (row["api"], row["stream"]) == ("responses", True)
    assert_matches_engine(capture_stack, row, final.id)
    native = json.loads(row["api_response"])
    assert (native["id"], native["status"]) == (final.id, final.status)
    assert native["output"][0]["content"][0]["text"] == final.output_text
    assert native["usage"]["output_tokens"] == final.usage.output_tokens
    assert row["first_token_at"] is not None
    assert row["started_at"] <= row["first_token_at"] <= row["ended_at"]


def test_a_responses_tool_loop_sends_function_call_output(capture_stack: CaptureStack) -> None:
    """The calculator is called (``function_call`` item), its ``function_call_output`` goes
    back, and each later prompt extends the previous prompt + response token for token."""
    trajectory = f"traj-rt-{uuid.uuid4().hex[:8]}"
    client = openai_client(capture_stack, f"/t/{trajectory}/g-rt/v1")
    items: list = [{"role": "user", "content": QUESTION}]
    turn_ids, answer = [], None
    for round_ in range(MAX_TOOL_ROUNDS):
        raw = client.responses.with_raw_response.create(
            model="policy",
            input=items,
            tools=[RESPONSES_CALCULATOR],
            tool_choice="required" if round_ == 0 else "auto",
            max_output_tokens=64,
        )
        response = raw.parse()
        turn_ids.append(raw.headers["x-litellm-call-id"])
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            answer = response
            break
        items += [call.model_dump(exclude_none=True) for call in calls]
        items += [
            {"type": "function_call_output", "call_id": c.call_id, "output": "42"} for c in calls
        ]
    assert answer is not None and "42" in answer.output_text
    rows = landed(capture_stack, turn_ids).sort("started_at")
    assert set(rows["api"]) == {"responses"} and set(rows["trajectory_id"]) == {trajectory}
    first, second = rows.row(0, named=True), rows.row(1, named=True)
    assert first["finish_reason"] == "tool_calls"
    assert json.loads(first["response_message"])["tool_calls"][0]["function"]["name"] == (
        "calculator"
    )
    assert json.loads(first["request_tools"])[0]["function"]["name"] == "calculator"
    assert json.loads(second["request_messages"])[-1] == {
        "role": "tool",
        "content": "42",
        "tool_call_id": calls_of(first)[0],
    }
    previous = first["prompt_token_ids"] + first["response_token_ids"]
    assert second["prompt_token_ids"][: len(previous)] == previous
    sent = capture_stack.engine_answers()
    for row in rows.iter_rows(named=True):
        native = json.loads(row["api_response"])
        assert row["response_token_ids"] == sent[native["id"]]["token_ids"]


def calls_of(row: dict) -> list[str]:
    return [call["id"] for call in json.loads(row["response_message"])["tool_calls"]]


def test_messages_create_lands_the_engines_ids_and_both_shapes(
    capture_stack: CaptureStack,
) -> None:
    """Claude Code's request shape: ``?beta=true`` and a list of system blocks."""
    client = anthropic_client(capture_stack, "/t/traj-m/g-m")
    raw = client.beta.messages.with_raw_response.create(
        model="policy",
        max_tokens=64,
        system=[{"type": "text", "text": "Answer briefly."}],
        messages=[{"role": "user", "content": QUESTION}],
        extra_query={"beta": "true"},
    )
    assert raw.http_request.url.params.get("beta") == "true"
    message = raw.parse()
    row = landed_row(capture_stack, raw.headers["x-litellm-call-id"])
    assert (row["api"], row["stream"], row["trajectory_id"]) == ("messages", False, "traj-m")
    assert_matches_engine(capture_stack, row, message.id)
    assert json.loads(row["api_response"]) == json.loads(raw.http_response.text)
    assert json.loads(row["api_request"])["system"] == [{"type": "text", "text": "Answer briefly."}]
    assert json.loads(row["request_messages"])[-1] == {"role": "user", "content": QUESTION}
    assert row["response_text"] == message.content[0].text
    assert message.model == "policy" and message.stop_reason in ("end_turn", "max_tokens")


def test_streamed_messages_land_the_engines_ids(capture_stack: CaptureStack) -> None:
    turn_id, text, final = streamed_message(anthropic_client(capture_stack), "policy")
    row = landed_row(capture_stack, turn_id)
    assert (row["api"], row["stream"]) == ("messages", True)
    assert_matches_engine(capture_stack, row, final.id)
    assert row["response_text"] == text == final.content[0].text
    assert json.loads(row["api_response"])["usage"]["output_tokens"] == final.usage.output_tokens
    assert row["first_token_at"] is not None


def test_a_messages_tool_use_loop_sends_tool_result(capture_stack: CaptureStack) -> None:
    client = anthropic_client(capture_stack, "/t/traj-mt/g-mt")
    messages: list = [{"role": "user", "content": QUESTION}]
    turn_ids, answer = [], None
    for round_ in range(MAX_TOOL_ROUNDS):
        raw = client.messages.with_raw_response.create(
            model="policy",
            max_tokens=64,
            messages=messages,
            tools=[ANTHROPIC_CALCULATOR],
            tool_choice={"type": "any"} if round_ == 0 else {"type": "auto"},
        )
        message = raw.parse()
        turn_ids.append(raw.headers["x-litellm-call-id"])
        uses = [block for block in message.content if block.type == "tool_use"]
        if not uses:
            answer = message
            break
        assert message.stop_reason == "tool_use"
        messages.append({"role": "assistant", "content": [b.model_dump() for b in message.content]})
        results = [{"type": "tool_result", "tool_use_id": u.id, "content": "42"} for u in uses]
        messages.append({"role": "user", "content": results})
    assert answer is not None and "42" in answer.content[0].text
    rows = landed(capture_stack, turn_ids).sort("started_at")
    first, second = rows.row(0, named=True), rows.row(1, named=True)
    assert first["finish_reason"] == "tool_calls"
    assert json.loads(first["api_response"])["content"][-1]["type"] == "tool_use"
    assert json.loads(second["request_messages"])[-1] == {
        "role": "tool",
        "tool_call_id": calls_of(first)[0],
        "content": "42",
    }
    previous = first["prompt_token_ids"] + first["response_token_ids"]
    assert second["prompt_token_ids"][: len(previous)] == previous


def test_the_agents_sdk_default_model_runs_a_tool(capture_stack: CaptureStack) -> None:
    """The OpenAI Agents SDK's default model speaks the Responses API."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        RunConfig,
        Runner,
        function_tool,
    )

    used: list[str] = []

    @function_tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        used.append(expression)
        return "42"

    trajectory = f"traj-agents-{uuid.uuid4().hex[:8]}"
    client = openai.AsyncOpenAI(
        base_url=f"{capture_stack.proxy_url}/t/{trajectory}/g-agents/v1",
        api_key=capture_stack.key,
        max_retries=0,
    )
    agent = Agent(
        name="solver",
        instructions="Use the calculator.",
        tools=[calculator],
        model=OpenAIResponsesModel(model="policy", openai_client=client),
        model_settings=ModelSettings(tool_choice="required", max_tokens=64),
    )
    result = Runner.run_sync(agent, QUESTION, run_config=RunConfig(tracing_disabled=True))
    assert used and "42" in str(result.final_output)
    calls = len(result.raw_responses)
    assert calls >= 2
    rows = capture_stack.wait_for_rows(
        lambda df: df.filter(pl.col("trajectory_id") == trajectory).height >= calls
    ).filter(pl.col("trajectory_id") == trajectory)
    assert rows.height == calls
    sent = capture_stack.engine_answers()
    for row in rows.iter_rows(named=True):
        assert row["api"] == "responses" and row["status"] == "success"
        assert_matches_engine(capture_stack, row, json.loads(row["api_response"])["id"])
        assert row["response_token_ids"] == sent[json.loads(row["api_response"])["id"]]["token_ids"]


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_a_failed_call_lands_an_error_row_on_its_route(
    capture_stack: CaptureStack, api: str
) -> None:
    if api == "responses":
        with pytest.raises(openai.BadRequestError) as raised:
            openai_client(capture_stack).responses.create(
                model="policy", input=QUESTION, temperature=-1
            )
        response = raised.value.response
    else:
        error = rejected_message(anthropic_client(capture_stack), "policy")
        response = error.response
        assert error.body["type"] == "error"
        assert error.body["error"]["type"] == "invalid_request_error"
    row = landed_row(capture_stack, response.headers["x-litellm-call-id"])
    assert (row["api"], row["status"], row["token_source"]) == (api, "error", "none")
    assert row["error"] and json.loads(row["api_request"])["temperature"] == -1
    assert row["prompt_token_ids"] is None and row["api_response"] is None


def test_paths_without_v1_are_captured_too(capture_stack: CaptureStack) -> None:
    responses = post(
        capture_stack, "/responses", json.dumps({"model": "policy", "input": QUESTION}).encode()
    )
    messages = post(
        capture_stack,
        "/t/traj-nov1/g/messages?beta=true",
        json.dumps(
            {"model": "policy", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
        ).encode(),
    )
    assert responses.status_code == messages.status_code == 200, messages.text
    rows = landed(
        capture_stack,
        [responses.headers["x-litellm-call-id"], messages.headers["x-litellm-call-id"]],
    )
    assert sorted(rows["api"]) == ["messages", "responses"]
    assert set(rows["token_source"]) == {"engine"}


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/v1/responses", {"model": "policy"}, "input"),
        (
            "/v1/responses",
            {"model": "policy", "input": "hi", "previous_response_id": "resp_1"},
            "whole conversation",
        ),
        (
            "/v1/messages",
            {"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
            "max_tokens",
        ),
    ],
)
def test_a_request_the_bridge_cannot_serve_gets_a_400_naming_why(
    capture_stack: CaptureStack, path: str, body: dict, needle: str
) -> None:
    response = post(capture_stack, path, json.dumps(body).encode())
    assert response.status_code == 400 and needle in response.text, response.text
    if path.endswith("messages"):
        assert response.json()["type"] == "error"


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_planted_secrets_reach_neither_api_column(capture_stack: CaptureStack, api: str) -> None:
    planted = "sk-planted-" + uuid.uuid4().hex
    said = f"my key is {planted}. {QUESTION}"
    if api == "responses":
        raw = openai_client(capture_stack).responses.with_raw_response.create(
            model="policy", input=said, max_output_tokens=16
        )
    else:
        raw = anthropic_client(capture_stack).messages.with_raw_response.create(
            model="policy", max_tokens=16, messages=[{"role": "user", "content": said}]
        )
    row = landed_row(capture_stack, raw.headers["x-litellm-call-id"])
    for column in ("api_request", "api_response", "request_messages"):
        assert planted not in (row[column] or ""), column
    assert REDACTED in row["api_request"]


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_the_base_url_answers_a_probe_without_a_key(
    capture_stack: CaptureStack, method: str
) -> None:
    """Claude Code probes ``HEAD <base url>`` before its first call."""
    for path in ("/", "/t/traj-probe/g-probe"):
        response = httpx.request(method, capture_stack.proxy_url + path, timeout=10)
        assert response.status_code == 200, (path, response.status_code)
    assert httpx.get(capture_stack.proxy_url + "/v1/models", timeout=10).status_code == 401
