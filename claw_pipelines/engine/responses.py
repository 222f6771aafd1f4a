"""Build vLLM-shaped chat/completion bodies and SSE chunks from generated samples.

Pure functions, so every shape can be checked without a server. Streaming follows vLLM's serving
code: a role chunk per choice (carrying ``prompt_token_ids`` when asked), then one chunk per token
with its ``token_ids`` and logprobs, the finish reason on the choice's last chunk, and an optional
usage chunk with no choices; chunks are serialized with ``exclude_unset`` as vLLM does.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate

from claw_pipelines.engine.protocol import (
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatLogProbs,
    ChatMessage,
    CompletionLogProbs,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
    DeltaMessage,
    DeltaToolCall,
    LogProb,
    LogProbsContent,
    ToolCall,
    UsageInfo,
)
from claw_pipelines.engine.sampling import Sample
from claw_pipelines.engine.tokenizer import token_bytes, token_str


@dataclass(frozen=True)
class Head:
    """Fields every body and chunk of one response repeats."""

    id: str
    created: int
    model: str


@dataclass(frozen=True)
class Choice:
    """A sample placed in a response: its index and the prompt it answers."""

    index: int
    prompt_ids: list[int]
    sample: Sample

    @property
    def finished(self) -> bool:
        return self.sample.finish_reason != "length"

    @property
    def content_ids(self) -> list[int]:
        """The tokens that are text (everything but the trailing end-of-turn token)."""
        ids = self.sample.token_ids
        return ids[:-1] if self.finished else ids


def usage(prompt_tokens: int, choices: Sequence[Choice]) -> UsageInfo:
    completion = sum(len(choice.sample.token_ids) for choice in choices)
    return UsageInfo(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion,
        total_tokens=prompt_tokens + completion,
    )


def _logprob(token: int, logprob: float) -> LogProb:
    return LogProb(token=token_str(token), logprob=logprob, bytes=list(token_bytes(token)))


def _chat_logprob(sample: Sample, position: int, top_k: int) -> LogProbsContent:
    token, logprob = sample.token_ids[position], sample.logprobs[position]
    top = [_logprob(t, lp) for t, lp in sample.top_logprobs[position][:top_k]]
    return LogProbsContent(**_logprob(token, logprob).model_dump(), top_logprobs=top)


def _tool_calls(sample: Sample) -> list[ToolCall]:
    if sample.tool_call is None:
        return []
    return [ToolCall(id=sample.tool_call_id, function=sample.tool_call)]


def chat_response(
    head: Head,
    prompt_ids: list[int],
    choices: Sequence[Choice],
    top_k: int | None,
    return_token_ids: bool,
) -> ChatCompletionResponse:
    """The non-streaming body; ``top_k`` None means no logprobs were asked for."""
    return ChatCompletionResponse(
        id=head.id,
        created=head.created,
        model=head.model,
        choices=[
            ChatCompletionResponseChoice(
                index=choice.index,
                message=ChatMessage(
                    content=None if choice.sample.tool_call else choice.sample.text,
                    tool_calls=_tool_calls(choice.sample),
                ),
                logprobs=None
                if top_k is None
                else ChatLogProbs(
                    content=[
                        _chat_logprob(choice.sample, j, top_k)
                        for j in range(len(choice.sample.token_ids))
                    ]
                ),
                finish_reason=choice.sample.finish_reason,
                token_ids=choice.sample.token_ids if return_token_ids else None,
            )
            for choice in choices
        ],
        usage=usage(len(prompt_ids), choices),
        prompt_token_ids=prompt_ids if return_token_ids else None,
    )


def _text_deltas(ids: list[int]) -> Iterator[str]:
    """Per-token text that never splits a UTF-8 character (as vLLM's incremental detokenizer)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for position, token in enumerate(ids):
        yield decoder.decode(token_bytes(token), final=position == len(ids) - 1)


def _chat_delta(choice: Choice, position: int, text: str) -> DeltaMessage:
    sample = choice.sample
    if position >= len(choice.content_ids):
        return DeltaMessage() if sample.tool_call else DeltaMessage(content="")
    if sample.tool_call is None:
        return DeltaMessage(content=text)
    if position == len(choice.content_ids) - 1:
        call = DeltaToolCall(
            index=0, id=sample.tool_call_id, type="function", function=sample.tool_call
        )
        return DeltaMessage(tool_calls=[call])
    return DeltaMessage()


def chat_chunks(
    head: Head, choice: Choice, top_k: int | None, return_token_ids: bool
) -> Iterator[ChatCompletionStreamResponse]:
    """The stream of one choice: role chunk, then one chunk per generated token."""
    role = ChatCompletionResponseStreamChoice(
        index=choice.index,
        delta=DeltaMessage(role="assistant", content=""),
        logprobs=None,
        finish_reason=None,
    )
    yield ChatCompletionStreamResponse(
        id=head.id,
        object="chat.completion.chunk",
        created=head.created,
        model=head.model,
        choices=[role],
        prompt_token_ids=choice.prompt_ids if return_token_ids else None,
    )
    sample = choice.sample
    texts = _text_deltas(choice.content_ids)
    last = len(sample.token_ids) - 1
    for position, token in enumerate(sample.token_ids):
        text = next(texts) if position < len(choice.content_ids) else ""
        finish = {"finish_reason": sample.finish_reason, "stop_reason": None}
        stream_choice = ChatCompletionResponseStreamChoice(
            index=choice.index,
            delta=_chat_delta(choice, position, text),
            logprobs=None
            if top_k is None
            else ChatLogProbs(content=[_chat_logprob(sample, position, top_k)]),
            token_ids=[token] if return_token_ids else None,
            **(finish if position == last else {"finish_reason": None}),
        )
        yield ChatCompletionStreamResponse(
            id=head.id,
            object="chat.completion.chunk",
            created=head.created,
            model=head.model,
            choices=[stream_choice],
        )


def _completion_logprobs(
    sample: Sample, positions: range, top_k: int, offset: int
) -> CompletionLogProbs:
    tokens = [token_str(sample.token_ids[j]) for j in positions]
    offsets = list(accumulate((len(t) for t in tokens), initial=offset))[: len(tokens)]
    return CompletionLogProbs(
        text_offset=offsets,
        token_logprobs=[sample.logprobs[j] for j in positions],
        tokens=tokens,
        top_logprobs=[
            {token_str(t): lp for t, lp in sample.top_logprobs[j][: max(top_k, 1)]}
            for j in positions
        ],
    )


def completion_response(
    head: Head,
    prompt_tokens: int,
    choices: Sequence[Choice],
    top_k: int | None,
    return_token_ids: bool,
) -> CompletionResponse:
    return CompletionResponse(
        id=head.id,
        created=head.created,
        model=head.model,
        choices=[
            CompletionResponseChoice(
                index=choice.index,
                text=choice.sample.text,
                logprobs=None
                if top_k is None
                else _completion_logprobs(
                    choice.sample, range(len(choice.sample.token_ids)), top_k, 0
                ),
                finish_reason=choice.sample.finish_reason,
                token_ids=choice.sample.token_ids if return_token_ids else None,
                prompt_token_ids=choice.prompt_ids if return_token_ids else None,
            )
            for choice in choices
        ],
        usage=usage(prompt_tokens, choices),
    )


def completion_chunks(
    head: Head, choice: Choice, top_k: int | None, return_token_ids: bool
) -> Iterator[CompletionStreamResponse]:
    """One chunk per token; the choice's first chunk carries its ``prompt_token_ids``."""
    sample = choice.sample
    texts = _text_deltas(choice.content_ids)
    last = len(sample.token_ids) - 1
    offset = 0
    for position, token in enumerate(sample.token_ids):
        text = next(texts) if position < len(choice.content_ids) else ""
        stream_choice = CompletionResponseStreamChoice(
            index=choice.index,
            text=text,
            logprobs=None
            if top_k is None
            else _completion_logprobs(sample, range(position, position + 1), top_k, offset),
            finish_reason=sample.finish_reason if position == last else None,
            stop_reason=None,
            prompt_token_ids=choice.prompt_ids if return_token_ids and position == 0 else None,
            token_ids=[token] if return_token_ids else None,
        )
        offset += len(text)
        yield CompletionStreamResponse(
            id=head.id,
            object="text_completion",
            created=head.created,
            model=head.model,
            choices=[stream_choice],
        )
