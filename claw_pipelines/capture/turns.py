"""Build ``Turn`` rows from what the proxy saw: the request, then a response, a stream or an error.

Token IDs are taken only from what the engine returned (vLLM's ``prompt_token_ids`` and
``choices[i].token_ids``, which LiteLLM moves to ``provider_specific_fields``); response text is
never re-tokenized into "engine" IDs. Everything written passes through the ``Redactor``.

An answer no row can be made of (no choices, token IDs that are not int32 vocabulary indices, a
non-finite logprob) raises ``UnusableAnswer``: the call then fails with an error row, instead of
a 200 whose row never lands or a 500 after its row landed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from claw_pipelines.capture import json_text
from claw_pipelines.capture.asked_fields import EVERYTHING, AskedFields
from claw_pipelines.capture.request_body import path_text
from claw_pipelines.identity import IDENTITY_FIELDS, TurnIdentity
from claw_pipelines.redaction import Redactor
from claw_pipelines.schemas import AgentApi, Turn, utc_now

if TYPE_CHECKING:
    from claw_pipelines.capture.bridge import Bridge

SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logprobs",
    "top_logprobs",
    "return_token_ids",
    "tool_choice",
    "response_format",
)


class UnusableAnswer(Exception):
    """A backend answer that no row can be made of; the message names what is wrong with it.

    The capture hooks land an error row and fail the call with it: LiteLLM's proxy answers an
    exception's ``status_code`` and ``message`` (502: the backend, not the client, erred), and
    the agent gets that message rather than a validation dump.
    """

    status_code = 502

    def __init__(self, problem: str) -> None:
        self.message = f"the model backend's answer cannot be stored: {problem}"
        super().__init__(self.message)


def _problems(error: ValidationError) -> str:
    return "; ".join(f"{path_text(tuple(e['loc']))}: {e['msg']}" for e in error.errors())


def require_choices(response: object) -> list[Any]:
    """The answer's choices; an answer without any has nothing to hand the agent or to land."""
    choices = field_of(response, "choices")
    if not choices:
        raise UnusableAnswer("it has no choices")
    return choices


def scrubbed_json(value: object, redactor: Redactor) -> str | None:
    """``value`` as JSON text with secrets scrubbed (None stays None)."""
    if value is None:
        return None
    return json_text.dumps(redactor.data(value))


def field_of(obj: object, name: str) -> Any:
    """Attribute or key access, for LiteLLM objects that may also arrive as plain dicts."""
    if isinstance(obj, dict):
        return obj.get(name)
    value = getattr(obj, name, None)
    if value is None:
        extra = getattr(obj, "model_extra", None) or {}
        value = extra.get(name)
    return value


def _dump(obj: object) -> Any:
    return obj.model_dump() if hasattr(obj, "model_dump") else obj


@dataclass
class PendingCall:
    """What is known about a call when it enters the proxy, kept until its answer is spooled.

    ``api_request`` is the agent's own request (Responses and Messages calls); ``bridge``
    translates between that API and chat, for a call served through chat or, with ``native``,
    one LiteLLM served on the API's own route.
    """

    call_id: str
    identity: TurnIdentity
    model: str
    call_type: str
    stream: bool
    started_at: datetime
    request_messages: str | None
    request_tools: str | None
    sampling_params: str | None
    metadata: str | None
    api: AgentApi
    api_request: str | None = None
    bridge: Bridge | None = None
    native: bool = False
    asked: AskedFields = EVERYTHING
    """What the agent's answer may show of the engine's token IDs and logprobs."""


def pending_call(
    call_id: str,
    data: dict[str, Any],
    identity: TurnIdentity,
    body_metadata: dict[str, Any] | None,
    client_stream: bool,
    redactor: Redactor,
    *,
    api: AgentApi | None = None,
    api_request: dict[str, Any] | None = None,
    bridge: Bridge | None = None,
    native: bool = False,
    asked: AskedFields = EVERYTHING,
) -> PendingCall:
    """Snapshot the request side of a call (scrubbed) at the moment the proxy accepts it.

    ``data`` is a chat (or text completion) request: for a Responses or Messages call, its
    translation to chat, so the normalized columns read the same whatever the agent spoke
    (``api`` says which; by default the one ``data`` is).
    """
    messages = data.get("messages")
    if messages is None and data.get("prompt") is not None:
        messages = [{"role": "user", "content": data["prompt"]}]
    metadata = dict(body_metadata or {})
    claw = metadata.get("claw")
    if isinstance(claw, dict):
        metadata["claw"] = {k: v for k, v in claw.items() if k not in IDENTITY_FIELDS}
    sampling = {key: data[key] for key in SAMPLING_KEYS if data.get(key) is not None}
    text_completion = "prompt" in data and "messages" not in data
    return PendingCall(
        call_id=call_id,
        identity=identity,
        model=redactor.text(str(data.get("model", ""))),
        call_type="completion" if text_completion else "chat",
        stream=client_stream,
        started_at=utc_now(),
        request_messages=scrubbed_json(messages, redactor),
        request_tools=scrubbed_json(data.get("tools"), redactor),
        sampling_params=scrubbed_json(sampling, redactor) if sampling else None,
        metadata=scrubbed_json(metadata, redactor) if metadata else None,
        api=api or ("completions" if text_completion else "chat"),
        api_request=scrubbed_json(api_request, redactor),
        bridge=bridge,
        native=native,
        asked=asked,
    )


def _backend(hidden_params: dict[str, Any] | None) -> str | None:
    if not hidden_params:
        return None
    provider = hidden_params.get("custom_llm_provider")
    api_base = hidden_params.get("api_base")
    return ":".join(str(p) for p in (provider, api_base) if p) or None


def logprob_values(logprobs: object) -> list[float] | None:
    """Per-token logprobs, from the chat format (``content[].logprob``) or the text-completion
    one (``token_logprobs``); None when any is missing, as a partial list would misalign.

    The alternatives' logprobs (``top_logprobs``) go to the agent with the answer, which a
    non-finite one would fail to serialize after the row landed, so they are checked here; the
    chosen ones are checked with the row. One pass: a chat answer has an entry per token.
    """
    if logprobs is None:
        return None
    content = field_of(logprobs, "content")
    if content is None:
        values = field_of(logprobs, "token_logprobs")
        return None if values is None or None in values else values
    values, alternatives = [], []
    for entry in content:
        if isinstance(entry, dict):
            value, tops = entry.get("logprob"), entry.get("top_logprobs")
        else:  # inline: one call per token would cost more than the reads
            value, tops = getattr(entry, "logprob", None), getattr(entry, "top_logprobs", None)
            value = field_of(entry, "logprob") if value is None else value
            tops = field_of(entry, "top_logprobs") if tops is None else tops
        values.append(value)
        if tops:
            alternatives += [field_of(top, "logprob") for top in tops]
    if None in values:
        return None
    if not all(isinstance(value, int | float) and math.isfinite(value) for value in alternatives):
        raise UnusableAnswer("a top_logprobs logprob is not a finite number")
    return values


def completion_tokens(response_ids: list[int] | None, usage: object) -> int | None:
    """A choice's own length when its IDs are known: with n > 1, usage counts every choice."""
    if isinstance(response_ids, list):
        return len(response_ids)
    return field_of(usage, "completion_tokens") if usage else None


def token_source(prompt_ids: list[int] | None, response_ids: list[int] | None) -> str:
    return "engine" if prompt_ids is not None and response_ids is not None else "none"


def _choice_identity(pending: PendingCall, choice: int) -> dict[str, Any]:
    """The turn id and identity of one choice: with ``n > 1`` each choice is its own rollout.

    Choice 0 keeps the call's id and trajectory, so an agent that goes on with the first choice
    stays one trajectory; choice ``i`` lands as ``<call id>.<i>`` in trajectory
    ``<trajectory id>.<i>`` of the same group (single-step GRPO samples a group in one call).
    A call without a trajectory id leaves its choices to trajectory inference.
    """
    identity = pending.identity.model_dump()
    if choice == 0:
        return {"turn_id": pending.call_id, **identity}
    trajectory = identity["trajectory_id"]
    return {
        **identity,
        "turn_id": f"{pending.call_id}.{choice}",
        "trajectory_id": f"{trajectory}.{choice}" if trajectory is not None else None,
    }


def base_turn(
    pending: PendingCall, choice: int, buffered_stream: bool = False, **values: Any
) -> Turn:
    ended_at = utc_now()
    if buffered_stream:
        values["first_token_at"] = ended_at
    try:
        return _turn(pending, choice, ended_at, values)
    except ValidationError as error:
        raise UnusableAnswer(f"choice {choice}: {_problems(error)}") from error


def _turn(pending: PendingCall, choice: int, ended_at: datetime, values: dict[str, Any]) -> Turn:
    return Turn(
        **_choice_identity(pending, choice),
        call_type=pending.call_type,
        api=pending.api,
        api_request=pending.api_request,
        stream=pending.stream,
        started_at=pending.started_at,
        ended_at=ended_at,
        latency_ms=(ended_at - pending.started_at).total_seconds() * 1000,
        request_messages=pending.request_messages,
        request_tools=pending.request_tools,
        sampling_params=pending.sampling_params,
        metadata=pending.metadata,
        **values,
    )


def turns_from_response(
    pending: PendingCall,
    response: object,
    redactor: Redactor,
    writer_id: str,
    api_response: str | None = None,
) -> list[Turn]:
    """One turn per choice of a complete (non-streamed upstream) response.

    Chat responses carry ``prompt_token_ids`` once; text completions carry them per choice.
    A buffered stream reaches the agent all at once, right after its turn is spooled, so its
    first token arrives at ``ended_at``.
    """
    response_prompt_ids = field_of(response, "prompt_token_ids")
    usage = field_of(response, "usage")
    hidden = getattr(response, "_hidden_params", None)
    turns = []
    for index, choice in enumerate(require_choices(response)):
        provider_fields = field_of(choice, "provider_specific_fields") or {}
        response_ids = provider_fields.get("token_ids", field_of(choice, "token_ids"))
        prompt_ids = field_of(choice, "prompt_token_ids") or response_prompt_ids
        message = _dump(field_of(choice, "message")) or {}
        if not message and field_of(choice, "text") is not None:
            message = {"role": "assistant", "content": field_of(choice, "text")}
        message = {k: v for k, v in message.items() if v is not None}
        turns.append(
            base_turn(
                pending,
                index,
                model=str(field_of(response, "model") or pending.model),
                backend=_backend(hidden),
                status="success",
                finish_reason=field_of(choice, "finish_reason"),
                token_source=token_source(prompt_ids, response_ids),
                prompt_token_ids=prompt_ids,
                response_token_ids=response_ids,
                response_logprobs=logprob_values(field_of(choice, "logprobs")),
                response_message=scrubbed_json(message, redactor),
                response_text=redactor.text(message.get("content") or "") or None,
                prompt_tokens=field_of(usage, "prompt_tokens") if usage else None,
                completion_tokens=completion_tokens(response_ids, usage),
                writer_id=writer_id,
                api_response=api_response,
                buffered_stream=pending.stream,
            )
        )
    return turns


def native_turn(
    pending: PendingCall,
    answer: dict[str, Any],
    redactor: Redactor,
    writer_id: str,
    first_token_at: datetime | None = None,
) -> Turn:
    """The row of a Responses or Messages call LiteLLM served on that API's own route.

    Its answer carries no engine token IDs (vLLM's routes return none), so ``token_source`` is
    none; the normalized columns come from the bridge's translation of the answer to chat. The
    answer is kept as LiteLLM's route made it, naming the model as the agent asked for it (as
    LiteLLM's proxy does on the way out; it also hands a Responses id out encrypted).
    """
    message, finish_reason = pending.bridge.chat_view(answer)
    usage = answer.get("usage") or {}
    return base_turn(
        pending,
        0,
        model=str(answer.get("model") or pending.model),
        status="success",
        finish_reason=finish_reason,
        token_source="none",
        response_message=scrubbed_json(message, redactor),
        response_text=redactor.text(message["content"]) or None,
        prompt_tokens=usage.get("input_tokens"),
        completion_tokens=usage.get("output_tokens"),
        first_token_at=first_token_at,
        api_response=scrubbed_json({**answer, "model": pending.model}, redactor),
        writer_id=writer_id,
    )


def error_turn(
    pending: PendingCall, error: BaseException, redactor: Redactor, writer_id: str
) -> Turn:
    """The row for a call that failed: the error is data too (backends time out, reject, crash)."""
    message = f"{type(error).__name__}: {error}"
    return base_turn(
        pending,
        0,
        model=pending.model,
        status="error",
        error=redactor.text(message)[:4000],
        token_source="none",
        writer_id=writer_id,
    )
