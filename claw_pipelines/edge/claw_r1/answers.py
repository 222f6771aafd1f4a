"""Claw-R1's answer shapes, made from the answers LiteLLM gives on our own routes.

Chat: Claw-R1's gateway answers with the model's raw text (a vLLM text completion) and no
``tool_calls``, and its agents parse ``<tool_call>`` tags out of ``content`` (its GSM8K agent,
like verl's Hermes parser). So on its routes a structured tool call is written back into
``content`` the way the model wrote it in the token stream (the model's tool call layout), after
any text, one call per line, as the chat templates render it; ``finish_reason`` ``tool_calls``
becomes ``stop``, as vLLM's text completions say. The turn row keeps the structured calls: it is
landed before this answer is made. When the agent sends that text back as the assistant message,
the chat template renders it to the same tokens, so the next prompt extends this one exactly.

Generate: token IDs in, the engine's token IDs (and logprobs) out.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from claw_pipelines.edge.claw_r1.protocol import GenerateAnswer, GenerateRequest

GENERATE_PARAMS = ("temperature", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty")
"""Claw-R1 sampling params passed on as OpenAI text completion params."""
VLLM_PARAMS = ("top_k", "min_p", "repetition_penalty")
"""vLLM's own sampling params, passed on in ``extra_body``."""


def tool_call_text(call: dict[str, Any], layout: str) -> str:
    """A tool call as the model wrote it: ``{"name": …, "arguments": {…}}`` in ``layout``."""
    function = call.get("function") or {}
    arguments = function.get("arguments")
    with contextlib.suppress(TypeError, ValueError):
        arguments = json.loads(arguments)
    written = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
    return layout.replace("{call}", written)


def text_message(message: dict[str, Any], layout: str) -> dict[str, Any]:
    """The assistant message with its tool calls written into ``content``."""
    calls = message.get("tool_calls") or []
    if not calls:
        return message
    texts = [tool_call_text(call, layout) for call in calls]
    content = message.get("content") or ""
    kept = {k: v for k, v in message.items() if k not in ("tool_calls", "function_call")}
    return {**kept, "content": "\n".join([content, *texts] if content else texts)}


def chat_answer(completion: dict[str, Any], layout: str) -> dict[str, Any]:
    """The chat completion as Claw-R1's gateway shapes it (module docstring)."""
    choices = [
        {
            **choice,
            "message": text_message(choice.get("message") or {}, layout),
            "finish_reason": "stop"
            if choice.get("finish_reason") == "tool_calls"
            else choice.get("finish_reason"),
        }
        for choice in completion.get("choices") or []
    ]
    return {**completion, "choices": choices}


def completion_request(request: GenerateRequest, model: str, max_tokens: int) -> dict[str, Any]:
    """The text completion call for a ``/generate`` request: the engine's token IDs for the
    answer, logprobs always (for the turn)."""
    params = request.sampling_params
    body: dict[str, Any] = {
        "model": model,
        "prompt": request.prompt_ids,
        "max_tokens": params.get("max_tokens") or max_tokens,
        "logprobs": 1,
        "return_token_ids": True,
        **{key: params[key] for key in GENERATE_PARAMS if params.get(key) is not None},
    }
    extra = {key: params[key] for key in VLLM_PARAMS if params.get(key) is not None}
    return body | ({"extra_body": extra} if extra else {})


def generate_answer(completion: dict[str, Any], with_logprobs: bool) -> GenerateAnswer | None:
    """``/generate``'s answer from the text completion; None if the engine sent no token IDs."""
    (choice,) = completion.get("choices") or [{}]
    token_ids = choice.get("token_ids")
    if token_ids is None:
        return None
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs") if with_logprobs else None
    return GenerateAnswer(
        token_ids=token_ids, log_probs=logprobs, stop_reason=choice.get("finish_reason")
    )
