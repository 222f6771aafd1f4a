"""Token-prefix relations between consecutive steps.

A step is prefix-consistent when its prompt starts with the previous step's prompt + response
exactly: then the two can be merged into one sequence with a loss mask, and the shared part is
what a prefix tree saves. When it is not, the first diverging token tells why (heuristic,
checked in this order):

- ``missing_tokens``: this prompt or the previous sequence has no token IDs.
- ``retokenized``: this or the previous step's tokens were not produced by the engine
  (``token_source != engine``), or the divergence lies part-way inside the previous response:
  the same text came back with different token boundaries.
- ``template_change``: the divergence is at the previous response's first token: the chat
  template rendered the previous action differently (e.g. reasoning stripped from history).
- ``tail_edit``: the prompt is the previous prompt without a trailing span (at most
  ``MAX_TAIL_TOKENS``, right before the generation prompt), then the previous response: the
  agent replaced its last message(s), e.g. OpenClaw's internal-context message, which every
  request carries at its end and which moves after the new messages on the next call.
- ``context_edit``: the divergence lies inside the previous prompt, or the prompt is a
  truncation of the previous sequence: earlier messages were edited, dropped or truncated.

``shared_prefix_tokens`` is the length of the prefix a step shares with the previous step's
prompt + response (all of it when consistent): what a prefix tree of the two saves.
"""

from __future__ import annotations

import polars as pl

PREV_PROMPT = "_prev_prompt"
PREV_RESPONSE = "_prev_response"
PREV_SOURCE = "_prev_token_source"

MAX_TAIL_TOKENS = 512
"""The longest trailing span of the previous prompt a ``tail_edit`` may drop."""
HEADER_TOKENS = 16
"""The most tokens of the generation prompt that may follow the shared prefix in a
``tail_edit`` before the previous response (the rest of the assistant header after the role)."""


def full_sequence(prompt: str | pl.Expr, response: str | pl.Expr) -> pl.Expr:
    """prompt + response token IDs (a missing response counts as empty)."""
    prompt = pl.col(prompt) if isinstance(prompt, str) else prompt
    response = pl.col(response) if isinstance(response, str) else response
    return pl.concat_list([prompt, response.fill_null(pl.lit([], dtype=pl.List(pl.Int32)))])


def extends(prompt: pl.Expr, sequence: pl.Expr) -> pl.Expr:
    """``prompt`` starts with all of ``sequence``."""
    length = sequence.list.len()
    return (prompt.list.len() >= length) & (prompt.list.head(length) == sequence)


def shared_prefix_len(frame: pl.DataFrame, left: str, right: str) -> pl.Series:
    """Per row, the number of leading tokens ``left`` and ``right`` have in common.

    Vectorised by exploding both lists (cut to the shorter length) and counting the leading run
    of equal tokens per row; call it on the rows that need it (the broken steps).
    """
    if frame.height == 0:
        return pl.Series("shared", [], dtype=pl.Int64)
    both = frame.select(
        pl.int_range(pl.len()).alias("_row"),
        pl.when(pl.col(left).is_null() | pl.col(right).is_null())
        .then(0)
        .otherwise(pl.min_horizontal(pl.col(left).list.len(), pl.col(right).list.len()))
        .alias("_n"),
        pl.col(left),
        pl.col(right),
    )
    runs = (
        both.filter(pl.col("_n") > 0)
        .with_columns(pl.col(left).list.head(pl.col("_n")), pl.col(right).list.head(pl.col("_n")))
        .explode([left, right], empty_as_null=False)
        .group_by("_row", maintain_order=True)
        .agg(((pl.col(left) != pl.col(right)).fill_null(True).cum_sum() == 0).sum().alias("s"))
    )
    shared = both.select("_row").join(runs, on="_row", how="left").sort("_row")
    return shared["s"].fill_null(0).cast(pl.Int64).alias("shared")


def tail_edit(
    prompt: pl.Expr, prev_prompt: pl.Expr, prev_response: pl.Expr, shared: pl.Expr
) -> pl.Expr:
    """``prompt`` = ``prev_prompt[:shared]`` + its last ``k`` tokens (the generation prompt)
    + ``prev_response`` + anything, for some ``k`` <= ``HEADER_TOKENS``, dropping 1 to
    ``MAX_TAIL_TOKENS`` tokens of ``prev_prompt`` before its last ``k``.

    ``shared``: the tokens ``prompt`` shares with ``prev_prompt`` + ``prev_response``. A
    template puts the same header before a response as at the end of a prompt, so the history
    was kept and only the trailing message(s) moved or changed.
    """
    prompt_len = prev_prompt.list.len().cast(pl.Int64)
    response_len = prev_response.list.len().cast(pl.Int64)
    placements = []
    for k in range(HEADER_TOKENS + 1):
        dropped = prompt_len - k - shared
        placements.append(
            dropped.is_between(1, MAX_TAIL_TOKENS)
            & (prompt.list.slice(shared, k) == prev_prompt.list.slice(prompt_len - k, k))
            & (prompt.list.slice(shared + k, response_len) == prev_response)
        )
    return ((response_len > 0) & pl.any_horizontal(placements)).fill_null(False)


def check_prefixes(frame: pl.DataFrame) -> pl.DataFrame:
    """Add ``prefix_consistent``, ``prefix_break_reason`` and ``shared_prefix_tokens``.

    ``frame`` holds each step with its predecessor's ``_prev_prompt``, ``_prev_response`` and
    ``_prev_token_source`` (all null for a first step, which is consistent by definition).
    """
    if frame.get_column(PREV_PROMPT).null_count() == frame.height:  # first steps only
        return frame.with_columns(
            pl.lit(True).alias("prefix_consistent"),
            pl.lit(None, pl.String).alias("prefix_break_reason"),
            pl.lit(0, pl.Int32).alias("shared_prefix_tokens"),
        )
    prev_full = full_sequence(PREV_PROMPT, PREV_RESPONSE)
    frame = frame.with_columns(
        prev_full.alias("_prev_full"),
        pl.col(PREV_PROMPT).is_null().alias("_first"),
    ).with_columns(
        (pl.col("_first") | extends(pl.col("prompt_token_ids"), pl.col("_prev_full")))
        .fill_null(False)
        .alias("prefix_consistent")
    )
    broken = frame.filter(~pl.col("prefix_consistent"))
    shared = (
        broken.with_columns(
            shared_prefix_len(broken, "prompt_token_ids", "_prev_full").alias("_shared")
        )
        .with_columns(
            tail_edit(
                pl.col("prompt_token_ids"),
                pl.col(PREV_PROMPT),
                pl.col(PREV_RESPONSE),
                pl.col("_shared"),
            ).alias("_tail")
        )
        .select("turn_id", "_shared", "_tail")
    )
    # joined on the ids alone, so the token lists stay in place
    joined = frame.select("turn_id").join(shared, on="turn_id", how="left", maintain_order="left")
    frame = frame.with_columns(joined.get_column("_shared"), joined.get_column("_tail"))
    prev_prompt_len = pl.col(PREV_PROMPT).list.len()
    reason = (
        pl.when(pl.col("prefix_consistent"))
        .then(None)
        .when(
            pl.col("prompt_token_ids").is_null()
            | (pl.col("_prev_full").list.len() == 0)
            | pl.col(PREV_PROMPT).is_null()
        )
        .then(pl.lit("missing_tokens"))
        .when((pl.col("token_source") != "engine") | (pl.col(PREV_SOURCE) != "engine"))
        .then(pl.lit("retokenized"))
        .when(pl.col("_tail"))
        .then(pl.lit("tail_edit"))
        .when(
            (pl.col("_shared") < prev_prompt_len)
            | (pl.col("_shared") >= pl.col("prompt_token_ids").list.len())
        )
        .then(pl.lit("context_edit"))
        .when(pl.col("_shared") == prev_prompt_len)
        .then(pl.lit("template_change"))
        .otherwise(pl.lit("retokenized"))
    )
    shared_tokens = (
        pl.when(pl.col("_first"))
        .then(0)
        .when(pl.col("prefix_consistent"))
        .then(pl.col("_prev_full").list.len())
        .otherwise(pl.col("_shared").fill_null(0))
    )
    return frame.with_columns(
        reason.alias("prefix_break_reason"),
        shared_tokens.cast(pl.Int32).alias("shared_prefix_tokens"),
    ).drop("_prev_full", "_first", "_shared", "_tail")
