"""Request and response models of the engine, field for field as vLLM's OpenAI server names them.

Mirrors ``vllm/entrypoints/openai/{chat_completion,completion}/protocol.py`` and
``serve/engine/protocol.py`` (vLLM >= 0.10.2, request checks as in 0.33): ``return_token_ids`` on
requests, top-level ``prompt_token_ids`` on chat responses (first chunk when streaming),
``choices[i].token_ids``, ``stop_reason``, ``{"error": {message, type, param, code}}`` errors.
Requests allow unknown keys, as vLLM does, so agent metadata and fields the simulator does not use
(``parallel_tool_calls``, ``stop``, ``metadata``...) pass through harmlessly.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_serializer,
    model_validator,
)

from claw_pipelines.engine.content import Part, check_parts, content_text
from claw_pipelines.engine.errors import validation_error

MAX_TOP_LOGPROBS = 20
MAX_N = 128
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionCall(OpenAIBaseModel):
    name: str
    arguments: str


class ToolCall(OpenAIBaseModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(OpenAIBaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Part] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _text_parts_only(cls, content: str | list[Part] | None) -> str | list[Part] | None:
        if isinstance(content, list):
            check_parts(content)
        return content

    def text(self) -> str:
        return content_text(self.content, self.role)


class FunctionDefinition(OpenAIBaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenAIBaseModel):
    name: str


class NamedToolChoice(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class SamplingRequest(OpenAIBaseModel):
    """What chat and completion requests share. Nullable where vLLM's fields are."""

    model: str | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    seed: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # Validated as vLLM does (bad values are 400s); the simulated policy does not use them.
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    return_token_ids: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _stream_options_need_stream(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("stream_options") and not data.get("stream"):
            raise validation_error(
                "Stream options can only be defined when `stream=True`.", "stream_options"
            )
        return data

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingRequest):
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = True
    reasoning_effort: ReasoningEffort | None = None
    add_generation_prompt: bool = True

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if data.get("top_logprobs") and not data.get("logprobs"):
                raise validation_error(
                    "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
                )
            check_tool_usage(data)
        return data

    @property
    def output_limit(self) -> int | None:
        """vLLM reads ``max_completion_tokens`` when given, else ``max_tokens``."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def output_param(self) -> str:
        return "max_tokens" if self.max_completion_tokens is None else "max_completion_tokens"


def check_tool_usage(data: dict[str, Any]) -> None:
    """vLLM's ``check_tool_usage``, messages included. No ``tool_choice`` means "auto"."""
    tools, choice = data.get("tools"), data.get("tool_choice")
    if tools == []:
        raise validation_error(
            "`tools` must not be an empty array. Either provide at least one tool or omit the "
            "field entirely.",
            "tools",
        )
    if choice is None or choice == "none":
        return
    if tools is None:
        raise validation_error("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise validation_error(
            f'Invalid value for `tool_choice`: {choice}! Only named tools, "none", "auto" '
            'or "required" are supported.',
            "tool_choice",
        )
    if isinstance(choice, dict):
        declared = {_function_name(tool) for tool in tools if isinstance(tool, dict)}
        if _function_name(choice) not in declared:
            raise validation_error(
                "The tool specified in `tool_choice` does not match any of the specified `tools`",
                "tool_choice",
            )


def _function_name(item: dict[str, Any]) -> object:
    function = item.get("function")
    return function.get("name") if isinstance(function, dict) else None


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool | None = False

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("`echo` is not supported by the simulator.")
        if self.prompt in ("", []):
            raise ValueError("Either prompt or prompt_embeds must be provided and non-empty.")
        return self

    @property
    def output_limit(self) -> int | None:
        return self.max_tokens

    @property
    def output_param(self) -> str:
        return "max_tokens"


class TokenizeRequest(OpenAIBaseModel):
    """vLLM's TokenizeCompletionRequest | TokenizeChatRequest: ``prompt`` or ``messages``."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    tools: list[Tool] | None = None
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of `prompt` or `messages`.")
        return self


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[int]


# Responses -------------------------------------------------------------------------------------


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: dict[str, int] | None = None


class LogProb(OpenAIBaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class LogProbsContent(LogProb):
    top_logprobs: list[LogProb] = Field(default_factory=list)


class ChatLogProbs(OpenAIBaseModel):
    content: list[LogProbsContent] | None = None


class CompletionLogProbs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class ChatMessage(OpenAIBaseModel):
    role: str = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)

    @model_serializer(mode="wrap")
    def _drop_empty_tool_calls(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        if not data.get("tool_calls"):
            data.pop("tool_calls", None)
        return data


class ChatCompletionResponseChoice(OpenAIBaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatLogProbs | None = None
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionResponseChoice]
    system_fingerprint: str | None = None
    usage: UsageInfo
    prompt_logprobs: None = None
    prompt_token_ids: list[int] | None = None
    kv_transfer_params: dict[str, Any] | None = None


class DeltaToolCall(OpenAIBaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCall | None = None


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] = Field(default_factory=list)


class ChatCompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionStreamResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = None


class CompletionResponseChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_logprobs: None = None
    prompt_token_ids: list[int] | None = None


class CompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionResponseChoice]
    system_fingerprint: str | None = None
    usage: UsageInfo
    kv_transfer_params: dict[str, Any] | None = None


class CompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


class CompletionStreamResponse(OpenAIBaseModel):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionResponseStreamChoice]
    usage: UsageInfo | None = None


class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    error: ErrorInfo


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str
