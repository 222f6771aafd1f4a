"""The other per-model choices for Responses and Messages calls, on a proxy of their own.

- ``api_mode: native``: LiteLLM serves the API's own route (here its Responses-to-chat bridge,
  ``use_chat_completions_api``, and its Anthropic adapter); the turn lands with both shapes and
  the normalized messages, and ``token_source = none`` (no engine IDs come through).
- ``stream_mode: passthrough`` with the bridge: streams are translated chunk by chunk.
- Whatever the mode, an agent's answer shows the engine's token IDs and logprobs only if the
  agent asked for them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import yaml
from proxy_calls import QUESTION, assert_matches_engine, client_for, landed
from stack_fixtures import CaptureStack, launch_stack
from test_agent_apis import (
    anthropic_client,
    landed_row,
    openai_client,
    rejected_message,
    streamed_message,
)

from claw_pipelines.edge.launcher import DEFAULT_CONFIG
from claw_pipelines.engine.policy import RAMBLE_LIMIT

BACKEND = {"api_base": "os.environ/CLAW_BACKEND_URL", "api_key": "none", "timeout": 120}
EXTRA_MODELS = [
    {
        "model_name": "policy-native",
        "litellm_params": {
            "model": "hosted_vllm/claw-sim",
            "use_chat_completions_api": True,
            **BACKEND,
        },
        "model_info": {"claw": {"api_mode": "native"}},
    },
    {
        "model_name": "policy-vllm-routes",
        "litellm_params": {"model": "hosted_vllm/claw-sim", **BACKEND},
        "model_info": {"claw": {"api_mode": "native"}},
    },
    {
        "model_name": "policy-live",
        "litellm_params": {"model": "hosted_vllm/claw-sim", **BACKEND},
        "model_info": {"claw": {"stream_mode": "passthrough"}},
    },
]


@pytest.fixture(scope="module")
def modes_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CaptureStack]:
    workdir = tmp_path_factory.mktemp("api-modes")
    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    config["model_list"] += EXTRA_MODELS
    path = Path(workdir) / "litellm.yaml"
    path.write_text(yaml.safe_dump(config))
    stack = launch_stack(workdir, config=path)
    try:
        yield stack
    finally:
        stack.proxy.stop()
        stack.engine.stop()


def assert_native_row(row: dict, api: str) -> None:
    assert (row["api"], row["status"], row["token_source"]) == (api, "success", "none")
    assert row["prompt_token_ids"] is None and row["response_token_ids"] is None


def test_a_native_responses_call_lands_both_shapes(modes_stack: CaptureStack) -> None:
    raw = openai_client(modes_stack).responses.with_raw_response.create(
        model="policy-native", input=QUESTION, instructions="Be brief.", max_output_tokens=32
    )
    response = raw.parse()
    row = landed_row(modes_stack, raw.headers["x-litellm-call-id"])
    assert_native_row(row, "responses")
    assert json.loads(row["api_request"])["input"] == QUESTION
    sent = json.loads(raw.http_response.text)
    kept = json.loads(row["api_response"])
    assert kept["id"].startswith("resp_")  # LiteLLM's proxy hands the id out encrypted
    assert {**kept, "id": sent["id"]} == sent
    assert json.loads(row["request_messages"]) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": QUESTION},
    ]
    assert row["response_text"] == response.output_text
    assert row["completion_tokens"] == response.usage.output_tokens


def test_a_native_responses_stream_lands_its_final_answer(modes_stack: CaptureStack) -> None:
    raw = openai_client(modes_stack).responses.with_raw_response.create(
        model="policy-native", input=QUESTION, max_output_tokens=32, stream=True
    )
    events = list(raw.parse())
    final = events[-1].response
    row = landed_row(modes_stack, raw.headers["x-litellm-call-id"])
    assert_native_row(row, "responses")
    assert row["stream"] is True and row["first_token_at"] is not None
    kept = json.loads(row["api_response"])
    assert kept["status"] == final.status
    assert kept["usage"]["output_tokens"] == final.usage.output_tokens
    assert row["response_text"] == final.output_text


def test_a_native_messages_call_and_stream_land_both_shapes(modes_stack: CaptureStack) -> None:
    client = anthropic_client(modes_stack)
    messages = [{"role": "user", "content": QUESTION}]
    raw = client.messages.with_raw_response.create(
        model="policy-native", max_tokens=32, messages=messages
    )
    message = raw.parse()
    row = landed_row(modes_stack, raw.headers["x-litellm-call-id"])
    assert_native_row(row, "messages")
    assert json.loads(row["api_response"])["content"] == [
        block.model_dump(exclude_none=True) for block in message.content
    ]
    assert json.loads(row["request_messages"]) == messages
    assert row["response_text"] == message.content[0].text
    turn_id, text, _ = streamed_message(client, "policy-native")
    row = landed_row(modes_stack, turn_id)
    assert_native_row(row, "messages")
    assert row["stream"] is True and row["response_text"] == text
    assert json.loads(row["api_response"])["content"][0]["text"] == text


def test_a_native_call_the_backend_rejects_lands_an_error_row(modes_stack: CaptureStack) -> None:
    """vLLM's own /v1/responses route, which the embedded engine does not serve (404)."""
    with pytest.raises(openai.NotFoundError) as raised:
        openai_client(modes_stack).responses.create(model="policy-vllm-routes", input=QUESTION)
    row = landed_row(modes_stack, raised.value.response.headers["x-litellm-call-id"])
    assert (row["api"], row["status"], row["token_source"]) == ("responses", "error", "none")
    assert json.loads(row["api_request"]) == {"model": "policy-vllm-routes", "input": QUESTION}


def test_passthrough_streams_are_translated_as_they_come(modes_stack: CaptureStack) -> None:
    """The bridge with ``stream_mode: passthrough``: chat chunks become native events on the
    fly; the row has the streamed logprobs, but LiteLLM's stream drops the prompt IDs.

    The budget is above the engine's longest answer (a ramble stops by itself after
    ``RAMBLE_LIMIT`` tokens): which answer the engine draws depends on the calls before."""
    raw = openai_client(modes_stack).responses.with_raw_response.create(
        model="policy-live", input=QUESTION, max_output_tokens=2 * RAMBLE_LIMIT, stream=True
    )
    events = list(raw.parse())
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    row = landed_row(modes_stack, raw.headers["x-litellm-call-id"])
    assert events[0].type == "response.created"
    # the engine samples: an answer may reach max_output_tokens, and then the stream says so
    ending = "response.incomplete" if row["finish_reason"] == "length" else "response.completed"
    assert events[-1].type == ending
    assert (row["api"], row["stream"], row["token_source"]) == ("responses", True, "none")
    assert row["response_text"] == text == events[-1].response.output_text
    assert row["response_logprobs"] and row["prompt_token_ids"] is None
    assert json.loads(row["api_request"])["stream"] is True

    turn_id, text, final = streamed_message(anthropic_client(modes_stack), "policy-live")
    row = landed_row(modes_stack, turn_id)
    assert (row["api"], row["stream"]) == ("messages", True)
    assert row["response_text"] == text == final.content[0].text
    assert row["response_logprobs"]


def test_passthrough_mode_leaves_unstreamed_calls_exact(modes_stack: CaptureStack) -> None:
    message = anthropic_client(modes_stack).messages.with_raw_response.create(
        model="policy-live", max_tokens=16, messages=[{"role": "user", "content": QUESTION}]
    )
    row = landed_row(modes_stack, message.headers["x-litellm-call-id"])
    assert (row["api"], row["token_source"]) == ("messages", "engine")
    sent = modes_stack.engine_answers()[message.parse().id]
    assert row["response_token_ids"] == sent["token_ids"]


def test_a_native_messages_error_keeps_anthropics_shape(modes_stack: CaptureStack) -> None:
    error = rejected_message(anthropic_client(modes_stack), "policy-native")
    assert error.body["type"] == "error"
    row = landed_row(modes_stack, error.response.headers["x-litellm-call-id"])
    assert (row["api"], row["status"]) == ("messages", "error")


def _engine_fields(answer: dict) -> list[str]:
    """The token ID and logprob fields an answer or chunk (as JSON) shows with a value."""
    shown = ["prompt_token_ids"] if answer.get("prompt_token_ids") is not None else []
    for choice in answer.get("choices") or []:
        provider = choice.get("provider_specific_fields") or {}
        shown += [name for name in ("prompt_token_ids", "token_ids") if choice.get(name)]
        shown += ["token_ids"] if provider.get("token_ids") is not None else []
        shown += ["logprobs"] if choice.get("logprobs") is not None else []
    return shown


def test_an_agent_gets_token_ids_and_logprobs_only_when_it_asks(
    modes_stack: CaptureStack,
) -> None:
    """Capture asks the engine for both on every call; a chat or text completion agent that did
    not gets the plain proxy's answer, whole or streamed (passthrough too), and the row is
    still the engine's; one that asked gets what it asked for."""
    client = client_for(modes_stack)
    messages = [{"role": "user", "content": QUESTION}]
    whole = client.chat.completions.with_raw_response.create(model="policy", messages=messages)
    text = client.completions.with_raw_response.create(model="policy", prompt=QUESTION)
    streams = [
        client.chat.completions.with_raw_response.create(
            model=model, messages=messages, stream=True
        )
        for model in ("policy", "policy-live")
    ]
    chunks = [list(stream.parse()) for stream in streams]
    plain = [whole.parse().model_dump(), text.parse().model_dump()]
    plain += [chunk.model_dump() for streamed in chunks for chunk in streamed]
    assert [_engine_fields(answer) for answer in plain] == [[]] * len(plain)
    asked = client.chat.completions.with_raw_response.create(
        model="policy",
        messages=messages,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    assert _engine_fields(asked.parse().model_dump()) == [
        "prompt_token_ids",
        "token_ids",
        "logprobs",
    ]
    calls = [whole, text, *streams, asked]
    rows = landed(modes_stack, [call.headers["x-litellm-call-id"] for call in calls])
    by_id = {row["turn_id"]: row for row in rows.iter_rows(named=True)}
    exact = [(whole, whole.parse().id), (text, text.parse().id), (asked, asked.parse().id)]
    exact.append((streams[0], chunks[0][0].id))  # buffered: the engine's whole answer
    for call, answer_id in exact:
        assert_matches_engine(modes_stack, by_id[call.headers["x-litellm-call-id"]], answer_id)
    assert (
        asked.parse().model_extra["prompt_token_ids"]
        == by_id[asked.headers["x-litellm-call-id"]]["prompt_token_ids"]
    )
