"""Assemble a streamed chat or text completion into ``Turn`` rows, chunk by chunk, keeping the
engine's per-chunk token IDs and logprobs (``turns`` builds the rows of whole answers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from claw_pipelines.capture.turns import (
    PendingCall,
    UnusableAnswer,
    base_turn,
    completion_tokens,
    field_of,
    logprob_values,
    scrubbed_json,
    token_source,
)
from claw_pipelines.redaction import Redactor
from claw_pipelines.schemas import Turn, utc_now


@dataclass
class _StreamedChoice:
    content: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    saw_token_ids: bool = False
    missed_token_ids: bool = False
    """A chunk carried a token's logprob but not its ID: LiteLLM drops the IDs of a final chunk
    without text, such as vLLM's end of sequence, so the ID list would be incomplete."""
    saw_logprobs: bool = False
    finish_reason: str | None = None


@dataclass
class StreamAccumulator:
    """Assembles a streamed answer chunk by chunk, keeping per-chunk token IDs and logprobs."""

    choices: dict[int, _StreamedChoice] = field(default_factory=dict)
    prompt_token_ids: list[int] | None = None
    model: str | None = None
    usage: object = None
    first_token_at: datetime | None = None

    def add(self, chunk: object) -> bool:
        """Take a chunk; True if it ends a choice (so it must wait until the turn is spooled)."""
        self.model = self.model or field_of(chunk, "model")
        self.prompt_token_ids = self.prompt_token_ids or field_of(chunk, "prompt_token_ids")
        if field_of(chunk, "usage") is not None:
            self.usage = field_of(chunk, "usage")
        ends = False
        for choice in field_of(chunk, "choices") or []:
            state = self.choices.setdefault(field_of(choice, "index") or 0, _StreamedChoice())
            delta = field_of(choice, "delta")
            content = field_of(delta, "content") if delta is not None else field_of(choice, "text")
            tool_calls = (field_of(delta, "tool_calls") if delta is not None else None) or []
            if content or tool_calls:
                self.first_token_at = self.first_token_at or utc_now()
            if content:
                state.content.append(content)
            for call in tool_calls:
                self._add_tool_call(state, call)
            token_ids = field_of(choice, "token_ids")
            if token_ids is None:
                token_ids = (field_of(choice, "provider_specific_fields") or {}).get("token_ids")
            values = logprob_values(field_of(choice, "logprobs"))
            if token_ids is not None:
                state.saw_token_ids = True
                state.token_ids.extend(token_ids if isinstance(token_ids, list) else [token_ids])
            elif values:
                state.missed_token_ids = True
            if values is not None:
                state.saw_logprobs = True
                state.logprobs.extend(values)
            finish_reason = field_of(choice, "finish_reason")
            state.finish_reason = finish_reason or state.finish_reason
            ends = ends or bool(finish_reason)
        return ends

    @staticmethod
    def _add_tool_call(state: _StreamedChoice, call: object) -> None:
        index = field_of(call, "index") or 0
        entry = state.tool_calls.setdefault(
            index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        entry["id"] = field_of(call, "id") or entry["id"]
        function = field_of(call, "function")
        if function is not None:
            entry["function"]["name"] += field_of(function, "name") or ""
            entry["function"]["arguments"] += field_of(function, "arguments") or ""

    def turns(self, pending: PendingCall, redactor: Redactor, writer_id: str) -> list[Turn]:
        if not self.choices:
            raise UnusableAnswer("the stream carried no choices")
        turns = []
        for index in sorted(self.choices):
            state = self.choices[index]
            message: dict[str, Any] = {"role": "assistant", "content": "".join(state.content)}
            if state.tool_calls:
                message["tool_calls"] = [state.tool_calls[i] for i in sorted(state.tool_calls)]
            complete_ids = state.saw_token_ids and not state.missed_token_ids
            response_ids = state.token_ids if complete_ids else None
            turns.append(
                base_turn(
                    pending,
                    index,
                    model=str(self.model or pending.model),
                    status="success",
                    finish_reason=state.finish_reason,
                    token_source=token_source(self.prompt_token_ids, response_ids),
                    prompt_token_ids=self.prompt_token_ids,
                    response_token_ids=response_ids,
                    response_logprobs=state.logprobs if state.saw_logprobs else None,
                    response_message=scrubbed_json(message, redactor),
                    response_text=redactor.text(message["content"]) or None,
                    first_token_at=self.first_token_at,
                    prompt_tokens=field_of(self.usage, "prompt_tokens") if self.usage else None,
                    completion_tokens=completion_tokens(response_ids, self.usage),
                    writer_id=writer_id,
                )
            )
        return turns
