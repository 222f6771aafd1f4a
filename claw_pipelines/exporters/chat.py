"""OpenAI chat messages (JSON text columns) as TRL-ready list<struct> columns.

Message content may be text, null or a list of parts; parts are joined into text so every row
has one shape. This parses JSON per row in Python, which is fine at batch size (hundreds to a
few thousand rows) and keeps the tool-call fields TRL chat templates read.
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl

MESSAGE = pl.Struct(
    {
        "role": pl.String,
        "content": pl.String,
        "tool_calls": pl.List(
            pl.Struct(
                {
                    "id": pl.String,
                    "type": pl.String,
                    "function": pl.Struct({"name": pl.String, "arguments": pl.String}),
                }
            )
        ),
        "tool_call_id": pl.String,
    }
)
MESSAGES = pl.List(MESSAGE)


def _text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def _message(raw: dict[str, Any]) -> dict[str, Any]:
    calls = raw.get("tool_calls") or None
    return {
        "role": raw.get("role"),
        "content": _text(raw.get("content")),
        "tool_calls": calls
        and [
            {
                "id": call.get("id"),
                "type": call.get("type", "function"),
                "function": {
                    "name": (call.get("function") or {}).get("name"),
                    "arguments": (call.get("function") or {}).get("arguments"),
                },
            }
            for call in calls
        ],
        "tool_call_id": raw.get("tool_call_id"),
    }


def _conversation(text: str | None) -> list[dict[str, Any]]:
    return [_message(m) for m in json.loads(text)] if text else []


def _reply(text: str | None) -> list[dict[str, Any]]:
    return [_message(json.loads(text))] if text else []


def messages(column: str) -> pl.Expr:
    """A JSON list of messages (``request_messages``) as list<MESSAGE>."""
    return pl.col(column).map_elements(_conversation, return_dtype=MESSAGES)


def reply(column: str) -> pl.Expr:
    """One JSON assistant message (``response_message``) as a one-element list<MESSAGE>."""
    return pl.col(column).map_elements(_reply, return_dtype=MESSAGES)
