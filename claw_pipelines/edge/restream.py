"""Turn a complete chat or text completion back into a vLLM-shaped SSE stream.

Used for streamed requests to exact-capture models: the upstream call is non-streaming (so the
engine's prompt and response token IDs survive LiteLLM intact) and the client still receives a
stream. Chat: first chunk with the role and ``prompt_token_ids``, then the content, tool calls,
``token_ids`` and logprobs, then the finish reason. Text completion: per choice one chunk with
the text, ``prompt_token_ids``, ``token_ids`` and logprobs, then the finish reason. Both end with
the optional usage chunk and ``[DONE]``.
"""

from __future__ import annotations

import json
from typing import Any

CHAT_CHUNK = "chat.completion.chunk"
TEXT_CHUNK = "text_completion"


def _chunk(
    completion: dict[str, Any], choices: list[dict[str, Any]], kind: str = CHAT_CHUNK, **extra: Any
) -> bytes:
    payload = {
        "id": completion.get("id"),
        "object": kind,
        "created": completion.get("created"),
        "model": completion.get("model"),
        **extra,
        "choices": choices,
    }
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def _token_ids(choice: dict[str, Any]) -> list[int] | None:
    provider_fields = choice.get("provider_specific_fields") or {}
    return provider_fields.get("token_ids", choice.get("token_ids"))


def _content_delta(message: dict[str, Any]) -> dict[str, Any]:
    delta: dict[str, Any] = {"content": message.get("content") or ""}
    if message.get("tool_calls"):
        delta["tool_calls"] = [
            {
                "index": i,
                "id": c.get("id"),
                "type": c.get("type", "function"),
                "function": c.get("function"),
            }
            for i, c in enumerate(message["tool_calls"])
        ]
    return delta


def sse_from_completion(completion: dict[str, Any], include_usage: bool) -> bytes:
    choices = completion.get("choices") or []
    first = [
        {
            "index": c.get("index", i),
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
            "token_ids": [],
        }
        for i, c in enumerate(choices)
    ]
    events = [_chunk(completion, first, prompt_token_ids=completion.get("prompt_token_ids"))]
    for i, choice in enumerate(choices):
        body = {
            "index": choice.get("index", i),
            "delta": _content_delta(choice.get("message") or {}),
            "logprobs": choice.get("logprobs"),
            "finish_reason": None,
            "token_ids": _token_ids(choice),
        }
        events.append(_chunk(completion, [body]))
        stop_reason = (choice.get("provider_specific_fields") or {}).get("stop_reason")
        final = {
            "index": choice.get("index", i),
            "delta": {},
            "logprobs": None,
            "finish_reason": choice.get("finish_reason"),
            "stop_reason": stop_reason,
        }
        events.append(_chunk(completion, [final]))
    return b"".join([*events, *_ending(completion, include_usage, CHAT_CHUNK)])


def sse_from_text_completion(completion: dict[str, Any], include_usage: bool) -> bytes:
    events = []
    for i, choice in enumerate(completion.get("choices") or []):
        index = choice.get("index", i)
        body = {
            "index": index,
            "text": choice.get("text") or "",
            "logprobs": choice.get("logprobs"),
            "finish_reason": None,
            "prompt_token_ids": choice.get("prompt_token_ids"),
            "token_ids": _token_ids(choice),
        }
        final = {
            "index": index,
            "text": "",
            "logprobs": None,
            "finish_reason": choice.get("finish_reason"),
            "stop_reason": choice.get("stop_reason"),
        }
        events += [_chunk(completion, [body], TEXT_CHUNK), _chunk(completion, [final], TEXT_CHUNK)]
    return b"".join([*events, *_ending(completion, include_usage, TEXT_CHUNK)])


def _ending(completion: dict[str, Any], include_usage: bool, kind: str) -> list[bytes]:
    usage = completion.get("usage")
    events = [_chunk(completion, [], kind, usage=usage)] if include_usage and usage else []
    return [*events, b"data: [DONE]\n\n"]
