"""Response shapes, field for field as vLLM's OpenAI server sends them."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from claw_pipelines.demo import CALCULATOR_TOOL
from claw_pipelines.engine.context import DEFAULT_MAX_MODEL_LEN
from claw_pipelines.engine.tokenizer import ENDOFTEXT_ID, IM_END_ID, decode

QUESTION = [{"role": "user", "content": "What is 37 + 45?"}]


def sse_events(body: str) -> list[dict | str]:
    """The ``data:`` payloads of an SSE body, JSON-decoded except the final ``[DONE]``."""
    events = [line.removeprefix("data: ") for line in body.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    return [*(json.loads(event) for event in events[:-1]), "[DONE]"]


def chat(client: TestClient, **body) -> dict:
    response = client.post("/v1/chat/completions", json={"model": "sim", **body})
    assert response.status_code == 200, response.text
    return response.json()


def test_health_and_models_say_simulator(client: TestClient) -> None:
    assert client.get("/health").status_code == 200
    (card,) = client.get("/v1/models").json()["data"]
    assert "simulator" in card["owned_by"]
    assert "no GPU" in card["description"]
    assert card["max_model_len"] == DEFAULT_MAX_MODEL_LEN


def test_chat_non_streaming(client: TestClient) -> None:
    body = chat(
        client, messages=QUESTION, logprobs=True, top_logprobs=3, return_token_ids=True, seed=1
    )
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] is None
    ids = choice["token_ids"]
    assert ids[-1] == IM_END_ID
    assert decode(ids[:-1]) == choice["message"]["content"]
    assert "tool_calls" not in choice["message"]
    content = choice["logprobs"]["content"]
    assert len(content) == len(ids)
    for entry in content:
        assert entry["logprob"] < 0
        assert bytes(entry["bytes"]).decode() == entry["token"]
        tops = [top["logprob"] for top in entry["top_logprobs"]]
        assert len(tops) == 3
        assert tops == sorted(tops, reverse=True)
        assert entry["logprob"] in tops
    tokenized = client.post("/tokenize", json={"messages": QUESTION}).json()
    assert body["prompt_token_ids"] == tokenized["tokens"]
    assert body["usage"] == {
        "prompt_tokens": len(tokenized["tokens"]),
        "completion_tokens": len(ids),
        "total_tokens": len(tokenized["tokens"]) + len(ids),
        "prompt_tokens_details": None,
    }


def test_token_ids_and_logprobs_only_when_asked(client: TestClient) -> None:
    body = chat(client, messages=QUESTION)
    assert body["prompt_token_ids"] is None
    assert body["choices"][0]["token_ids"] is None
    assert body["choices"][0]["logprobs"] is None


def test_stream_carries_what_the_full_response_carries(client: TestClient) -> None:
    request = {"messages": QUESTION, "logprobs": True, "return_token_ids": True, "seed": 2}
    full = chat(client, **request)
    raw = client.post(
        "/v1/chat/completions",
        json={**request, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert raw.headers["content-type"].startswith("text/event-stream")
    *chunks, usage_chunk, done = sse_events(raw.text)
    assert done == "[DONE]"
    first, *token_chunks = chunks
    assert first["object"] == "chat.completion.chunk"
    assert first["prompt_token_ids"] == full["prompt_token_ids"]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("prompt_token_ids" not in chunk for chunk in token_chunks)
    choices = [chunk["choices"][0] for chunk in token_chunks]
    assert all(len(choice["token_ids"]) == 1 for choice in choices)
    assert [c["token_ids"][0] for c in choices] == full["choices"][0]["token_ids"]
    text = "".join(c["delta"].get("content") or "" for c in choices)
    assert text == full["choices"][0]["message"]["content"]
    logprobs = [c["logprobs"]["content"][0]["logprob"] for c in choices]
    assert logprobs == [e["logprob"] for e in full["choices"][0]["logprobs"]["content"]]
    assert [c["finish_reason"] for c in choices[:-1]] == [None] * (len(choices) - 1)
    assert choices[-1]["finish_reason"] == full["choices"][0]["finish_reason"]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == len(full["choices"][0]["token_ids"])


def test_tool_call(client: TestClient) -> None:
    body = chat(
        client,
        messages=QUESTION,
        tools=[CALCULATOR_TOOL],
        tool_choice="required",
        return_token_ids=True,
    )
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function"
    assert call["id"].startswith("chatcmpl-tool-")
    assert call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": "37 + 45"}
    assert choice["token_ids"][-1] == IM_END_ID


def test_streamed_tool_call(client: TestClient) -> None:
    raw = client.post(
        "/v1/chat/completions",
        json={
            "messages": QUESTION,
            "tools": [CALCULATOR_TOOL],
            "tool_choice": "required",
            "stream": True,
        },
    )
    *chunks, _ = sse_events(raw.text)
    calls = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls", [])]
    assert [call["function"]["name"] for call in calls] == ["calculator"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"expression": "37 + 45"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_max_tokens_cuts_with_length(client: TestClient) -> None:
    body = chat(client, messages=QUESTION, max_tokens=5, return_token_ids=True, logprobs=True)
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "length"
    assert len(choice["token_ids"]) == 5
    assert IM_END_ID not in choice["token_ids"]
    assert choice["message"]["content"] == decode(choice["token_ids"])
    assert len(choice["logprobs"]["content"]) == 5
    assert body["usage"]["completion_tokens"] == 5


def test_n_choices(client: TestClient) -> None:
    body = chat(client, messages=QUESTION, n=3, return_token_ids=True)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in body["choices"])
    raw = client.post("/v1/chat/completions", json={"messages": QUESTION, "n": 2, "stream": True})
    *chunks, _ = sse_events(raw.text)
    finished = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(finished) == [0, 1]


def test_completions(client: TestClient) -> None:
    response = client.post(
        "/v1/completions",
        json={
            "prompt": "Q: What is 6 * 7?\nA:",
            "max_tokens": 64,
            "logprobs": 2,
            "return_token_ids": True,
            "seed": 4,
        },
    )
    body = response.json()
    assert body["object"] == "text_completion"
    (choice,) = body["choices"]
    assert (
        choice["prompt_token_ids"]
        == client.post("/tokenize", json={"prompt": "Q: What is 6 * 7?\nA:"}).json()["tokens"]
    )
    ids = choice["token_ids"]
    if choice["finish_reason"] == "stop":
        assert ids[-1] == ENDOFTEXT_ID
        assert decode(ids[:-1]) == choice["text"]
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == len(ids)
    assert all(len(top) <= 2 for top in logprobs["top_logprobs"])
    for prompts in ([[1, 2, 3], [4, 5]], ["What is 2 + 2?", "What is 3 + 3?"]):
        batch = client.post("/v1/completions", json={"prompt": prompts, "n": 2}).json()
        assert [c["index"] for c in batch["choices"]] == [0, 1, 2, 3]


def test_streamed_completions(client: TestClient) -> None:
    request = {"prompt": "What is 5 - 9?", "max_tokens": 40, "return_token_ids": True, "seed": 8}
    full = client.post("/v1/completions", json=request).json()["choices"][0]
    raw = client.post("/v1/completions", json={**request, "stream": True})
    *chunks, _ = sse_events(raw.text)
    choices = [chunk["choices"][0] for chunk in chunks]
    assert choices[0]["prompt_token_ids"] == full["prompt_token_ids"]
    assert all(c.get("prompt_token_ids") is None for c in choices[1:])
    assert [c["token_ids"][0] for c in choices] == full["token_ids"]
    assert "".join(c["text"] for c in choices) == full["text"]
    assert choices[-1]["finish_reason"] == full["finish_reason"]


def test_tokenize_and_detokenize(client: TestClient) -> None:
    tokenized = client.post(
        "/tokenize", json={"prompt": "What is 1 + 1?", "return_token_strs": True}
    ).json()
    assert tokenized["count"] == len(tokenized["tokens"])
    assert "".join(tokenized["token_strs"]) == "What is 1 + 1?"
    back = client.post("/detokenize", json={"tokens": tokenized["tokens"]}).json()
    assert back == {"prompt": "What is 1 + 1?"}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", b"{not json"),
        ("/v1/chat/completions", b"[1, 2]"),
        ("/v1/chat/completions", {"model": "sim"}),
        ("/v1/chat/completions", {"messages": []}),
        ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}),
        ("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 0}),
        ("/v1/chat/completions", {"messages": QUESTION, "max_tokens": DEFAULT_MAX_MODEL_LEN + 1}),
        ("/v1/chat/completions", {"messages": QUESTION, "n": 0}),
        ("/v1/chat/completions", {"messages": QUESTION, "top_logprobs": 2}),
        ("/v1/chat/completions", {"messages": QUESTION, "logprobs": True, "top_logprobs": 21}),
        ("/v1/chat/completions", {"messages": QUESTION, "stream_options": {"include_usage": True}}),
        ("/v1/chat/completions", {"messages": QUESTION, "tool_choice": "required"}),
        (
            "/v1/chat/completions",
            {
                "messages": QUESTION,
                "tools": [CALCULATOR_TOOL],
                "tool_choice": {"type": "function", "function": {"name": "nope"}},
            },
        ),
        ("/v1/completions", {"prompt": ""}),
        ("/v1/completions", {"prompt": "hi", "echo": True}),
        ("/v1/completions", {"prompt": [10**9]}),
        ("/tokenize", {}),
        ("/detokenize", {"tokens": [-1]}),
    ],
)
def test_bad_requests_are_400_in_error_shape(client: TestClient, path: str, body) -> None:
    if isinstance(body, bytes):
        response = client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        response = client.post(path, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "BadRequestError"
    assert error["code"] == 400
    assert error["message"]


def test_unknown_body_keys_are_ignored(client: TestClient) -> None:
    body = chat(client, messages=QUESTION, metadata={"claw": {"trajectory_id": "t"}}, user="u")
    assert body["choices"][0]["message"]["role"] == "assistant"
