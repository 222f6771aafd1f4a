"""Trajectory sequences: a trajectory's prefix-consistent steps trained as one sequence.

An agent's call t sees call t-1's prompt + reply + the tool output, so a run of steps whose
prompts extend their predecessors' (a *segment*) is one token sequence: the first prompt, then
reply, observation, reply, ..., last reply. A step that does not extend its predecessor
(``prefix_break_reason``: context_edit, tail_edit, template_change, retokenized, ...) starts a
new segment of the same trajectory. Because each prompt in a segment is the previous prompt +
reply + observation, the segment's tokens are its LAST step's prompt + reply, and step i's reply
sits at ``[prompt_len_i, prompt_len_i + response_len_i)``: only one full prompt per segment is
read, never one per step, so memory follows the trajectory rather than calls x context.
"""

from __future__ import annotations

import polars as pl

from claw_pipelines.derived_schemas import BATCH_ROWS, SEQUENCE_ROWS, fit, with_turn_columns

SEGMENT = ["trajectory_id", "segment_index"]

REPLY_COLUMNS = ["response_token_ids", "response_logprobs"]
"""What every step of a segment contributes: its reply and the reply's logprobs."""

LAST_STEP_COLUMNS = ["prompt_token_ids", "request_messages", "request_tools", "response_message"]
"""What only a segment's last step contributes: the full prompt (and conversation) so far
and its reply message."""

FIRST_STEP_COLUMNS = ["request_messages"]
"""What a segment's first step contributes besides its reply: the state it starts from."""


def is_sequence(rows: pl.DataFrame) -> bool:
    """Batch rows in the ``sequence`` layout (``SEQUENCE_ROWS``), not one per step."""
    return "response_mask" in rows.columns


def segment_index() -> pl.Expr:
    """Per step, its segment within its trajectory (0, 1, ...): a step starts a new one when it
    is its trajectory's first, is not prefix-consistent, or its prompt is shorter than its
    predecessor's prompt + reply (a flag that contradicts the lengths is not trusted)."""
    previous_end = (pl.col("prompt_len") + pl.col("response_len")).shift(1)
    starts = (
        pl.col("step_index").shift(1).is_null()
        | ~pl.col("prefix_consistent").fill_null(False)
        | (pl.col("prompt_len") < previous_end).fill_null(False)
    )
    index = starts.cast(pl.Int32).cum_sum() - 1
    return index.over("trajectory_id", order_by="step_index").cast(pl.Int32).alias("segment_index")


def sequence_lengths() -> list[pl.Expr]:
    """Per step (with ``segment_index``), its segment's length in the sequence layout:
    ``sequence_prompt_len`` (the first prompt) and ``sequence_response_len`` (everything after
    it: replies and observations), from the steps' lengths alone."""
    first_prompt = pl.col("prompt_len").sort_by("step_index").first()
    end = (pl.col("prompt_len") + pl.col("response_len")).sort_by("step_index").last()
    return [
        first_prompt.over(SEGMENT).alias("sequence_prompt_len"),
        (end - first_prompt).over(SEGMENT).alias("sequence_response_len"),
    ]


def sequences(steps: pl.DataFrame, *, prompts_are_suffixes: bool = False) -> pl.DataFrame:
    """``SEQUENCE_ROWS``, one per segment of ``steps`` (batch rows with ``segment_index``,
    ``REPLY_COLUMNS`` and ``LAST_STEP_COLUMNS``), trajectories in the order they come.

    ``prompt_token_ids`` is read on each segment's last step only (others may be null); with
    ``prompts_are_suffixes`` it is instead, on every step, the tokens new since the previous
    step's prompt + reply (the whole prompt on a segment's first step), and the sequence is
    their concatenation with the replies. A reply whose logprobs are missing or not aligned
    leaves its segment's ``response_logprobs`` null. Raises when a sequence's length disagrees
    with its steps' lengths: a prompt read back inexactly would misplace every mask."""
    ordered = (
        fit(steps, BATCH_ROWS)
        .with_row_index("_row")
        .sort(pl.col("_row").min().over("trajectory_id"), "step_index", maintain_order=True)
    )
    first_prompt = pl.col("prompt_len").first().over(SEGMENT)
    observation = pl.col("prompt_len").shift(-1) - pl.col("prompt_len") - pl.col("response_len")
    observation = observation.over(SEGMENT).fill_null(0)
    aligned = pl.col("response_logprobs").list.len() == pl.col("response_len")
    pieces = ordered.with_columns(
        (pl.col("prompt_len") - first_prompt).cast(pl.Int32).alias("_start"),
        pl.concat_list(
            pl.lit(1, pl.Int8).repeat_by(pl.col("response_len")),
            pl.lit(0, pl.Int8).repeat_by(observation),
        ).alias("_mask"),
        pl.concat_list(
            pl.col("response_logprobs"), pl.lit(0.0, pl.Float32).repeat_by(observation)
        ).alias("_logprobs"),
        aligned.fill_null(False).alias("_aligned"),
    )
    if prompts_are_suffixes:
        tokens = pl.concat_list("prompt_token_ids", "response_token_ids").explode(
            empty_as_null=False, keep_nulls=False
        )
    else:
        tokens = pl.concat_list(
            pl.col("prompt_token_ids").last(), pl.col("response_token_ids").last()
        )
    flat = {"empty_as_null": False, "keep_nulls": False}
    span = pl.struct(
        pl.col("step_index").cast(pl.Int32),
        "turn_id",
        pl.col("_start").alias("start"),
        (pl.col("_start") + pl.col("response_len")).cast(pl.Int32).alias("end"),
        "reward",
    )
    rows = pieces.group_by(SEGMENT, maintain_order=True).agg(
        pl.col("batch_id", "recipe", "group_id").first(),
        pl.col("prefix_break_reason").first().alias("break_reason"),
        pl.col("step_index").first().alias("first_step_index"),
        pl.col("step_index").last().alias("last_step_index"),
        pl.len().alias("segment_steps"),
        pl.col("num_steps", "group_size", "outcome_reward", "trajectory_score").first(),
        pl.col("advantage", "source_versions", "started_at").first(),
        pl.col("is_last").any(),
        pl.col("turn_id").alias("turn_ids"),
        pl.col("turn_id", "reward", "model", "finish_reason", "metadata").last(),
        pl.col("request_messages").first().alias("prompt_messages"),
        pl.col("request_messages", "request_tools", "response_message").last(),
        pl.col("policy_version").min(),
        pl.col("source_version").max(),
        pl.col("prompt_len").first().alias("_first_prompt"),
        tokens.alias("_tokens"),
        pl.col("_mask").explode(**flat).alias("response_mask"),
        pl.when(pl.col("_aligned").all())
        .then(pl.col("_logprobs").explode(**flat))
        .alias("response_logprobs"),
        span.alias("spans"),
    )
    rows = rows.with_columns(
        pl.col("_tokens").list.head(pl.col("_first_prompt")).alias("prompt_token_ids"),
        pl.col("_tokens").list.slice(pl.col("_first_prompt")).alias("response_token_ids"),
        pl.len().over("trajectory_id").alias("num_segments"),
    ).drop("_tokens")
    _check_lengths(rows)
    return fit(rows, SEQUENCE_ROWS)


def _check_lengths(rows: pl.DataFrame) -> None:
    wrong = rows.filter(
        (pl.col("prompt_token_ids").list.len() != pl.col("_first_prompt"))
        | (pl.col("response_token_ids").list.len() != pl.col("response_mask").list.len())
    )
    if wrong.height:
        first = wrong.row(0, named=True)
        raise ValueError(
            f"trajectory {first['trajectory_id']} segment {first['segment_index']}: its tokens "
            "do not match its steps' prompt and response lengths (a prompt read back inexactly)"
        )


def sequence_rows(steps: pl.DataFrame, turns: pl.LazyFrame | pl.DataFrame | None) -> pl.DataFrame:
    """``SEQUENCE_ROWS`` of a batch's step rows (``STORED_BATCH_ROWS``, in export order): every
    step's reply and logprobs, and only each segment's last prompt, are read from ``turns``
    through ``with_turn_columns`` (which returns exact full prompts however ``turns`` stores
    them)."""
    if "segment_index" not in steps.columns or steps.get_column("segment_index").has_nulls():
        steps = steps.with_columns(segment_index())
    replies = with_turn_columns(steps, turns, REPLY_COLUMNS)
    step = pl.col("step_index")
    ends = _read(steps.filter(step == step.max().over(SEGMENT)), turns, LAST_STEP_COLUMNS)
    starts = _read(
        steps.filter((step == step.min().over(SEGMENT)) & (step != step.max().over(SEGMENT))),
        turns,
        FIRST_STEP_COLUMNS,
    )
    joined = replies.drop(LAST_STEP_COLUMNS, strict=False).join(
        pl.concat([ends, starts], how="diagonal"), on="turn_id", how="left", maintain_order="left"
    )
    return sequences(joined)


def _read(
    steps: pl.DataFrame, turns: pl.LazyFrame | pl.DataFrame | None, columns: list[str]
) -> pl.DataFrame:
    """``columns`` of the turns of ``steps`` by turn_id."""
    return with_turn_columns(steps.select("turn_id", "started_at"), turns, columns).drop(
        "started_at"
    )
