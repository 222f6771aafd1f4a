"""What capture asks the engine for beside the answer, and what the agent gets of it.

Capture asks the engine for the token IDs and logprobs on every call (``ask_for_capture``), so
its row is exact. An agent that did not ask for them gets the answer the plain proxy would give
it: at a 50k-token prompt the IDs are ~180 KB of JSON a call that the agent never reads, and
LiteLLM's serializer turns each ID over one at a time (~45 ms of the proxy's CPU a call). They
are taken out once the row is spooled (``withhold_unasked``), from whole answers and from each
streamed chunk alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from claw_pipelines.capture.runtime import ModelCapture


@dataclass(frozen=True)
class AskedFields:
    """Which of the engine's extra fields the agent's own request asked for."""

    token_ids: bool = True
    logprobs: bool = True

    @classmethod
    def of(cls, request: dict[str, Any]) -> AskedFields:
        """As the agent sent ``request``, before capture added its own asks (a text
        completion's ``logprobs: 0`` asks for the chosen tokens' logprobs)."""
        return cls(
            token_ids=bool(request.get("return_token_ids")),
            logprobs=not _unset(request.get("logprobs")),
        )


EVERYTHING = AskedFields()
"""Withhold nothing: a call whose answer capture did not ask anything more of."""


def _unset(logprobs: object) -> bool:
    """Whether ``logprobs`` asks for none: absent or ``false`` (``0`` is a text completion's
    ask for the chosen tokens' logprobs, though ``0 == False``)."""
    return logprobs is None or logprobs is False


def ask_for_capture(request: dict[str, Any], options: ModelCapture) -> None:
    """Add to ``request`` (in place) what the row needs of the engine, as the model's capture
    ``options`` say; logprobs the agent asked for itself are left as it asked for them."""
    if options.return_token_ids:
        request["return_token_ids"] = True
    if options.logprobs and _unset(request.get("logprobs")):
        request["logprobs"] = True
        if options.top_logprobs is not None:
            request["top_logprobs"] = options.top_logprobs


def withhold_unasked(answer: object, asked: AskedFields) -> None:
    """Take out of ``answer`` (a whole answer or a stream chunk, a LiteLLM object or a dict;
    changed in place) the token IDs and logprobs the agent did not ask for."""
    if asked == EVERYTHING:
        return
    if not asked.token_ids:
        _drop(answer, "prompt_token_ids")
    for choice in _field(answer, "choices") or []:
        if not asked.token_ids:
            _drop(choice, "prompt_token_ids")
            _drop(choice, "token_ids")
            provider_fields = _field(choice, "provider_specific_fields")
            if isinstance(provider_fields, dict) and "token_ids" in provider_fields:
                provider_fields["token_ids"] = None  # as LiteLLM has it when the engine sent none
        if not asked.logprobs and _field(choice, "logprobs") is not None:
            if isinstance(choice, dict):
                choice["logprobs"] = None
            else:
                choice.logprobs = None


def _field(holder: object, name: str) -> Any:
    return holder.get(name) if isinstance(holder, dict) else getattr(holder, name, None)


def _drop(holder: object, name: str) -> None:
    """Remove key ``name`` from a dict, or from a pydantic object's extra fields (where LiteLLM
    keeps what the engine adds to OpenAI's shape)."""
    if isinstance(holder, dict):
        holder.pop(name, None)
        return
    extra = getattr(holder, "__pydantic_extra__", None)
    if extra:
        extra.pop(name, None)
