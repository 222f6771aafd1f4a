"""Streams of Responses and Messages calls that LiteLLM serves on the API's own route
(``api_mode: native``), assembled into the complete answer their row keeps.

LiteLLM hands the streaming hook Responses events as objects (the last one, ``response.completed``
or its incomplete/failed siblings, carries the whole response) and Messages events as raw SSE
bytes (assembled with LiteLLM's own Anthropic stream assembler).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from litellm.llms.anthropic.pass_through.stream_assembly import assemble_anthropic_sse_stream

from claw_pipelines.capture.bridge import Bridge
from claw_pipelines.capture.turns import PendingCall, error_turn, native_turn
from claw_pipelines.redaction import Redactor
from claw_pipelines.schemas import Turn, utc_now

FINAL_RESPONSE_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
TOKEN_RESPONSE_EVENTS = frozenset(
    {"response.output_text.delta", "response.function_call_arguments.delta"}
)
FINAL_MESSAGES_EVENT = b"event: message_stop"
TOKEN_MESSAGES_EVENT = b"event: content_block_delta"


def answer_json(answer: object) -> dict[str, Any]:
    """A native answer as LiteLLM hands it over (a Responses object, or a Messages dict with
    LiteLLM's private ``_hidden_params``) as the JSON the agent receives."""
    if isinstance(answer, dict):
        return {k: v for k, v in answer.items() if not k.startswith("_")}
    return answer.model_dump(mode="json", by_alias=True)


@dataclass
class NativeStream:
    """Collects a natively served stream chunk by chunk."""

    frames: list[bytes] = field(default_factory=list)
    final_response: dict[str, Any] | None = None
    first_token_at: datetime | None = None

    def add(self, chunk: object) -> bool:
        """Take a chunk; True if it ends the answer (so it must wait until the turn is spooled)."""
        if isinstance(chunk, str | bytes):
            frame = chunk.encode() if isinstance(chunk, str) else chunk
            self.frames.append(frame)
            if self.first_token_at is None and TOKEN_MESSAGES_EVENT in frame:
                self.first_token_at = utc_now()
            return FINAL_MESSAGES_EVENT in frame
        kind = getattr(chunk, "type", None)
        if self.first_token_at is None and kind in TOKEN_RESPONSE_EVENTS:
            self.first_token_at = utc_now()
        if kind in FINAL_RESPONSE_EVENTS:
            self.final_response = answer_json(chunk.response)
            return True
        return False

    def turns(self, pending: PendingCall, redactor: Redactor, writer_id: str) -> list[Turn]:
        answer = self.answer(pending.bridge)
        if answer is None:
            error = RuntimeError("the stream ended without a complete answer")
            return [error_turn(pending, error, redactor, writer_id)]
        return [native_turn(pending, answer, redactor, writer_id, self.first_token_at)]

    def answer(self, bridge: Bridge) -> dict[str, Any] | None:
        """The complete answer in the API's shape, or None if the stream carried none."""
        if self.final_response is not None or not self.frames:
            return self.final_response
        assembled = assemble_anthropic_sse_stream(self.frames, restore_identity=True)
        return None if assembled is None else bridge.answered(assembled)
