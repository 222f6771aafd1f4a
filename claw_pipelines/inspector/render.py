"""Turning stored step rows into what the page shows: chat messages, tool calls, decoded tokens.

Token text comes from the tokenizer of the model that produced the IDs (``detokenize``: the
embedded engine's own for its turns, the backend's ``/detokenize`` for a real model); a step is
decoded only when every one of its IDs got a text, otherwise the page shows the raw IDs.
"""

from __future__ import annotations

import json
import math
from typing import Any
from urllib.parse import quote

import polars as pl
from markupsafe import Markup, escape

from claw_pipelines.inspector.api_models import Tokens
from claw_pipelines.inspector.detokenize import token_texts

_TEXTS = pl.Schema({"id": pl.Int32, "text": pl.String})


def _texts_by_model(steps: pl.DataFrame, tokens: pl.DataFrame) -> pl.DataFrame:
    """(turn_id, id, text): each step's token texts in its own model's vocabulary."""
    identity = [c for c in ("model", "backend") if c in steps.columns]
    if not identity:
        return pl.DataFrame(schema={"turn_id": pl.String, **_TEXTS})
    owners = steps.select("turn_id", *identity)
    found = []
    for key, part in tokens.join(owners, on="turn_id").group_by(identity):
        model, backend = (*key, None)[:2]
        texts = token_texts(model, backend, part.get_column("id").unique().to_list())
        if texts is not None:
            found.append(part.select("turn_id", "id").unique().join(texts, on="id"))
    return pl.concat(found) if found else pl.DataFrame(schema={"turn_id": pl.String, **_TEXTS})


def token_frame(steps: pl.DataFrame, ids: str, logprobs: str | None) -> pl.DataFrame:
    """One row per token of each step (turn_id, pos, id, logprob, text, prob).

    Logprobs are matched by position; a misaligned or missing list leaves them null.
    """
    lp = pl.col(logprobs) if logprobs else pl.lit(None, dtype=pl.List(pl.Float32))
    tokens = (
        steps.select(
            "turn_id",
            pl.col(ids).alias("id"),
            pl.int_ranges(pl.col(ids).list.len()).alias("pos"),
            lp.alias("_lp"),
        )
        .explode("id", "pos", empty_as_null=True)
        .drop_nulls("id")
        .with_columns(pl.col("_lp").list.get(pl.col("pos"), null_on_oob=True).alias("logprob"))
        .drop("_lp")
    )
    return (
        tokens.join(_texts_by_model(steps, tokens), on=["turn_id", "id"], how="left")
        .with_columns(pl.col("logprob").exp().alias("prob"))
        .sort("turn_id", "pos")
    )


def tokens_by_step(steps: pl.DataFrame, ids: str, logprobs: str | None) -> dict[str, dict]:
    """Per turn: its tokens column by column (``Tokens``' fields) if every one decoded."""
    tokens = token_frame(steps, ids, logprobs)
    grouped = (
        tokens.group_by("turn_id", maintain_order=True)
        .agg(
            pl.col("id").alias("ids"),
            pl.col("text").alias("texts"),
            pl.col("logprob").alias("logprobs"),
            pl.col("prob").alias("probs"),
            pl.col("text").is_not_null().all().alias("decoded"),
        )
        .filter("decoded")
    )
    return {row.pop("turn_id"): row for row in grouped.drop("decoded").to_dicts()}


def texts_by_step(steps: pl.DataFrame, ids: str) -> dict[str, str]:
    """Per turn: its ``ids`` decoded into one text, for the turns whose every token decoded."""
    texts = (
        token_frame(steps, ids, None)
        .group_by("turn_id", maintain_order=True)
        .agg(pl.col("text").str.join(""), pl.col("text").is_not_null().all().alias("decoded"))
        .filter("decoded")
    )
    return dict(zip(texts["turn_id"], texts["text"], strict=True))


def token_colour(prob: float | None) -> str:
    """Background for a token: red (unlikely) through yellow to green (certain)."""
    if prob is None or math.isnan(prob):
        return "transparent"
    return f"hsl({round(120 * max(0.0, min(1.0, prob)))}, 75%, 82%)"


def token_spans(tokens: Tokens) -> Markup:
    """A step's tokens as spans coloured by probability, each text escaped. Built here in one
    pass: the template's loop over a 100-call session's 15k tokens took three times as long."""
    return Markup(
        "".join(
            f'<span class="tok" style="background: {token_colour(prob)}" '
            f'title="id {id_} · logprob {_logprob(logprob)}">{escape(text)}</span>'
            for id_, text, logprob, prob in zip(
                tokens.ids, tokens.texts, tokens.logprobs, tokens.probs, strict=True
            )
        )
    )


def _logprob(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


LONG_TEXT_CHARS = 2000
LONG_TEXT_LINES = 30


def is_long_text(text: str | None) -> bool:
    """Whether a message body is clamped on the page (with "show all"): one huge message would
    otherwise make a trajectory tens of thousands of pixels tall."""
    return bool(text) and (len(text) > LONG_TEXT_CHARS or text.count("\n") > LONG_TEXT_LINES)


def url_segment(value: str) -> str:
    """``value`` escaped as one URL path segment, "/" included: trajectory and group ids may
    contain "/" (they come from headers or the %2F-encoded base-URL prefix)."""
    return quote(value, safe="")


def parse_json(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def content_text(content: Any) -> str:
    """A message's content as text (OpenAI content may be a list of typed parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part.get("text", json.dumps(part)) if isinstance(part, dict) else str(part)
            for part in content
        )
    return json.dumps(content)


def messages(request_messages: str | None) -> list[dict]:
    parsed = parse_json(request_messages)
    if not isinstance(parsed, list):
        return []
    return [message(m) for m in parsed if isinstance(m, dict)]


def message(raw: dict) -> dict:
    """One chat message as the page shows it (text content, parsed tool calls)."""
    return {
        "role": raw.get("role", "?"),
        "content": content_text(raw.get("content")),
        "tool_calls": tool_calls(raw.get("tool_calls")),
        "tool_call_id": raw.get("tool_call_id"),
        "name": raw.get("name"),
    }


def tool_calls(calls: Any) -> list[dict]:
    if not isinstance(calls, list):
        return []
    out = []
    for call in calls:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        arguments = function.get("arguments")
        parsed = parse_json(arguments) if isinstance(arguments, str) else arguments
        out.append(
            {
                "id": call.get("id") if isinstance(call, dict) else None,
                "name": function.get("name", "?"),
                "arguments": json.dumps(parsed, indent=1)
                if not isinstance(parsed, str)
                else parsed,
            }
        )
    return out
