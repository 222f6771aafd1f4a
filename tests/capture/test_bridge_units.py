"""Pure parts of serving Responses and Messages calls: routes, options, translations, streams."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from litellm.types.utils import ModelResponse
from pydantic import ValidationError

from claw_pipelines.capture.apis import api_for_path
from claw_pipelines.capture.bridge import (
    BridgeRequestError,
    MessagesBridge,
    ResponsesBridge,
)
from claw_pipelines.capture.native import NativeStream
from claw_pipelines.capture.runtime import model_capture_options
from claw_pipelines.capture.turns import pending_call, turns_from_response
from claw_pipelines.edge.inner import ChatChunkStream
from claw_pipelines.identity import TurnIdentity, split_identity_prefix
from claw_pipelines.redaction import Redactor

TOOL_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "calculator", "arguments": '{"expression": "17 + 25"}'},
}


def _completion(**message: object) -> ModelResponse:
    return ModelResponse(
        id="chatcmpl-1",
        model="claw-sim",
        choices=[
            {
                "index": 0,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                "message": {"role": "assistant", **message},
                "token_ids": [7, 8],
            }
        ],
        prompt_token_ids=[1, 2, 3],
        usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    )


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1/chat/completions", "chat"),
        ("/completions", "completions"),
        ("/v1/responses", "responses"),
        ("/responses", "responses"),
        ("/v1/messages", "messages"),
        ("/messages/", "messages"),
        ("/v1/embeddings", None),
        ("/", None),
    ],
)
def test_each_route_names_its_api(path: str, api: str | None) -> None:
    assert api_for_path(path) == api


def test_a_bare_identity_prefix_is_the_root() -> None:
    assert split_identity_prefix("/t/traj/g") == ("traj", "g", "/")
    assert split_identity_prefix("/t/traj") is None


def test_hosted_vllm_models_bridge_and_others_are_native(tmp_path: Path) -> None:
    config = {
        "model_list": [
            {"model_name": "exact", "litellm_params": {"model": "hosted_vllm/m"}},
            {"model_name": "other", "litellm_params": {"model": "openai/gpt"}},
            {
                "model_name": "opted-out",
                "litellm_params": {"model": "hosted_vllm/m"},
                "model_info": {"claw": {"api_mode": "native"}},
            },
        ]
    }
    path = tmp_path / "litellm.yaml"
    path.write_text(yaml.safe_dump(config))
    options = model_capture_options(str(path))
    assert [options[name].api_mode for name in ("exact", "other", "opted-out")] == [
        "bridge",
        "native",
        "native",
    ]
    config["model_list"][0]["model_info"] = {"claw": {"api_mode": "chat"}}
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ValidationError, match="api_mode"):
        model_capture_options(str(path))


def test_a_responses_tool_loop_translates_both_ways() -> None:
    """``function_call`` / ``function_call_output`` inputs become a tool call and a tool
    message; a chat tool call comes back as a ``function_call`` output item."""
    request = {
        "model": "policy",
        "input": [
            {"role": "user", "content": "What is 17 + 25?"},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "calculator",
                "arguments": '{"expression": "17 + 25"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "42"},
        ],
        "tools": [{"type": "function", "name": "calculator", "parameters": {"type": "object"}}],
        "max_output_tokens": 32,
    }
    bridge = ResponsesBridge.from_request(request)
    chat = bridge.chat_request(stream=False)
    assert chat["messages"][1]["tool_calls"][0]["function"]["name"] == "calculator"
    assert chat["messages"][2] == {"role": "tool", "content": "42", "tool_call_id": "call_1"}
    assert (chat["max_tokens"], chat["tools"][0]["function"]["name"]) == (32, "calculator")
    assert "custom_llm_provider" not in chat
    answer = bridge.answered(_completion(content=None, tool_calls=[TOOL_CALL]))
    (item,) = answer["output"]
    assert (item["type"], item["call_id"], item["name"]) == (
        "function_call",
        "call_1",
        "calculator",
    )
    assert (answer["model"], answer["id"]) == ("policy", "chatcmpl-1")
    events = bridge.events().decode().split("\n\n")
    assert events[0].startswith("event: response.created\n")
    assert "event: response.function_call_arguments.done" in bridge.events().decode()
    assert events[-2].startswith("event: response.completed\n")


def test_a_messages_tool_loop_translates_both_ways() -> None:
    request = {
        "model": "policy",
        "max_tokens": 32,
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "What is 17 + 25?"},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "calculator",
                        "input": {"expression": "17 + 25"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}],
            },
        ],
    }
    bridge = MessagesBridge.from_request(request)
    chat = bridge.chat_request(stream=True)
    assert chat["messages"][0] == {"role": "system", "content": "Be brief."}
    assert chat["messages"][2]["tool_calls"][0]["id"] == "toolu_1"
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "42"}
    assert chat["stream"] is True
    answer = bridge.answered(_completion(content="It is", tool_calls=[TOOL_CALL]))
    assert [block["type"] for block in answer["content"]] == ["text", "tool_use"]
    assert answer["content"][1]["input"] == {"expression": "17 + 25"}
    assert (answer["stop_reason"], answer["model"]) == ("tool_use", "policy")
    frames = bridge.events().decode()
    assert frames.startswith("event: message_start\n") and "input_json_delta" in frames


@pytest.mark.parametrize(
    ("bridge", "request_", "needle"),
    [
        (ResponsesBridge, {"model": "policy"}, "input"),
        (ResponsesBridge, {"model": "p", "input": "x", "previous_response_id": "r"}, "whole"),
        (MessagesBridge, {"model": "policy", "max_tokens": 8, "messages": []}, "messages"),
        (MessagesBridge, {"model": "", "max_tokens": 8, "messages": [{}]}, "model"),
    ],
)
def test_a_request_the_bridge_cannot_serve_is_refused_naming_the_field(
    bridge: type, request_: dict, needle: str
) -> None:
    with pytest.raises(BridgeRequestError, match=needle):
        bridge.from_request(request_)


def test_native_answers_read_as_chat_messages() -> None:
    responses = ResponsesBridge({"model": "m", "input": "q"})
    answer = {
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Let me", "annotations": []}],
            },
            {"type": "function_call", "call_id": "c1", "name": "calculator", "arguments": "{}"},
        ],
        "incomplete_details": None,
    }
    message, reason = responses.chat_view(answer)
    assert (message["content"], message["tool_calls"][0]["id"], reason) == (
        "Let me",
        "c1",
        "tool_calls",
    )
    cut = {
        **answer,
        "output": answer["output"][1:2],
        "incomplete_details": {"reason": "max_output_tokens"},
    }
    assert responses.chat_view(cut) == ({"role": "assistant", "content": "Let me"}, "length")
    messages = MessagesBridge({"model": "m", "max_tokens": 1, "messages": [{}]})
    message, reason = messages.chat_view(
        {"content": [{"type": "text", "text": "42"}], "stop_reason": "max_tokens"}
    )
    assert (message, reason) == ({"role": "assistant", "content": "42"}, "length")


def test_a_bridged_turn_keeps_the_native_answer_and_the_engine_ids() -> None:
    bridge = ResponsesBridge({"model": "policy", "input": "What is 1 + 1?"})
    chat = bridge.chat_request(stream=False)
    pending = pending_call(
        "call-1",
        chat,
        TurnIdentity(),
        None,
        True,
        Redactor(),
        api="responses",
        api_request=bridge.request,
        bridge=bridge,
    )
    answer = bridge.answered(_completion(content="2"))
    (turn,) = turns_from_response(
        pending, _completion(content="2"), Redactor(), "w", json.dumps(answer)
    )
    assert (turn.api, turn.call_type, turn.token_source) == ("responses", "chat", "engine")
    assert (turn.prompt_token_ids, turn.response_token_ids) == ([1, 2, 3], [7, 8])
    assert json.loads(turn.api_request) == bridge.request
    assert turn.first_token_at == turn.ended_at  # a buffered stream arrives all at once


def test_the_chat_stream_reader_rebuilds_chunks_split_anywhere() -> None:
    chunks = [
        {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
        for word in ("Hello", " world")
    ]  # fmt: skip
    wire = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    wire += b"data: [DONE]\n\n"

    async def read() -> list[str]:
        stream = ChatChunkStream()
        await stream.send({"type": "http.response.start", "status": 200, "headers": []})
        for start in range(0, len(wire), 7):
            await stream.send(
                {"type": "http.response.body", "body": wire[start : start + 7], "more_body": True}
            )
        return [chunk.choices[0].delta.content async for chunk in stream.chunks()]

    assert asyncio.run(read()) == ["Hello", " world"]


def test_a_native_messages_stream_is_assembled_into_its_answer() -> None:
    frames = [
        {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
         "model": "m", "content": [], "usage": {"input_tokens": 3, "output_tokens": 0}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "42"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
         "usage": {"output_tokens": 1}},
        {"type": "message_stop"},
    ]  # fmt: skip
    stream = NativeStream()
    ends = [stream.add(f"event: {f['type']}\ndata: {json.dumps(f)}\n\n".encode()) for f in frames]
    assert ends == [False] * 5 + [True]
    bridge = MessagesBridge({"model": "policy", "max_tokens": 8, "messages": [{}]})
    answer = stream.answer(bridge)
    assert answer["content"] == [{"type": "text", "text": "42"}]
    assert answer["stop_reason"] == "end_turn" and stream.first_token_at is not None
