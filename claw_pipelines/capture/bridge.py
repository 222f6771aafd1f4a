"""Serving the Responses and Messages APIs through the engine's chat completions call.

vLLM's own ``/v1/responses`` and ``/v1/messages`` return no prompt or response token IDs (the
Messages answer has no logprobs either), and LiteLLM's Anthropic adapter drops what chat returns.
So for a model with ``api_mode: bridge`` the HTTP edge turns such a request into a chat
completions request, the inner LiteLLM app serves it as an ordinary chat call (the capture hooks
see the engine's exact IDs), and the chat answer is turned back into the agent's API: a JSON
answer, its native event stream (buffered), or native events translated chunk by chunk
(passthrough). The translations are LiteLLM's own: its Responses-to-chat bridge
(``litellm.responses.litellm_completion_transformation``) and its Anthropic adapter.

The native answer is made once, by the capture hook that spools the turn (``Bridge.answered``),
so the row's ``api_response`` is what the agent receives.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from litellm.anthropic_interface.exceptions.exception_mapping_utils import (
    AnthropicExceptionMapping,
)
from litellm.litellm_core_utils.core_helpers import map_finish_reason
from litellm.llms.anthropic.pass_through.adapters.streaming_iterator import (
    AnthropicStreamWrapper,
)
from litellm.llms.anthropic.pass_through.adapters.transformation import (
    LiteLLMAnthropicMessagesAdapter,
)
from litellm.llms.anthropic.pass_through.messages.fake_stream_iterator import (
    FakeAnthropicMessagesStreamIterator,
)
from litellm.responses.litellm_completion_transformation.streaming_iterator import (
    LiteLLMCompletionStreamingIterator,
)
from litellm.responses.litellm_completion_transformation.transformation import (
    LiteLLMCompletionResponsesConfig as ResponsesChat,
)
from litellm.responses.streaming_iterator import build_synthetic_response_events
from litellm.types.llms.openai import ResponsesAPIResponse
from litellm.types.utils import ModelResponse, ModelResponseStream
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from claw_pipelines.schemas import AgentApi

PROVIDER = "hosted_vllm"
"""The provider the transformations are told they translate for: the engine speaks vLLM's chat."""
LITELLM_ONLY_KEYS = ("custom_llm_provider", "extra_headers")
"""Keys the transformations add for ``litellm.completion``, not part of a chat request body."""
CHAT_OUTPUT_ITEMS = ("message", "function_call")
"""Responses output items that have a chat equivalent (reasoning items are left out)."""
WHOLE_TEXT = 2**31
"""Chunk size for a buffered stream's text deltas: the answer is complete, send it in one."""


class BridgeRequestError(ValueError):
    """A request the bridge cannot serve; the message names the field and what to do."""


def _problems(error: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in error.errors()
    )


class ResponsesBody(BaseModel):
    """What the bridge needs of a Responses request (other fields pass through)."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]]
    stream: bool | None = None
    previous_response_id: str | None = None

    @field_validator("previous_response_id")
    @classmethod
    def _stateless(cls, value: str | None) -> str | None:
        if value is not None:
            raise ValueError(
                "the capture proxy stores no responses to continue from: send the whole "
                "conversation in `input` (with store: false)"
            )
        return value


class MessagesBody(BaseModel):
    """What the bridge needs of an Anthropic Messages request (other fields pass through)."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    stream: bool | None = None


class Bridge(ABC):
    """One bridged call: the agent's request, its chat translation and (once made) its answer."""

    api: ClassVar[AgentApi]
    body: ClassVar[type[BaseModel]]

    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request
        self.answer: dict[str, Any] | None = None

    @classmethod
    def from_request(cls, request: dict[str, Any]) -> Bridge:
        try:
            cls.body.model_validate(request)
        except ValidationError as error:
            raise BridgeRequestError(f"invalid {cls.api} request: {_problems(error)}") from error
        return cls(request)

    def chat_request(self, stream: bool) -> dict[str, Any]:
        """The chat completions body for this request (``stream`` as the upstream call is)."""
        try:
            chat = self._chat_request(stream)
        except Exception as error:
            raise BridgeRequestError(
                f"cannot translate this {self.api} request to chat completions: {error}"
            ) from error
        return {k: v for k, v in chat.items() if k not in LITELLM_ONLY_KEYS}

    def answered(self, completion: ModelResponse) -> dict[str, Any]:
        """Make (once) and keep the native answer to the chat ``completion``; it names the model
        as the agent asked for it, as LiteLLM's own routes do."""
        if self.answer is None:
            self.answer = self._answer(completion)
        return self.answer

    @abstractmethod
    def _chat_request(self, stream: bool) -> dict[str, Any]: ...

    @abstractmethod
    def _answer(self, completion: ModelResponse) -> dict[str, Any]: ...

    @abstractmethod
    def chat_view(self, answer: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """A native answer (of a call LiteLLM served on the API's own route) as a chat
        assistant message and finish reason, for the rows' normalized columns."""

    @abstractmethod
    def events(self) -> bytes:
        """The native SSE event sequence of the (complete) answer: a buffered stream."""

    @abstractmethod
    def stream(self, chunks: AsyncIterator[ModelResponseStream]) -> AsyncIterator[bytes]:
        """Native SSE frames translated from a streamed chat answer: a passthrough stream."""

    @classmethod
    @abstractmethod
    def error_body(cls, status: int, message: str) -> dict[str, Any]:
        """An error in the API's shape (a request the edge cannot translate, say)."""

    def upstream_error(self, status: int, body: bytes) -> bytes:
        """The inner chat call's (OpenAI-shaped) error body, in the API's shape."""
        return json.dumps(self.error_body(status, error_message(body))).encode()


def _text(content: object) -> str:
    if isinstance(content, list):
        return "".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return str(content or "")


def _one_assistant_message(messages: list[Any]) -> dict[str, Any]:
    """The chat messages an answer translates to, as one assistant message."""
    tool_calls = [dict(call) for m in messages for call in (m.get("tool_calls") or [])]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(_text(m.get("content")) for m in messages),
    }
    if tool_calls:
        message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in tool_calls]
    return message


def _sse(event: BaseModel) -> bytes:
    """One SSE frame of a Responses event, named by its ``type`` as OpenAI's API names them."""
    payload = event.model_dump(mode="json", by_alias=True)
    return f"event: {payload['type']}\ndata: {json.dumps(payload)}\n\n".encode()


class _ChunkSource:
    """A chat chunk iterator shaped like LiteLLM's stream wrapper, as its translators expect."""

    logging_obj = None

    def __init__(self, chunks: AsyncIterator[ModelResponseStream]) -> None:
        self._chunks = chunks

    def __aiter__(self) -> _ChunkSource:
        return self

    async def __anext__(self) -> ModelResponseStream:
        return await anext(self._chunks)


class ResponsesBridge(Bridge):
    api = "responses"
    body = ResponsesBody

    def __init__(self, request: dict[str, Any]) -> None:
        super().__init__(request)
        self._params = {k: v for k, v in request.items() if k not in ("model", "input", "stream")}
        self._response: ResponsesAPIResponse | None = None

    def _chat_request(self, stream: bool) -> dict[str, Any]:
        chat = ResponsesChat.transform_responses_api_request_to_chat_completion_request(
            model=self.request["model"],
            input=self.request["input"],
            responses_api_request=self._params,
            custom_llm_provider=PROVIDER,
            stream=stream,
        )
        if isinstance(self.request.get("metadata"), dict):
            chat["metadata"] = self.request["metadata"]
        return chat

    def _answer(self, completion: ModelResponse) -> dict[str, Any]:
        response = ResponsesChat.transform_chat_completion_response_to_responses_api_response(
            request_input=self.request["input"],
            responses_api_request=self._params,
            chat_completion_response=completion,
        )
        response.model = self.request["model"]
        self._response = response
        return response.model_dump(mode="json", by_alias=True)

    def chat_view(self, answer: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        items = [i for i in answer.get("output") or [] if i.get("type") in CHAT_OUTPUT_ITEMS]
        message = _one_assistant_message(
            ResponsesChat.transform_responses_api_input_to_messages(
                input=items, responses_api_request={}
            )
        )
        if (answer.get("incomplete_details") or {}).get("reason") == "max_output_tokens":
            return message, "length"
        return message, "tool_calls" if message.get("tool_calls") else "stop"

    def events(self) -> bytes:
        events = build_synthetic_response_events(
            transformed=self._response, logging_obj=None, chunk_size=WHOLE_TEXT
        )
        return b"".join(_sse(event) for event in events)

    async def stream(self, chunks: AsyncIterator[ModelResponseStream]) -> AsyncIterator[bytes]:
        translated = LiteLLMCompletionStreamingIterator(
            model=self.request["model"],
            litellm_custom_stream_wrapper=_ChunkSource(chunks),
            request_input=self.request["input"],
            responses_api_request=self._params,
            custom_llm_provider=PROVIDER,
        )
        async for event in translated:
            yield _sse(event)

    @classmethod
    def error_body(cls, status: int, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": "invalid_request_error", "param": None}}

    def upstream_error(self, status: int, body: bytes) -> bytes:
        return body


class MessagesBridge(Bridge):
    api = "messages"
    body = MessagesBody

    def __init__(self, request: dict[str, Any]) -> None:
        super().__init__(request)
        self._adapter = LiteLLMAnthropicMessagesAdapter()
        self._tool_names: dict[str, str] = {}

    def _chat_request(self, stream: bool) -> dict[str, Any]:
        native = {k: v for k, v in self.request.items() if k != "stream"}
        chat, self._tool_names = self._adapter.translate_anthropic_to_openai(
            native, custom_llm_provider=PROVIDER
        )
        return {**chat, "stream": stream}

    def _answer(self, completion: ModelResponse) -> dict[str, Any]:
        answer = self._adapter.translate_openai_response_to_anthropic(completion, self._tool_names)
        return {**answer, "model": self.request["model"]}

    def chat_view(self, answer: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        assistant = {"role": "assistant", "content": answer.get("content") or []}
        message = _one_assistant_message(
            self._adapter.translate_anthropic_messages_to_openai(messages=[assistant])
        )
        reason = answer.get("stop_reason")
        return message, map_finish_reason(reason) if reason else None

    def events(self) -> bytes:
        return b"".join(FakeAnthropicMessagesStreamIterator(self.answer or {}).chunks)

    async def stream(self, chunks: AsyncIterator[ModelResponseStream]) -> AsyncIterator[bytes]:
        wrapper = AnthropicStreamWrapper(
            completion_stream=_ChunkSource(chunks),
            model=self.request["model"],
            tool_name_mapping=self._tool_names,
        )
        async for frame in wrapper.async_anthropic_sse_wrapper():
            yield frame

    @classmethod
    def error_body(cls, status: int, message: str) -> dict[str, Any]:
        return dict(AnthropicExceptionMapping.create_error_response(status, message))


BRIDGES: dict[AgentApi, type[Bridge]] = {"responses": ResponsesBridge, "messages": MessagesBridge}


def error_message(body: bytes) -> str:
    """The message of an OpenAI-shaped error body (LiteLLM's), or the body's text."""
    try:
        parsed = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return body.decode("utf-8", "replace")
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    return json.dumps(parsed)
