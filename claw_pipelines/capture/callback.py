"""The LiteLLM ``CustomLogger`` that lands every answered turn in the spool before it is answered.

LiteLLM's success callbacks run after the response is sent (and are lost on shutdown), so this
logger uses request-path hooks instead: ``async_post_call_success_hook`` for complete responses,
the streaming iterator hook for streams (the final chunk is held until the turn is spooled) and
``async_post_call_failure_hook`` for errors. Each hook does one local append and returns; Delta
commits happen in the flusher thread.

Registered in resources/litellm.yaml as ``claw_pipelines.capture.callback.capture_logger``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from fastapi import HTTPException
from litellm.integrations.custom_logger import CustomLogger

from claw_pipelines.capture.identity import IdentityError, identity_from_request
from claw_pipelines.capture.policy import stamp_served_version
from claw_pipelines.capture.request_context import RequestContext, current_request
from claw_pipelines.capture.runtime import CaptureRuntime
from claw_pipelines.capture.turns import (
    StreamAccumulator,
    error_turn,
    pending_call,
    turns_from_response,
)

CHAT_CALL_TYPES = {"completion", "acompletion", "text_completion", "atext_completion"}


def _request_headers(data: dict[str, Any]) -> dict[str, str]:
    headers = (data.get("proxy_server_request") or {}).get("headers") or {}
    return {str(k).lower(): str(v) for k, v in headers.items()}


def _has_finish_reason(chunk: object) -> bool:
    return any(getattr(choice, "finish_reason", None) for choice in getattr(chunk, "choices", []))


class CaptureLogger(CustomLogger):
    """Captures turns on the proxy's request path; see the module docstring for why."""

    def __init__(self) -> None:
        super().__init__()
        self.runtime = CaptureRuntime.current()

    async def async_pre_call_hook(self, user_api_key_dict, cache, data: dict, call_type):
        if call_type not in CHAT_CALL_TYPES:
            return data
        headers = _request_headers(data)
        context = current_request.get() or RequestContext(None, client_stream=False)
        metadata = context.body_metadata
        claw_metadata = (metadata or {}).get("claw")
        try:
            identity = identity_from_request(headers, claw_metadata)
        except IdentityError as error:
            raise HTTPException(status_code=400, detail=str(error)) from error
        identity, metadata = stamp_served_version(identity, metadata)
        options = self.runtime.options_for(str(data.get("model", "")))
        if options.return_token_ids:
            data["return_token_ids"] = True
        if options.logprobs and not data.get("logprobs"):
            data["logprobs"] = True
            if options.top_logprobs is not None:
                data["top_logprobs"] = options.top_logprobs
        client_stream = bool(data.get("stream")) or context.client_stream
        self.runtime.remember(
            pending_call(
                str(data["litellm_call_id"]),
                data,
                identity,
                metadata,
                client_stream,
                self.runtime.redactor,
            )
        )
        return data

    async def async_post_call_success_hook(self, data: dict, user_api_key_dict, response):
        pending = self.runtime.pending.pop(str(data.get("litellm_call_id")), None)
        if pending is None:
            return None
        turns = turns_from_response(
            pending, response, self.runtime.redactor, self.runtime.writer.writer_id
        )
        await self.runtime.land_durably(turns)
        return None

    async def async_post_call_streaming_iterator_hook(
        self,
        user_api_key_dict,
        response,
        request_data: dict,
    ) -> AsyncGenerator[Any, None]:
        pending = self.runtime.pending.pop(str(request_data.get("litellm_call_id")), None)
        if pending is None:
            async for chunk in response:
                yield chunk
            return
        accumulator = StreamAccumulator()
        held: list[Any] = []
        async for chunk in response:
            accumulator.add(chunk)
            if held or _has_finish_reason(chunk):
                held.append(chunk)
            else:
                yield chunk
        turns = accumulator.turns(pending, self.runtime.redactor, self.runtime.writer.writer_id)
        await self.runtime.land_durably(turns)
        for chunk in held:
            yield chunk

    async def async_post_call_failure_hook(
        self,
        request_data: dict,
        original_exception: Exception,
        user_api_key_dict,
        traceback_str=None,
    ):
        pending = self.runtime.pending.pop(str(request_data.get("litellm_call_id")), None)
        if pending is None:
            return None
        row = error_turn(
            pending, original_exception, self.runtime.redactor, self.runtime.writer.writer_id
        )
        await self.runtime.land_durably([row])
        return None


capture_logger = CaptureLogger()
