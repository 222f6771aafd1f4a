"""The LiteLLM ``CustomLogger`` that lands every answered turn in the spool before it is answered.

LiteLLM's success callbacks run after the response is sent (and are lost on shutdown), so this
logger uses request-path hooks instead: ``async_post_call_success_hook`` for complete responses,
the streaming iterator hook for streams (the final chunk is held until the turn is spooled) and
``async_post_call_failure_hook`` for errors. Each hook does one local append and returns; Delta
commits happen in the flusher thread. An answer no row can be made of (``UnusableAnswer``) lands
an error row and fails the call with a 502 naming the problem: LiteLLM runs the failure hook
after a success hook raises, but this one has already taken the call's pending state. Once a
turn is spooled, its answer loses the token IDs and logprobs capture asked the engine for and
the agent did not (``asked_fields``).

Every model route an agent speaks is captured: chat and text completions, and Responses and
Messages calls, either bridged to the engine's chat call by the HTTP edge (this logger then sees
a chat call, and the bridge in the request context makes the native answer) or served by
LiteLLM on the API's own route (call types ``aresponses`` / ``anthropic_messages``; LiteLLM
1.108.7 runs these same four hooks for both routes).

Registered in resources/litellm.yaml as ``claw_pipelines.capture.callback.capture_logger``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, NoReturn

from fastapi import HTTPException
from litellm.integrations.custom_logger import CustomLogger

from claw_pipelines.capture.apis import CALL_TYPE_APIS, NATIVE_APIS
from claw_pipelines.capture.asked_fields import AskedFields, ask_for_capture, withhold_unasked
from claw_pipelines.capture.bridge import BRIDGES, BridgeRequestError
from claw_pipelines.capture.native import NativeStream, answer_json
from claw_pipelines.capture.prompt_prefixes import land_turns
from claw_pipelines.capture.request_context import RequestContext, current_request
from claw_pipelines.capture.runtime import CaptureRuntime
from claw_pipelines.capture.stream_turns import StreamAccumulator
from claw_pipelines.capture.turns import (
    PendingCall,
    UnusableAnswer,
    error_turn,
    native_turn,
    pending_call,
    require_choices,
    scrubbed_json,
    turns_from_response,
)
from claw_pipelines.identity import IdentityError, identity_from_request
from claw_pipelines.policy.gate import stamp_served_version
from claw_pipelines.schemas import AgentApi, Turn

UNREADABLE_ANSWER = "Invalid response object"
"""LiteLLM's error when a backend answer does not convert to its response type (a choice without
a ``message``). Its status guess then matches any ``429`` in the answer it quotes, a token ID
say, and answers a rate limit: an agent retrying on 429 would repeat a failure that repeats. The
failure hook answers such a call 502, as any answer that cannot be stored."""


def _request_headers(data: dict[str, Any]) -> dict[str, str]:
    headers = (data.get("proxy_server_request") or {}).get("headers") or {}
    return {str(k).lower(): str(v) for k, v in headers.items()}


class CaptureLogger(CustomLogger):
    """Captures turns on the proxy's request path; see the module docstring for why."""

    def __init__(self) -> None:
        super().__init__()
        self.runtime = CaptureRuntime.current()

    async def async_pre_call_hook(self, user_api_key_dict, cache, data: dict, call_type):
        api = CALL_TYPE_APIS.get(call_type)
        if api is None:
            return data
        context = current_request.get() or RequestContext(None, client_stream=False)
        try:
            identity = identity_from_request(
                _request_headers(data), (context.body_metadata or {}).get("claw")
            )
        except IdentityError as error:
            raise HTTPException(status_code=400, detail=str(error)) from error
        identity, metadata = stamp_served_version(identity, context.body_metadata)
        client_stream = bool(data.get("stream")) or context.client_stream
        if api in NATIVE_APIS:
            pending = self._native_pending(data, api, identity, metadata, context, client_stream)
        else:
            asked = AskedFields.of(data)
            ask_for_capture(data, self.runtime.options_for(str(data.get("model", ""))))
            bridge = context.bridge
            pending = pending_call(
                str(data["litellm_call_id"]),
                data,
                identity,
                metadata,
                client_stream,
                self.runtime.redactor,
                api=bridge.api if bridge else None,
                api_request=bridge.request if bridge else None,
                bridge=bridge,
                asked=asked,
            )
        self.runtime.remember(pending)
        return data

    def _native_pending(
        self,
        data: dict,
        api: AgentApi,
        identity,
        metadata: dict | None,
        context: RequestContext,
        client_stream: bool,
    ) -> PendingCall:
        """A Responses or Messages call LiteLLM serves itself: its normalized columns are the
        bridge's chat translation of the agent's request (kept by the edge, as sent)."""
        body = context.body or {}
        bridge = BRIDGES[api](body)
        try:
            chat = bridge.chat_request(stream=False)
        except BridgeRequestError:
            chat = {"model": body.get("model", data.get("model", ""))}
        return pending_call(
            str(data["litellm_call_id"]),
            chat,
            identity,
            metadata,
            client_stream,
            self.runtime.redactor,
            api=api,
            api_request=body,
            bridge=bridge,
            native=True,
        )

    async def async_post_call_success_hook(self, data: dict, user_api_key_dict, response):
        pending = self.runtime.pending.pop(str(data.get("litellm_call_id")), None)
        if pending is None:
            return None
        try:
            turns = self._answer_turns(pending, response)
        except UnusableAnswer as error:
            await self._land_unusable(pending, error)
        await land_turns(self.runtime, turns)
        withhold_unasked(response, pending.asked)
        return None

    def _answer_turns(self, pending: PendingCall, response: object) -> list[Turn]:
        redactor, writer_id = self.runtime.redactor, self.runtime.writer.writer_id
        if pending.native:
            return [native_turn(pending, answer_json(response), redactor, writer_id)]
        if pending.bridge is None:
            return turns_from_response(pending, response, redactor, writer_id)
        require_choices(response)  # the bridge's translation needs one
        api_response = scrubbed_json(pending.bridge.answered(response), redactor)
        return turns_from_response(pending, response, redactor, writer_id, api_response)

    async def _land_unusable(self, pending: PendingCall, error: UnusableAnswer) -> NoReturn:
        """Land the error row of an answer no row can be made of, then fail the call."""
        row = error_turn(pending, error, self.runtime.redactor, self.runtime.writer.writer_id)
        await land_turns(self.runtime, [row])
        raise error

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
        collect = NativeStream() if pending.native else StreamAccumulator()
        held: list[Any] = []
        try:
            async for chunk in response:
                ends = collect.add(chunk)
                withhold_unasked(chunk, pending.asked)
                if ends or held:
                    held.append(chunk)
                else:
                    yield chunk
            turns = collect.turns(pending, self.runtime.redactor, self.runtime.writer.writer_id)
        except UnusableAnswer as error:
            await self._land_unusable(pending, error)
        await land_turns(self.runtime, turns)
        for chunk in held:
            yield chunk

    async def async_post_call_failure_hook(
        self,
        request_data: dict,
        original_exception: Exception,
        user_api_key_dict,
        traceback_str=None,
    ):
        unreadable = UNREADABLE_ANSWER in str(original_exception)
        failure = UnusableAnswer("it does not parse as a chat answer") if unreadable else None
        pending = self.runtime.pending.pop(str(request_data.get("litellm_call_id")), None)
        if pending is not None:
            row = error_turn(
                pending,
                failure or original_exception,
                self.runtime.redactor,
                self.runtime.writer.writer_id,
            )
            await land_turns(self.runtime, [row])
        if failure is not None:
            return HTTPException(status_code=failure.status_code, detail=failure.message)
        return None


capture_logger = CaptureLogger()
