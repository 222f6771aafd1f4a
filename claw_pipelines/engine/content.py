"""Message content as vLLM's chat renderer reads it (``renderers/chat_utils/chat_message.py``).

A message's ``content`` is a string or a list of parts. Parts are plain strings or dicts typed
``text`` / ``input_text`` / ``output_text`` (their ``text``), ``refusal`` (``refusal``) or
``thinking`` (``thinking``); a part without its text is skipped, and the texts are joined with
newlines. That covers what LiteLLM's Responses and Anthropic bridges send (``input_text`` parts,
``cache_control`` keys, tool results as lists of text parts). The simulated model reads text only,
so an image, audio, video or file part is refused with a 400 that says so.

vLLM also drops Claude Code's ``x-anthropic-billing-header`` line from system text: its ``cch``
value changes on every request, and keeping it would make no two prompts share a prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

TEXT_FIELDS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
BILLING_HEADER = "x-anthropic-billing-header"

Part = str | dict[str, Any]


def check_parts(parts: Sequence[Part]) -> None:
    """Refuse the parts a text-only model cannot read, naming their type."""
    for part in parts:
        if isinstance(part, str):
            continue
        kind = part.get("type")
        if kind not in TEXT_FIELDS:
            named = f"type {kind!r}" if isinstance(kind, str) else f"keys {sorted(part)}"
            raise ValueError(
                f"content part with {named} is not supported: the simulated model reads text "
                f"only (part types {', '.join(TEXT_FIELDS)})"
            )


def _part_text(part: Part) -> str | None:
    if isinstance(part, str):
        return part
    text = part.get(TEXT_FIELDS[part["type"]])
    return text if isinstance(text, str) else None


def _without_billing_header(parts: Sequence[Part]) -> list[Part]:
    """Drops the header line from plain strings and ``text`` parts (the only ones vLLM checks)."""
    kept: list[Part] = []
    for part in parts:
        plain = isinstance(part, str) or part["type"] == "text"
        text = _part_text(part) if plain else None
        if text is None or not text.startswith(BILLING_HEADER):
            kept.append(part)
        elif rest := text.partition("\n")[2]:
            kept.append(rest)
    return kept


def content_text(content: str | Sequence[Part] | None, role: str) -> str:
    """The text a chat template sees for one message's ``content``."""
    if content is None:
        return ""
    parts: Sequence[Part] = [content] if isinstance(content, str) else content
    if role == "system":
        parts = _without_billing_header(parts)
    return "\n".join(text for part in parts if (text := _part_text(part)) is not None)
