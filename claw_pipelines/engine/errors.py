"""The engine's client errors, worded as vLLM's OpenAI server words them.

vLLM raises ``VLLMValidationError(message, parameter=..., value=...)`` for a request it refuses
and answers HTTP 400 ``{"error": {"message": str(exc), "type": "BadRequestError", "param": ...}}``,
where ``str(exc)`` appends ``(parameter=..., value=...)`` to the message. Agents and SDKs match on
that text (Claude Code and LiteLLM read the context-length ones), so it is copied exactly.
"""

from __future__ import annotations


class BadRequest(Exception):
    """A client error, answered with HTTP 400 in vLLM's error shape.

    Not a ``ValueError``, so raised inside a pydantic validator it reaches the server unchanged.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def validation_error(message: str, parameter: str, value: object = None) -> BadRequest:
    """vLLM's ``VLLMValidationError`` as its server reports it."""
    extras = [f"parameter={parameter}"] + ([] if value is None else [f"value={value}"])
    return BadRequest(f"{message} ({', '.join(extras)})", parameter)
